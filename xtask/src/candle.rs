//! `cargo xtask check-candle`: clippy over `integrations/candle` on stable Rust, on a machine
//! without nvcc or a GPU (CI). candle-kernels compiles CUDA C with nvcc in its build script,
//! even for `cargo check`; here it is replaced, for this check only, by a stand-in made from
//! its own published source with a build script that declares every PTX module empty. The
//! integration's code is type-checked against the real candle-core and candle-nn; the GPU
//! machine's build uses the real candle-kernels.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{Result, run};

/// The stand-in's build script: `ptx.rs` with an empty string for every `src/*.cu`, the names
/// candle-kernels' own build gives its modules.
const STAND_IN_BUILD_SCRIPT: &str = r#"// A stand-in build for type-checking without nvcc: every PTX module is empty.
fn main() {
    let out = std::env::var("OUT_DIR").expect("set by cargo");
    let mut ptx = String::new();
    for entry in std::fs::read_dir("src").expect("the crate's sources") {
        let path = entry.expect("a directory entry").path();
        if path.extension().is_some_and(|e| e == "cu") {
            let stem = path.file_stem().expect("a name").to_string_lossy();
            let name = stem.to_uppercase().replace(['.', '-'], "_");
            ptx.push_str(&format!("pub const {name}: &str = \"\";\n"));
        }
    }
    std::fs::write(std::path::Path::new(&out).join("ptx.rs"), ptx).expect("writing ptx.rs");
}
"#;

/// The version of `package` that `lock` (a Cargo.lock) pins.
fn locked_version(lock: &Path, package: &str) -> Result<String> {
    let text = fs::read_to_string(lock).map_err(|e| format!("reading {}: {e}", lock.display()))?;
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        if line == format!("name = \"{package}\"") {
            let version = lines.next().unwrap_or_default();
            if let Some(v) = version.strip_prefix("version = \"") {
                return Ok(v.trim_end_matches('"').to_owned());
            }
        }
    }
    Err(format!("{} pins no {package}", lock.display()))
}

/// The unpacked source of `package` `version` in cargo's registry cache.
fn registry_source(package: &str, version: &str) -> Result<PathBuf> {
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cargo")))
        .ok_or("neither CARGO_HOME nor HOME is set")?;
    let registries = home.join("registry").join("src");
    let name = format!("{package}-{version}");
    fs::read_dir(&registries)
        .map_err(|e| format!("reading {}: {e}", registries.display()))?
        .filter_map(|entry| Some(entry.ok()?.path().join(&name)))
        .find(|path| path.join("Cargo.toml").is_file())
        .ok_or_else(|| format!("{name} is not in {}", registries.display()))
}

fn copy_dir(from: &Path, to: &Path) -> Result<()> {
    fs::create_dir_all(to).map_err(|e| format!("creating {}: {e}", to.display()))?;
    for entry in fs::read_dir(from).map_err(|e| e.to_string())? {
        let entry = entry.map_err(|e| e.to_string())?;
        let target = to.join(entry.file_name());
        if entry.path().is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            fs::copy(entry.path(), &target).map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}

/// A cargo of the stable toolchain, as a user of the integration builds with.
fn stable_cargo() -> Command {
    let mut command = Command::new("rustup");
    command
        .args(["run", "stable", "cargo"])
        .env_remove("RUSTUP_TOOLCHAIN")
        .env_remove("RUSTC")
        .env_remove("CARGO");
    command
}

pub fn check_candle(workspace: &Path) -> Result<()> {
    let integration = workspace.join("integrations").join("candle");
    let manifest = integration.join("Cargo.toml");
    let lock = integration.join("Cargo.lock");
    run(stable_cargo()
        .args(["fetch", "--locked", "--manifest-path"])
        .arg(&manifest))?;
    let version = locked_version(&lock, "candle-kernels")?;
    let stand_in = workspace.join("target").join("candle-kernels-stand-in");
    let _ = fs::remove_dir_all(&stand_in);
    copy_dir(&registry_source("candle-kernels", &version)?, &stand_in)?;
    fs::write(stand_in.join("build.rs"), STAND_IN_BUILD_SCRIPT).map_err(|e| e.to_string())?;
    // The patch rewrites the lock file; the committed one is put back however the check ends.
    let locked = fs::read(&lock).map_err(|e| e.to_string())?;
    let patch = format!(
        "patch.crates-io.candle-kernels.path={:?}",
        stand_in.display().to_string()
    );
    let checked = run(stable_cargo()
        .current_dir(&integration)
        .args(["clippy", "--all-targets", "--config"])
        .arg(&patch)
        .args(["--", "-D", "warnings"])
        // No nvcc to ask: cudarc's bindings of the CUDA version the GPU machine has.
        .env("CUDARC_CUDA_VERSION", "13000")
        .env(
            "CARGO_TARGET_DIR",
            workspace.join("target").join("candle-check"),
        ));
    fs::write(&lock, locked).map_err(|e| e.to_string())?;
    checked
}
