//! Declares the `kernels_module` cfg with the names of ptx-builder's modules, so a `cfg` gate
//! that names a module that does not exist is a warning (an error in CI).

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rustc-check-cfg={}", ptx_builder::module_check_cfg());
}
