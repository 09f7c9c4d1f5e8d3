//! Builds the kernels to PTX (so `cargo test` and `cargo run` never embed a stale module) and
//! decides where binaries find the CUDA driver library at run time.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let manifest_dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let workspace = manifest_dir
        .parent()
        .expect("host/ sits in the workspace")
        .to_path_buf();
    let cargo = PathBuf::from(env::var_os("CARGO").expect("set by cargo"));
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("set by cargo"));

    ptx_builder::build_all_ptx(&cargo, &workspace, &out_dir).unwrap_or_else(|e| panic!("{e}"));
    println!(
        "cargo:rerun-if-changed={}",
        workspace.join("kernels-gpu").display()
    );

    load_fetched_driver_only_without_a_real_one(&workspace);
    embed_git_commit(&workspace);
}

/// `SOFTMAX_GIT_COMMIT`: the commit benchmark results are stamped with ("unknown" outside git).
fn embed_git_commit(workspace: &Path) {
    let commit = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(workspace)
        .output()
        .ok()
        .filter(|out| out.status.success())
        .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_owned())
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=SOFTMAX_GIT_COMMIT={commit}");
    for watched in [".git/HEAD", ".git/refs/heads"] {
        println!(
            "cargo:rerun-if-changed={}",
            workspace.join(watched).display()
        );
    }
}

/// `cargo xtask fetch-driver` unpacks a driver library under `target/cuda-driver` so that
/// machines without CUDA can link (cust's build script finds it through `CUDA_LIBRARY_PATH`,
/// set in `.cargo/config.toml`). Binaries also load it at run time, where it reports "no
/// device", but only when the machine has no driver of its own: a real driver is never
/// shadowed.
fn load_fetched_driver_only_without_a_real_one(workspace: &Path) {
    println!("cargo:rerun-if-env-changed=LD_LIBRARY_PATH");
    let fetched = workspace.join("target").join("cuda-driver").join("lib64");
    if fetched.join("libcuda.so.1").is_file() && !real_driver_installed(&fetched) {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", fetched.display());
    }
}

/// Whether the dynamic loader finds a `libcuda.so.1` other than the fetched one.
fn real_driver_installed(fetched: &Path) -> bool {
    let in_loader_cache = ["ldconfig", "/sbin/ldconfig", "/usr/sbin/ldconfig"]
        .iter()
        .find_map(|ldconfig| Command::new(ldconfig).arg("-p").output().ok())
        .map(|out| {
            String::from_utf8_lossy(&out.stdout).lines().any(|line| {
                line.contains("libcuda.so.1") && !line.contains(&*fetched.to_string_lossy())
            })
        })
        .unwrap_or(false);
    let library_path = env::var("LD_LIBRARY_PATH").unwrap_or_default();
    let well_known = [
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib64",
        "/usr/local/nvidia/lib64",
        "/usr/lib/wsl/lib",
    ];
    in_loader_cache
        || library_path
            .split(':')
            .chain(well_known)
            .filter(|dir| !dir.is_empty() && Path::new(dir) != fetched)
            .any(|dir| Path::new(dir).join("libcuda.so.1").is_file())
}
