//! `cargo xtask <command>`: project chores that need no GPU and no CUDA.
//!
//! - `build-ptx`: build every PTX module of both kernel builds (sm_90, sm_80) into
//!   `target/ptx-modules/`, list its entries and, where `ptxas` is found, its registers, shared
//!   memory and spills per kernel; end with the entries and bytes of each module (what the
//!   driver compiles when it loads it as PTX).
//! - `entries`: regenerate `docs/entries.md`, the listing of every kernel entry (the host's
//!   test that checks it, run so that it writes the file).
//! - `fetch-driver`: unpack Debian's `libcuda1` under `target/cuda-driver` so machines without
//!   CUDA can link cust (it reports "no device" at run time).
//! - `fetch-ptxas`: unpack `ptxas` from NVIDIA's `nvidia-cuda-nvcc-cu12` wheel (through pip)
//!   under `target/ptxas`, where builds find it: the library then embeds cubins (native code
//!   that loads in milliseconds) beside the PTX, and `build-ptx` reports registers and spills.
//! - `peer-wheels [PYTHON]`: download the wheels of QuACK, FlashInfer and Liger and of what they
//!   need beyond PyTorch, for CPython `PYTHON` (default 3.12) on x86-64 Linux, into
//!   `target/peer-wheels/`, for a GPU machine without network access (`pip install --no-deps
//!   --no-index target/peer-wheels/*.whl` there).
//! - `test [ARGS]`: fetch the driver library if linking needs it, then `cargo test --workspace`.
//! - `device-bundle [--base REV]`: build the release `host` binary, the GPU test binaries, the
//!   criterion benches, the examples and the outside consumer crates, with cubins (fetching
//!   `ptxas` if none is found), to run on a GPU machine that has no Rust toolchain, and pack them
//!   into `.gpu/bundle.tar.gz` with the kernel images they embed kept once. With `--base REV`,
//!   the bundle also holds `host-base`, the `host` binary of revision `REV`, for A/B runs of two
//!   builds side by side.
//! - `check-candle`: clippy over `integrations/candle` on stable Rust without nvcc, against a
//!   stand-in for candle-kernels made from its own source (see `candle.rs`).

mod candle;

use std::env;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

type Result<T> = std::result::Result<T, String>;

const USAGE: &str = "usage: cargo xtask <build-ptx | entries | fetch-driver | fetch-ptxas | \
                     peer-wheels [PYTHON] | test [ARGS] | device-bundle [--base REV] | \
                     check-candle>";

fn main() -> ExitCode {
    let args: Vec<String> = env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("build-ptx") => build_ptx(),
        Some("entries") => write_entry_listing(),
        Some("fetch-driver") => fetch_driver().map(|_| ()),
        Some("fetch-ptxas") => fetch_ptxas().map(|_| ()),
        Some("peer-wheels") => match &args[1..] {
            [] => peer_wheels("3.12"),
            [python] => peer_wheels(python),
            _ => Err(USAGE.into()),
        },
        Some("test") => test(&args[1..]),
        Some("check-candle") => candle::check_candle(&workspace()),
        Some("device-bundle") => match &args[1..] {
            [] => device_bundle(None),
            [flag, revision] if flag == "--base" => device_bundle(Some(revision)),
            _ => Err(USAGE.into()),
        },
        _ => Err(USAGE.into()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("xtask: {message}");
            ExitCode::FAILURE
        }
    }
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask/ sits in the workspace")
        .to_path_buf()
}

fn cargo() -> PathBuf {
    env::var_os("CARGO")
        .map(PathBuf::from)
        .unwrap_or_else(|| "cargo".into())
}

fn run(command: &mut Command) -> Result<()> {
    let status = command
        .status()
        .map_err(|e| format!("could not start {command:?}: {e}"))?;
    status
        .success()
        .then_some(())
        .ok_or_else(|| format!("{command:?} failed ({status})"))
}

fn build_ptx() -> Result<()> {
    let workspace = workspace();
    let modules = ptx_modules_dir(&workspace);
    ptx_builder::build_all_ptx(&cargo(), &workspace, &modules)?;
    let mut sizes = Vec::new();
    for build in ptx_builder::KernelBuild::ALL {
        for module in ptx_builder::MODULES.map(|m| m.name) {
            let path = modules.join(build.ptx_file(module));
            let ptx = fs::read_to_string(&path).map_err(|e| e.to_string())?;
            let entries = entry_names(&ptx);
            sizes.push((module, build.arch(), entries.len(), ptx.len()));
            println!(
                "PTX module `{module}` ({}): {}",
                build.arch(),
                path.display()
            );
            println!("{} kernel entries:", entries.len());
            for entry in &entries {
                let local = if local_memory_in(&ptx, entry) {
                    "  LOCAL MEMORY"
                } else {
                    ""
                };
                println!("  {entry}{local}");
            }
            print_ptxas_report(&path, build.arch())?;
        }
    }
    // What the driver compiles when it loads each module from PTX: the cold-start cost where
    // no cubin matches the GPU.
    println!("\nmodule     build   entries        bytes");
    for build in ptx_builder::KernelBuild::ALL {
        let mut total = (0, 0);
        for (module, arch, entries, bytes) in sizes.iter().filter(|s| s.1 == build.arch()) {
            println!("{module:<10} {arch:<6} {entries:>8} {bytes:>12}");
            total = (total.0 + entries, total.1 + bytes);
        }
        println!(
            "{:<10} {:<6} {:>8} {:>12}",
            "total",
            build.arch(),
            total.0,
            total.1
        );
    }
    Ok(())
}

/// Where `build-ptx` and `device-bundle` leave one `<module>.ptx` per PTX module.
fn ptx_modules_dir(workspace: &Path) -> PathBuf {
    workspace.join("target").join("ptx-modules")
}

/// Names of the `.entry` functions, in file order.
fn entry_names(ptx: &str) -> Vec<String> {
    ptx.lines()
        .filter_map(|line| line.split(".entry ").nth(1))
        .map(|rest| rest.trim_end_matches('(').trim().to_owned())
        .collect()
}

/// Whether the entry declares a local-memory stack frame (an array the compiler could not
/// keep in registers).
fn local_memory_in(ptx: &str, entry: &str) -> bool {
    let Some(start) = ptx.find(&format!(".entry {entry}(")) else {
        return false;
    };
    let body = &ptx[start..];
    let end = body.find("\n}").unwrap_or(body.len());
    body[..end].contains("__local_depot")
}

/// The `nvidia-cuda-nvcc-cu12` wheel `fetch-ptxas` takes `ptxas` from. Its register counts
/// matched the H200's CUDA 13.0 `ptxas` on all 478 entries of the four modules (2026-11-30).
const PTXAS_WHEEL: &str = "nvidia-cuda-nvcc-cu12==12.9.86";

/// Downloads NVIDIA's nvcc wheel with pip and unpacks its `ptxas` to
/// [`ptx_builder::fetched_ptxas`].
fn fetch_ptxas() -> Result<PathBuf> {
    let ptxas = ptx_builder::fetched_ptxas(&workspace());
    if ptxas.is_file() {
        return Ok(ptxas);
    }
    let root = ptxas
        .parent()
        .and_then(Path::parent)
        .expect("target/ptxas/bin/ptxas");
    let wheels = root.join("wheel");
    fs::create_dir_all(&wheels).map_err(|e| e.to_string())?;
    run(Command::new("python3")
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--quiet",
            PTXAS_WHEEL,
            "-d",
        ])
        .arg(&wheels))?;
    let wheel = fs::read_dir(&wheels)
        .map_err(|e| e.to_string())?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .find(|path| path.extension().is_some_and(|ext| ext == "whl"))
        .ok_or("pip downloaded no wheel")?;
    let unpacked = root.join("unpacked");
    run(Command::new("python3")
        .args(["-m", "zipfile", "-e"])
        .arg(&wheel)
        .arg(&unpacked))?;
    fs::create_dir_all(ptxas.parent().expect("has a parent")).map_err(|e| e.to_string())?;
    fs::copy(unpacked.join("nvidia/cuda_nvcc/bin/ptxas"), &ptxas).map_err(|e| e.to_string())?;
    fs::set_permissions(&ptxas, fs::Permissions::from_mode(0o755)).map_err(|e| e.to_string())?;
    println!("ptxas: {}", ptxas.display());
    Ok(ptxas)
}

/// The benchmark's optional peers and what they import beyond PyTorch, NumPy and Triton: the
/// versions that ran on the H200 (2026-12-01; `cuda-bindings` matching the driver's CUDA 13).
const PEER_WHEELS: &[&str] = &[
    "quack-kernels==0.6.5",
    "nvidia-cutlass-dsl==4.8.1",
    "nvidia-cutlass-dsl-libs-base==4.8.1",
    "nvidia-cutlass-dsl-libs-core==4.8.1",
    "nvidia-cutlass-dsl-libs-cu13==4.8.1",
    "apache-tvm-ffi==0.1.15.post2",
    "torch-c-dlpack-ext==0.1.5",
    "einops",
    "cuda-bindings==13.0.3",
    "cuda-python==13.0.3",
    "cuda-pathfinder",
    "protobuf",
    "typing-extensions",
    "flashinfer-python==0.7.2.post1",
    "cuda-tile",
    "nccl4py",
    "nccl-extensions",
    "nvidia-cudnn-frontend",
    "nvidia-ml-py",
    "tabulate",
    "liger-kernel==0.8.5",
];

/// Downloads [`PEER_WHEELS`] (each without its dependencies: the list is closed) for CPython
/// `python` on x86-64 Linux into `target/peer-wheels`.
fn peer_wheels(python: &str) -> Result<()> {
    let dest = workspace().join("target").join("peer-wheels");
    fs::create_dir_all(&dest).map_err(|e| e.to_string())?;
    let mut command = Command::new("python3");
    command.args([
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--quiet",
        "--only-binary=:all:",
    ]);
    command.args(["--python-version", python]);
    for platform in [
        "manylinux_2_34_x86_64",
        "manylinux_2_28_x86_64",
        "manylinux_2_27_x86_64",
        "manylinux_2_24_x86_64",
        "manylinux_2_17_x86_64",
        "manylinux2014_x86_64",
    ] {
        command.args(["--platform", platform]);
    }
    run(command.args(PEER_WHEELS).arg("-d").arg(&dest))?;
    println!(
        "peer wheels for CPython {python}: {} (on the GPU machine, from the repository root: \
         python3 -m pip install --no-deps --no-index target/peer-wheels/*.whl)",
        dest.display()
    );
    Ok(())
}

/// Registers and spills of every entry of `ptx`, one line each, from `ptxas -v`.
fn print_ptxas_report(ptx: &Path, arch: &str) -> Result<()> {
    let Some(ptxas) = ptx_builder::find_ptxas(&workspace()) else {
        println!(
            "ptxas not found (no CUDA toolkit here; `cargo xtask fetch-ptxas` gets one): \
             registers, shared memory and spills not reported"
        );
        return Ok(());
    };
    let output = Command::new(&ptxas)
        .args(["-arch", arch, "-v", "-o", "/dev/null"])
        .arg(ptx)
        .output()
        .map_err(|e| format!("running {}: {e}", ptxas.display()))?;
    let report = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        print!("{report}");
        return Err("ptxas rejected the PTX".into());
    }
    println!(
        "ptxas -v ({}): registers per thread (and any local memory)",
        ptxas.display()
    );
    let (mut entry, mut frame) = (String::new(), String::new());
    for line in report.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            entry = rest.split('\'').next().unwrap_or_default().to_owned();
        } else if line.contains("bytes stack frame") {
            frame = line.trim().to_owned();
        } else if let Some(rest) = line.split("Used ").nth(1) {
            let registers = rest.split(' ').next().unwrap_or_default();
            let clean = frame.starts_with("0 bytes stack frame, 0 bytes spill stores");
            let memory = if clean {
                String::new()
            } else {
                format!("  LOCAL MEMORY: {frame}")
            };
            println!("  {entry:44} {registers:>3} registers{memory}");
        }
    }
    Ok(())
}

/// Directory holding `libcuda.so` for linking; `.cargo/config.toml` points cust at it.
fn driver_dir(workspace: &Path) -> PathBuf {
    workspace.join("target").join("cuda-driver")
}

/// Downloads Debian's `libcuda1` (a real driver library: it links, and without a GPU it
/// reports "no device") through a private sources list that adds the non-free component,
/// leaving the system's own lists alone, and unpacks it under `target/cuda-driver/lib64`.
fn fetch_driver() -> Result<PathBuf> {
    let root = driver_dir(&workspace());
    let lib64 = root.join("lib64");
    if lib64.join("libcuda.so").exists() {
        return Ok(lib64);
    }
    let apt = root.join("apt");
    for dir in ["lists/partial", "cache/archives/partial", "deb", "unpacked"] {
        fs::create_dir_all(apt.join(dir)).map_err(|e| e.to_string())?;
    }
    let codename = fs::read_to_string("/etc/os-release")
        .ok()
        .and_then(|release| {
            release
                .lines()
                .find_map(|l| l.strip_prefix("VERSION_CODENAME=").map(str::to_owned))
        })
        .ok_or("cannot read VERSION_CODENAME from /etc/os-release (Debian expected)")?;
    let sources = apt.join("sources.list");
    fs::write(
        &sources,
        format!(
            "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] \
             http://deb.debian.org/debian {codename} main non-free\n"
        ),
    )
    .map_err(|e| e.to_string())?;
    let options = [
        format!("-oDir::Etc::SourceList={}", sources.display()),
        "-oDir::Etc::SourceParts=/dev/null".to_owned(),
        format!("-oDir::State::Lists={}", apt.join("lists").display()),
        format!("-oDir::Cache={}", apt.join("cache").display()),
        "-oAPT::Sandbox::User=root".to_owned(),
        "-qq".to_owned(),
    ];
    println!(
        "fetching Debian's libcuda1 into {} (link-time CUDA driver for machines without one)",
        root.display()
    );
    run(Command::new("apt-get").args(&options).arg("update"))?;
    run(Command::new("apt-get")
        .args(&options)
        .args(["download", "libcuda1"])
        .current_dir(apt.join("deb")))?;
    let deb = fs::read_dir(apt.join("deb"))
        .map_err(|e| e.to_string())?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "deb"))
        .ok_or("apt-get download left no .deb")?;
    run(Command::new("dpkg-deb")
        .arg("-x")
        .arg(&deb)
        .arg(apt.join("unpacked")))?;
    let versioned = fs::read_dir(apt.join("unpacked/usr/lib/x86_64-linux-gnu/nvidia/current"))
        .map_err(|e| format!("unexpected libcuda1 layout: {e}"))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .find(|p| {
            p.file_name().is_some_and(|n| {
                n.to_string_lossy().starts_with("libcuda.so.")
                    && !n.to_string_lossy().ends_with(".so.1")
            })
        })
        .ok_or("libcuda1 holds no versioned libcuda.so")?;
    fs::create_dir_all(&lib64).map_err(|e| e.to_string())?;
    fs::copy(&versioned, lib64.join("libcuda.so.1")).map_err(|e| e.to_string())?;
    std::os::unix::fs::symlink("libcuda.so.1", lib64.join("libcuda.so"))
        .map_err(|e| e.to_string())?;
    Ok(lib64)
}

/// Whether cust's build script finds a `libcuda.so` to link against where it looks: under
/// `lib64` (or `lib64/stubs`) of each `CUDA_LIBRARY_PATH` entry (`.cargo/config.toml` points
/// it at the fetched library), `/usr/local/cuda` or `/opt/cuda`.
fn driver_linkable() -> bool {
    let configured = env::var_os("CUDA_LIBRARY_PATH")
        .map(|p| env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default();
    configured
        .into_iter()
        .chain(["/usr/local/cuda".into(), "/opt/cuda".into()])
        .any(|root| {
            ["lib64/libcuda.so", "lib64/stubs/libcuda.so"]
                .iter()
                .any(|lib| root.join(lib).exists())
        })
}

/// `docs/entries.md`, written by the host test that compares it with the entry tables.
fn write_entry_listing() -> Result<()> {
    if !driver_linkable() {
        fetch_driver()?;
    }
    let status = Command::new(cargo())
        .current_dir(workspace())
        .args([
            "test",
            "--package",
            "host",
            "--lib",
            "--",
            "the_entry_listing_is_current",
        ])
        .env("SOFTMAX_WRITE_ENTRIES", "1")
        .status()
        .map_err(|e| format!("could not start cargo test: {e}"))?;
    if !status.success() {
        return Err(format!("writing docs/entries.md failed ({status})"));
    }
    println!("wrote docs/entries.md");
    Ok(())
}

fn test(args: &[String]) -> Result<()> {
    if !driver_linkable() {
        fetch_driver()?;
    }
    let mut child = Command::new(cargo())
        .current_dir(workspace())
        .args(["test", "--workspace"])
        .args(args)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("could not start cargo test: {e}"))?;
    // Pass the output through and add up every harness's closing line, so the run ends with
    // one total (the last harness, a crate's doc-tests, often has nothing to run).
    let mut totals = [0u64; 3];
    let stdout = child.stdout.take().expect("piped");
    for line in std::io::BufRead::lines(std::io::BufReader::new(stdout)) {
        let line = line.map_err(|e| e.to_string())?;
        println!("{line}");
        if let Some(result) = line.trim().strip_prefix("test result:") {
            for (total, word) in totals.iter_mut().zip(["passed", "failed", "skipped"]) {
                *total += count_before(result, word);
            }
        }
    }
    let status = child.wait().map_err(|e| e.to_string())?;
    let [passed, failed, skipped] = totals;
    println!("\nsummary: {passed} passed, {failed} failed, {skipped} skipped");
    status
        .success()
        .then_some(())
        .ok_or_else(|| format!("cargo test failed ({status})"))
}

/// The number just before `word` in a harness's result line (`ok. 12 passed; 0 failed; …`).
fn count_before(result: &str, word: &str) -> u64 {
    let Some(at) = result.find(&format!(" {word}")) else {
        return 0;
    };
    let digits: String = result[..at]
        .chars()
        .rev()
        .take_while(char::is_ascii_digit)
        .collect();
    digits
        .chars()
        .rev()
        .collect::<String>()
        .parse()
        .unwrap_or(0)
}

/// The outside consumer crates (`examples/consumer*`), built as a user's crates are, into
/// `dest`.
fn bundle_consumers(workspace: &Path, dest: &Path) -> Result<()> {
    fs::create_dir_all(dest).map_err(|e| e.to_string())?;
    let target = workspace.join("target").join("consumers");
    for consumer in CONSUMERS {
        let manifest = workspace.join("examples").join(consumer).join("Cargo.toml");
        run(Command::new(cargo())
            .current_dir(workspace)
            .args(["build", "--release", "--manifest-path"])
            .arg(&manifest)
            .env("CARGO_TARGET_DIR", &target))?;
        fs::copy(target.join("release").join(consumer), dest.join(consumer))
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// The crates outside the workspace that use the library as its users do.
const CONSUMERS: [&str; 2] = ["consumer", "consumer-cudarc"];

/// Builds what a GPU machine without Rust needs and packs it into `.gpu/bundle.tar.gz`
/// (ignored by git; copy `.gpu/` to the GPU machine): the release `host` binary, the `gpu*`
/// test binaries, the criterion benches, the examples, the consumers, the PTX modules, and with
/// `base` the `host` binary of that revision as `host-base`.
fn device_bundle(base: Option<&str>) -> Result<()> {
    let workspace = workspace();
    let staging = workspace.join("target").join("gpu-bundle");
    let _ = fs::remove_dir_all(&staging);
    fs::create_dir_all(&staging).map_err(|e| e.to_string())?;
    if !driver_linkable() {
        fetch_driver()?;
    }
    // The GPU machine runs native code, as users with a CUDA toolkit at build time do.
    let ptxas = match ptx_builder::find_ptxas(&workspace) {
        Some(ptxas) => ptxas,
        None => fetch_ptxas()?,
    };
    // Named to every build below: `host`'s build script reruns when `PTXAS` changes, so a
    // build cached from before `ptxas` was fetched (PTX only) is not reused, and one that
    // cannot make cubins fails instead of bundling PTX.
    // SAFETY: xtask is single-threaded; nothing reads the environment concurrently.
    unsafe { env::set_var("PTXAS", &ptxas) };
    run(Command::new(cargo())
        .current_dir(&workspace)
        .args(["build", "--release", "-p", "host"]))?;
    fs::copy(workspace.join("target/release/host"), staging.join("host"))
        .map_err(|e| e.to_string())?;
    // Only what needs the GPU: the `gpu*` test binaries, the criterion benches and the
    // examples (the CPU tests run here, and the carry to the GPU machine is limited in size).
    for (command, folder, kind, prefix) in [
        (
            // With the cudarc adapter, so that its GPU test runs too.
            ["test", "--release", "--no-run", "--features", "cudarc"].as_slice(),
            "tests",
            "test",
            "gpu",
        ),
        (["bench", "--no-run"].as_slice(), "benches", "bench", ""),
        (
            ["build", "--release", "--examples"].as_slice(),
            "examples",
            "example",
            "",
        ),
    ] {
        let output = Command::new(cargo())
            .current_dir(&workspace)
            .args(command)
            .args(["-p", "host", "--message-format=json"])
            .output()
            .map_err(|e| e.to_string())?;
        if !output.status.success() {
            return Err(String::from_utf8_lossy(&output.stderr).into_owned());
        }
        fs::create_dir_all(staging.join(folder)).map_err(|e| e.to_string())?;
        let mut names = Vec::new();
        for line in String::from_utf8_lossy(&output.stdout).lines() {
            if let Some(executable) = json_string_field(line, "executable") {
                let path = PathBuf::from(executable);
                let name = path
                    .file_name()
                    .expect("an executable has a name")
                    .to_owned();
                let wanted = line.contains(&format!("\"kind\":[\"{kind}\"]"))
                    && name.to_string_lossy().starts_with(prefix);
                if !wanted {
                    continue;
                }
                fs::copy(&path, staging.join(folder).join(&name)).map_err(|e| e.to_string())?;
                names.push(name.to_string_lossy().into_owned());
            }
        }
        println!("bundled {folder}: {}", names.join(" "));
    }
    bundle_consumers(&workspace, &staging.join("consumers"))?;
    if let Some(revision) = base {
        build_base_host(&workspace, revision, &staging.join("host-base"))?;
    }
    // The images every binary embeds, kept once: the binaries get them back on the GPU
    // machine (bench/unpack-bundle.sh).
    let images = staging.join("images");
    ptx_builder::build_all_ptx(&cargo(), &workspace, &images)?;
    ptx_builder::compile_cubins(&ptxas, &workspace, &images)?;
    run(Command::new("python3")
        .arg(workspace.join("bench").join("bundle_images.py"))
        .arg("pack")
        .arg(&staging)
        .arg(&images))?;
    let bundle = workspace.join(".gpu");
    let _ = fs::remove_dir_all(&bundle);
    fs::create_dir_all(&bundle).map_err(|e| e.to_string())?;
    let archive = bundle.join("bundle.tar.gz");
    run(Command::new("tar")
        .arg("czf")
        .arg(&archive)
        .arg("-C")
        .arg(&staging)
        .arg("."))?;
    let bytes = fs::metadata(&archive).map_err(|e| e.to_string())?.len();
    println!(
        "{}: {:.1} MiB (bench/device-run.sh and bench/sanitize.sh unpack it on the GPU machine)",
        archive.display(),
        bytes as f64 / (1024.0 * 1024.0)
    );
    Ok(())
}

/// Builds the release `host` binary of `revision` in a temporary worktree (its own target
/// directory, this checkout's driver library) and copies it to `destination`.
fn build_base_host(workspace: &Path, revision: &str, destination: &Path) -> Result<()> {
    let tree = workspace.join("target").join("base-worktree");
    let git = |args: &[&str]| {
        run(Command::new("git")
            .current_dir(workspace)
            .args(args)
            .arg(&tree))
    };
    if tree.exists() {
        git(&["worktree", "remove", "--force"])?;
    }
    git(&["worktree", "add", "--detach", "--force"])?;
    run(Command::new("git")
        .current_dir(&tree)
        .args(["checkout", "--detach", "--quiet", revision]))?;
    let built = run(Command::new(cargo())
        .current_dir(&tree)
        .env(
            "CARGO_TARGET_DIR",
            workspace.join("target").join("base-target"),
        )
        .env("CUDA_LIBRARY_PATH", driver_dir(workspace))
        .args(["build", "--release", "-p", "host"]));
    let copied = built.and_then(|()| {
        fs::copy(
            workspace.join("target/base-target/release/host"),
            destination,
        )
        .map(|_| println!("bundled host-base: host at {revision}"))
        .map_err(|e| e.to_string())
    });
    git(&["worktree", "remove", "--force"])?;
    copied
}

/// The value of a string field in one line of cargo's JSON messages (enough for
/// `"executable":"/path"`; avoids a JSON dependency in the xtask).
fn json_string_field<'a>(line: &'a str, field: &str) -> Option<&'a str> {
    let start = line.find(&format!("\"{field}\":\""))? + field.len() + 4;
    let end = line[start..].find('"')?;
    Some(&line[start..start + end])
}
