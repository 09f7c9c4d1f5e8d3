//! Builds `kernels-gpu` to PTX. Shared, as a source file, by `host/build.rs` (which embeds the
//! result) and by `cargo xtask build-ptx` (which prints it), so the flags exist once.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The GPU architecture the PTX targets (`.target sm_90`: Hopper).
pub const GPU_ARCH: &str = "sm_90";

/// Where the nested build puts its artifacts, apart from the host build's own target dir so
/// the two never wait on each other's lock.
pub fn ptx_target_dir(workspace: &Path) -> PathBuf {
    workspace.join("target").join("ptx")
}

/// Runs `cargo rustc -p kernels-gpu` for `nvptx64-nvidia-cuda` with `cargo` and returns the
/// path of the PTX it wrote.
pub fn build_kernels_ptx(cargo: &Path, workspace: &Path) -> Result<PathBuf, String> {
    let target_dir = ptx_target_dir(workspace);
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
            "building kernels-gpu for nvptx64 failed ({status})"
        ));
    }
    Ok(target_dir
        .join("nvptx64-nvidia-cuda")
        .join("release")
        .join("kernels_gpu.ptx"))
}
