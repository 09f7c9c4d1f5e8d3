//! Builds `kernels-gpu` to PTX: the one build step that `host/build.rs` (which embeds the
//! result) and `cargo xtask build-ptx` (which prints it) share, so the flags exist once.
//! Like Rust-CUDA's `cuda_builder`, a build script makes one call:
//!
//! ```no_run
//! # let (cargo, workspace, out_dir) = (std::path::Path::new("cargo"), std::path::Path::new("."), std::path::Path::new("out"));
//! ptx_builder::build_all_ptx(cargo, workspace, out_dir).unwrap();
//! ```

use std::path::{Path, PathBuf};
use std::process::Command;

/// The GPU architecture the PTX targets (`.target sm_90`: Hopper).
pub const GPU_ARCH: &str = "sm_90";

/// Where the nested build puts its artifacts, apart from the host build's own target dir so
/// the two never wait on each other's lock.
fn ptx_target_dir(workspace: &Path) -> PathBuf {
    workspace.join("target").join("ptx")
}

/// The PTX modules: each is `kernels-gpu` built with the feature of that name. `softmax` holds
/// the f32 softmax variants, `ops-<type>` the operation kernels for one input type; the host
/// loads a module the first time it needs one of its kernels.
pub const PTX_MODULES: [&str; 4] = ["softmax", "ops-f32", "ops-bf16", "ops-f16"];

/// Builds every module of [`PTX_MODULES`] into `dest_dir/<module>.ptx`.
pub fn build_all_ptx(cargo: &Path, workspace: &Path, dest_dir: &Path) -> Result<(), String> {
    std::fs::create_dir_all(dest_dir)
        .map_err(|e| format!("creating {}: {e}", dest_dir.display()))?;
    for module in PTX_MODULES {
        let built = build_kernels_ptx(cargo, workspace, module)?;
        let dest = dest_dir.join(format!("{module}.ptx"));
        std::fs::copy(&built, &dest).map_err(|e| format!("copying {}: {e}", built.display()))?;
    }
    Ok(())
}

/// Runs `cargo rustc -p kernels-gpu --features <feature>` for `nvptx64-nvidia-cuda` with
/// `cargo` and returns the path of the PTX it wrote. Each module has a target dir of its own:
/// builds running at once (a `cargo build` beside a `cargo xtask`) then never overwrite each
/// other's `kernels_gpu.ptx` between a build and its copy.
fn build_kernels_ptx(cargo: &Path, workspace: &Path, feature: &str) -> Result<PathBuf, String> {
    let target_dir = ptx_target_dir(workspace).join(feature);
    // Unrolling must be allowed to finish the constant-trip loops of the widest register
    // kernels, or their row arrays go to local memory.
    let rustflags = [
        format!("-Ctarget-cpu={GPU_ARCH}"),
        "-Cllvm-args=-unroll-threshold=2000".to_owned(),
    ]
    .join("\x1f");
    let status = Command::new(cargo)
        .current_dir(workspace)
        .args([
            "rustc",
            "--package",
            "kernels-gpu",
            "--release",
            "--crate-type",
            "cdylib",
            "--features",
            feature,
        ])
        .args([
            "--target",
            "nvptx64-nvidia-cuda",
            "-Zbuild-std=core",
            "--target-dir",
        ])
        .arg(&target_dir)
        .env("CARGO_ENCODED_RUSTFLAGS", rustflags)
        // Settings of an outer build (clippy's wrapper, a host target dir, host rustflags)
        // must not leak into the device build.
        .env_remove("RUSTFLAGS")
        .env_remove("RUSTC_WRAPPER")
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("CARGO_BUILD_TARGET")
        .status()
        .map_err(|e| format!("could not run {}: {e}", cargo.display()))?;
    if !status.success() {
        return Err(format!(
            "building kernels-gpu ({feature}) for nvptx64 failed ({status})"
        ));
    }
    Ok(target_dir
        .join("nvptx64-nvidia-cuda")
        .join("release")
        .join("kernels_gpu.ptx"))
}
