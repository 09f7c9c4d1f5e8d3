//! Builds `kernels-gpu` into the code the host embeds: the one build step that `host/build.rs`
//! and `cargo xtask` share, so the flags exist once. Like Rust-CUDA's `cuda_builder`, a build
//! script makes one call per step:
//!
//! ```no_run
//! # use std::path::Path;
//! # let (cargo, workspace, out_dir) = (Path::new("cargo"), Path::new("."), Path::new("out"));
//! ptx_builder::build_all_ptx(cargo, workspace, out_dir).unwrap();
//! if let Some(ptxas) = ptx_builder::find_ptxas(workspace) {
//!     ptx_builder::compile_cubins(&ptxas, workspace, out_dir).unwrap();
//! }
//! ```
//!
//! Each module is built twice: for sm_90 (Hopper: programmatic dependent launch, thread-block
//! clusters) and for sm_80 (every GPU from Ampere on: without those instructions). With
//! `ptxas`, each build is also compiled to native code for the architectures it serves, so a
//! matching GPU loads it without the driver's JIT compiler.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};

/// What one PTX module compiles: the kernels of one [`ModuleKernels`] kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ModuleKernels {
    /// The f32 softmax variants: the seeds, the production families, f32 row slices and row
    /// clusters.
    Softmax,
    /// The operation kernels for one input type (named as `DType::name` spells it), and that
    /// type's row-slices entries when it is a 16-bit type.
    Operations(&'static str),
}

/// One PTX module: `kernels-gpu` built with `--cfg kernels_module="<name>"`, which selects
/// the kernels its `cfg` gates name. The host loads a module the first time it needs one of
/// its kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PtxModule {
    /// The module's name: its `kernels_module` cfg value and the stem of its files.
    pub name: &'static str,
    pub kernels: ModuleKernels,
}

/// Every PTX module, in the order of the host's module table (which `host/build.rs`
/// generates from this list, as `kernels-gpu`'s build script declares the `kernels_module`
/// values from it).
pub const MODULES: [PtxModule; 4] = [
    PtxModule {
        name: "softmax",
        kernels: ModuleKernels::Softmax,
    },
    PtxModule {
        name: "ops-f32",
        kernels: ModuleKernels::Operations("f32"),
    },
    PtxModule {
        name: "ops-bf16",
        kernels: ModuleKernels::Operations("bf16"),
    },
    PtxModule {
        name: "ops-f16",
        kernels: ModuleKernels::Operations("f16"),
    },
];

/// Launch bounds `ptxas` (and the driver, compiling PTX) is told for an entry: its blocks
/// have at most `threads` threads, and `blocks_per_sm` of them should fit a multiprocessor at
/// once (`.maxntid` and `.minnctapersm`; Rust has no attribute for them). Without them
/// `ptxas` may give a kernel so many registers that one block fills the multiprocessor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchBounds {
    /// The entries' names, exactly.
    pub entries: &'static [&'static str],
    pub threads: u32,
    pub blocks_per_sm: u32,
}

/// Every entry with launch bounds. A host test checks them against the block size and the
/// blocks per multiprocessor its planner uses; [`build_all_ptx`] fails where a listed entry is
/// not found to take its bounds.
pub const LAUNCH_BOUNDS: [LaunchBounds; 4] = [
    LaunchBounds {
        // The cross-entropy row kernels, two of whose blocks share a multiprocessor's shared
        // memory when they keep their slices there.
        entries: &[
            "cross_entropy_f32",
            "cross_entropy_bf16",
            "cross_entropy_f16",
        ],
        threads: 512,
        blocks_per_sm: 2,
    },
    LaunchBounds {
        // The sampling row kernels: a block of 512 threads per row.
        entries: &["sample_f32", "sample_bf16", "sample_f16"],
        threads: 512,
        blocks_per_sm: 1,
    },
    LaunchBounds {
        // Their draw-only forms, two blocks to a multiprocessor: the draw waits on Philox's
        // rounds and the logarithms, which one block's 16 warps leave exposed.
        entries: &["sample_draw_f32", "sample_draw_bf16", "sample_draw_f16"],
        threads: 512,
        blocks_per_sm: 2,
    },
    LaunchBounds {
        // The candidate path's two launches (a small top-k), two blocks to a multiprocessor.
        entries: &[
            "sample_top_f32",
            "sample_top_bf16",
            "sample_top_f16",
            "sample_top_merge_f32",
            "sample_top_merge_bf16",
            "sample_top_merge_f16",
        ],
        threads: 512,
        blocks_per_sm: 2,
    },
];

/// Registers `ptxas` may give each thread of the entries whose names start with `prefix`
/// (`.maxnreg`), where the block size is a launch parameter, so launch bounds cannot say it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegisterCap {
    pub prefix: &'static str,
    pub registers: u32,
}

/// Every entry family with a register cap. [`build_all_ptx`] fails where a build has no entry
/// of a listed family.
pub const REGISTER_CAPS: [RegisterCap; 2] = [
    RegisterCap {
        // The cross-entropy block entries: 64 registers let two blocks of 512 threads share a
        // multiprocessor, and every block size up to 1024 launch. Uncapped, `ptxas` gave the
        // 8-pack entries 72 to 127 registers as the code around their loads changed, where
        // 64 spill nothing.
        prefix: "op_block_xent_",
        registers: 64,
    },
    RegisterCap {
        // The cross-entropy row-slices entries: four blocks of 256 threads a multiprocessor
        // (the row-slices plan in waves), and every block size up to 1024 launch.
        prefix: "cross_entropy_slices_",
        registers: 64,
    },
];

/// `ptx` with each entry of [`LAUNCH_BOUNDS`] given its bounds, and each entry of a family of
/// [`REGISTER_CAPS`] its cap, after its parameter list; and the entries (the names listed in
/// [`LAUNCH_BOUNDS`], the prefixes of [`REGISTER_CAPS`]) it gave them.
pub fn with_launch_bounds(ptx: &str) -> (String, Vec<&'static str>) {
    let mut bound = Vec::new();
    let mut out = String::with_capacity(ptx.len() + 256);
    let mut pending = None;
    for line in ptx.lines() {
        out.push_str(line);
        out.push('\n');
        if let Some(name) = line
            .strip_prefix(".visible .entry ")
            .and_then(|rest| rest.strip_suffix('('))
        {
            let bounds = LAUNCH_BOUNDS.iter().find_map(|bounds| {
                let listed = bounds.entries.iter().find(|&&entry| entry == name)?;
                Some((
                    format!(
                        ".maxntid {},1,1\n.minnctapersm {}\n",
                        bounds.threads, bounds.blocks_per_sm
                    ),
                    *listed,
                ))
            });
            let cap = || {
                REGISTER_CAPS
                    .iter()
                    .find(|cap| name.starts_with(cap.prefix))
                    .map(|cap| (format!(".maxnreg {}\n", cap.registers), cap.prefix))
            };
            pending = bounds.or_else(cap);
        } else if line == ")"
            && let Some((directives, name)) = pending.take()
        {
            out.push_str(&directives);
            if !bound.contains(&name) {
                bound.push(name);
            }
        }
    }
    (out, bound)
}

/// The cfg whose value names the module a device build compiles.
pub const MODULE_CFG: &str = "kernels_module";

/// The `--check-cfg` argument that declares [`MODULE_CFG`] with every module's name.
pub fn module_check_cfg() -> String {
    let names: Vec<String> = MODULES.iter().map(|m| format!("\"{}\"", m.name)).collect();
    format!("cfg({MODULE_CFG}, values({}))", names.join(", "))
}

/// One build of the kernels: the PTX target and the native architectures compiled from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KernelBuild {
    /// `.target sm_90`, with Hopper's instructions; native code for sm_90.
    Sm90,
    /// `.target sm_80` (`--cfg kernels_sm80`: no `griddepcontrol`, no clusters); native code
    /// for sm_80 (which also runs on sm_86 and sm_87) and sm_89.
    Sm80,
}

impl KernelBuild {
    pub const ALL: [KernelBuild; 2] = [KernelBuild::Sm90, KernelBuild::Sm80];

    /// The PTX target, as `ptxas` and rustc spell it.
    pub const fn arch(self) -> &'static str {
        match self {
            KernelBuild::Sm90 => "sm_90",
            KernelBuild::Sm80 => "sm_80",
        }
    }

    /// The architectures `ptxas` compiles this build's PTX for.
    pub const fn native_archs(self) -> &'static [&'static str] {
        match self {
            KernelBuild::Sm90 => &["sm_90"],
            KernelBuild::Sm80 => &["sm_80", "sm_89"],
        }
    }

    /// `<module>.<arch>.ptx`, the file name [`build_all_ptx`] gives a module's PTX.
    pub fn ptx_file(self, module: &str) -> String {
        format!("{module}.{}.ptx", self.arch())
    }
}

/// `<module>.<arch>.cubin`, the file name [`compile_cubins`] gives a module's native code.
pub fn cubin_file(module: &str, arch: &str) -> String {
    format!("{module}.{arch}.cubin")
}

/// Where the nested builds put their artifacts, apart from the host build's own target dir
/// so the two never wait on each other's lock.
fn ptx_target_dir(workspace: &Path) -> PathBuf {
    workspace.join("target").join("ptx")
}

/// Builds every module of [`MODULES`] for every [`KernelBuild`] into
/// `dest_dir/<module>.<arch>.ptx`, with the toolchain `rust-toolchain.toml` pins
/// ([`KernelCargo::pinned`]; `cargo` where there is no rustup).
pub fn build_all_ptx(cargo: &Path, workspace: &Path, dest_dir: &Path) -> Result<(), String> {
    std::fs::create_dir_all(dest_dir)
        .map_err(|e| format!("creating {}: {e}", dest_dir.display()))?;
    let cargo = KernelCargo::pinned(workspace, cargo)?;
    for build in KernelBuild::ALL {
        let mut bound = Vec::new();
        for module in MODULES {
            let built = build_kernels_ptx(&cargo, workspace, module.name, build)?;
            let ptx = std::fs::read_to_string(&built)
                .map_err(|e| format!("reading {}: {e}", built.display()))?;
            let dest = dest_dir.join(build.ptx_file(module.name));
            let (ptx, entries) = with_launch_bounds(&minify_ptx(&ptx));
            bound.extend(entries);
            std::fs::write(&dest, ptx).map_err(|e| format!("writing {}: {e}", dest.display()))?;
        }
        let listed = LAUNCH_BOUNDS.iter().flat_map(|bounds| bounds.entries);
        if let Some(missing) = listed.into_iter().find(|entry| !bound.contains(entry)) {
            return Err(format!(
                "the {} build has no entry `{missing}` to give its launch bounds (ptx-builder's \
                 LAUNCH_BOUNDS names it)",
                build.arch()
            ));
        }
        let capped = REGISTER_CAPS.iter().map(|cap| cap.prefix);
        if let Some(missing) = capped.into_iter().find(|prefix| !bound.contains(prefix)) {
            return Err(format!(
                "the {} build has no entry `{missing}…` to cap (ptx-builder's REGISTER_CAPS \
                 names the family)",
                build.arch()
            ));
        }
    }
    Ok(())
}

/// `ptx` without what neither `ptxas` nor the driver reads: comments (LLVM writes one before
/// and after every inline `asm!` block, and loop annotations), indentation, runs of blanks,
/// blanks after commas and empty lines; and with short names for what is local to a function or the module: a
/// function's parameters (`<function>_param_<n>` becomes `p<n>`: LLVM's spelling repeats the
/// function's name, up to a hundred characters of mangling, in every parameter load), its
/// labels (`$L__BB<function>_<block>`, unique in the module, becomes `$L<k>`, numbered in the
/// function in order of first use: a label's scope is its function's body) and the anonymous
/// shared-memory symbols (`anon_$_<hash>_$_<n>` becomes `anon_<k>`, numbered in order of first
/// use). The host looks entries up by their names, which stay as they are. `ptxas` makes the
/// same cubin of either text (byte for byte, for a module whose kernels did not change). Lines
/// holding a quote (a `.file` name) are kept as they are.
pub fn minify_ptx(ptx: &str) -> String {
    let mut out = String::with_capacity(ptx.len());
    let mut names = LocalNames::default();
    for line in ptx.lines() {
        if line.contains('"') {
            if !line.trim().is_empty() {
                out.push_str(line.trim());
                out.push('\n');
            }
            continue;
        }
        let code = line.split("//").next().unwrap_or_default();
        let mut words = code.split_whitespace();
        let Some(first) = words.next() else {
            continue;
        };
        // Words are joined by one blank, except after a comma, where PTX needs none.
        let mut minified = String::from(first);
        for word in words {
            if !minified.ends_with(',') {
                minified.push(' ');
            }
            minified.push_str(word);
        }
        names.shorten(&minified, &mut out);
        out.push('\n');
    }
    out
}

/// The short names [`minify_ptx`] gives a module's local symbols.
#[derive(Debug, Default)]
struct LocalNames {
    /// The function whose header or body the lines are in.
    function: String,
    /// Each anonymous shared-memory symbol met so far, in order.
    shared: Vec<String>,
    /// Each label of the current function met so far, in order.
    labels: Vec<String>,
}

impl LocalNames {
    /// Appends `line` to `out` with its local names shortened.
    fn shorten(&mut self, line: &str, out: &mut String) {
        let declares_function = line
            .split_whitespace()
            .any(|word| word == ".entry" || word == ".func");
        // The function's name is the last plain word outside parentheses (after a return
        // value's, before its parameters').
        if declares_function && let Some(name) = Self::declared_name(line) {
            self.function = name.to_owned();
            self.labels.clear();
        }
        let is_name = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '$';
        let mut rest = line;
        while let Some(start) = rest.find(is_name) {
            out.push_str(&rest[..start]);
            let after = &rest[start..];
            let len = after.find(|c: char| !is_name(c)).unwrap_or(after.len());
            let (word, tail) = after.split_at(len);
            // A word right after a `.` or `%` is part of a directive or a register.
            let qualified = out.ends_with('.') || out.ends_with('%');
            match self.short_name(word) {
                Some(short) if !qualified => out.push_str(&short),
                _ => out.push_str(word),
            }
            rest = tail;
        }
        out.push_str(rest);
    }

    /// The name a function declaration line declares: its last plain word outside
    /// parentheses, if any.
    fn declared_name(line: &str) -> Option<&str> {
        let mut depth = 0usize;
        let mut name = None;
        let mut word_start = None;
        for (i, c) in line.char_indices().chain([(line.len(), ' ')]) {
            let in_word = c.is_ascii_alphanumeric() || c == '_' || c == '$';
            match (in_word, word_start) {
                (true, None) => word_start = Some(i),
                (false, Some(start)) => {
                    let qualified = start > 0 && matches!(line.as_bytes()[start - 1], b'.' | b'%');
                    if depth == 0 && !qualified {
                        name = Some(&line[start..i]);
                    }
                    word_start = None;
                }
                _ => {}
            }
            match c {
                '(' => depth += 1,
                ')' => depth = depth.saturating_sub(1),
                _ => {}
            }
        }
        name
    }

    fn short_name(&mut self, word: &str) -> Option<String> {
        if word.starts_with("$L__") {
            let k = match self.labels.iter().position(|label| label == word) {
                Some(k) => k,
                None => {
                    self.labels.push(word.to_owned());
                    self.labels.len() - 1
                }
            };
            return Some(format!("$L{k}"));
        }
        if let Some(index) = word
            .strip_prefix(self.function.as_str())
            .and_then(|rest| rest.strip_prefix("_param_"))
            .filter(|index| !index.is_empty() && index.bytes().all(|b| b.is_ascii_digit()))
            .filter(|_| !self.function.is_empty())
        {
            return Some(format!("p{index}"));
        }
        if word.starts_with("anon_$_") {
            let k = match self.shared.iter().position(|name| name == word) {
                Some(k) => k,
                None => {
                    self.shared.push(word.to_owned());
                    self.shared.len() - 1
                }
            };
            return Some(format!("anon_{k}"));
        }
        None
    }
}

/// The toolchain `rust-toolchain.toml` in `workspace` pins: its channel and components.
fn pinned_toolchain(workspace: &Path) -> Result<(String, Vec<String>), String> {
    let file = workspace.join("rust-toolchain.toml");
    let text =
        std::fs::read_to_string(&file).map_err(|e| format!("reading {}: {e}", file.display()))?;
    let value = |key: &str| {
        text.lines()
            .find_map(|line| line.trim().strip_prefix(key)?.trim().strip_prefix('='))
            .map(str::trim)
    };
    let quoted = |text: &str| -> Vec<String> {
        text.split('"')
            .skip(1)
            .step_by(2)
            .map(str::to_owned)
            .collect()
    };
    let channel = value("channel")
        .and_then(|v| quoted(v).into_iter().next())
        .ok_or_else(|| format!("{} names no channel", file.display()))?;
    let components = value("components").map(quoted).unwrap_or_default();
    Ok((channel, components))
}

/// The components the kernel build needs (the rest of the pinned list is for development).
const KERNEL_COMPONENTS: [&str; 3] = [
    "rust-src",
    "llvm-tools-preview",
    "llvm-bitcode-linker-preview",
];

/// How the kernels' cargo is started: the pinned toolchain through `rustup run`, whatever
/// toolchain builds the crate that depends on the kernels (a user's crate on stable Rust, say),
/// or, on a machine without rustup, the cargo of the outer build.
#[derive(Debug)]
pub struct KernelCargo {
    program: PathBuf,
    args: Vec<String>,
}

impl KernelCargo {
    /// The pinned toolchain of `workspace`'s `rust-toolchain.toml`, checked to be installed
    /// with the components the kernels need; where none is, an error that is one line naming
    /// the exact install command. Without rustup, `fallback` (the outer build's cargo).
    pub fn pinned(workspace: &Path, fallback: &Path) -> Result<Self, String> {
        let (channel, _) = pinned_toolchain(workspace)?;
        let install = format!(
            "softmax-rs builds its GPU kernels with the Rust toolchain {channel} and the \
             components {}; install them with: rustup toolchain install {channel} --profile \
             minimal --component {}",
            KERNEL_COMPONENTS.join(", "),
            KERNEL_COMPONENTS.join(",")
        );
        let probe = Command::new("rustup")
            .args(["run", &channel, "rustc", "--print", "sysroot"])
            .env("RUSTUP_AUTO_INSTALL", "0")
            .env_remove("RUSTUP_TOOLCHAIN")
            .env_remove("RUSTC")
            .output();
        let sysroot = match probe {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(KernelCargo {
                    program: fallback.to_path_buf(),
                    args: Vec::new(),
                });
            }
            Err(e) => return Err(format!("could not run rustup: {e}")),
            Ok(out) if !out.status.success() => return Err(install),
            Ok(out) => PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()),
        };
        // rustup keeps a manifest per installed component beside the toolchain's libraries.
        let rustlib = sysroot.join("lib").join("rustlib");
        let manifests: Vec<String> = std::fs::read_dir(&rustlib)
            .map(|entries| {
                entries
                    .filter_map(|e| e.ok()?.file_name().into_string().ok())
                    .collect()
            })
            .unwrap_or_default();
        let installed = |component: &str| {
            let base = component.trim_end_matches("-preview");
            manifests.iter().any(|m| {
                m.strip_prefix("manifest-")
                    .is_some_and(|rest| rest.starts_with(base))
            })
        };
        if !KERNEL_COMPONENTS.iter().all(|c| installed(c)) {
            return Err(install);
        }
        Ok(KernelCargo {
            program: PathBuf::from("rustup"),
            args: vec!["run".to_owned(), channel, "cargo".to_owned()],
        })
    }

    /// A command that runs this cargo, with none of the outer build's toolchain settings.
    fn command(&self) -> Command {
        let mut command = Command::new(&self.program);
        command
            .args(&self.args)
            .env_remove("RUSTUP_TOOLCHAIN")
            .env_remove("RUSTC")
            .env_remove("RUSTDOC")
            .env_remove("CARGO")
            // The same settings as cargo's configuration spells them in the environment.
            .env_remove("CARGO_BUILD_RUSTC")
            .env_remove("CARGO_BUILD_RUSTDOC")
            .env_remove("CARGO_BUILD_RUSTC_WRAPPER")
            .env_remove("CARGO_BUILD_RUSTC_WORKSPACE_WRAPPER");
        command
    }
}

/// Runs `cargo rustc -p kernels-gpu` with `--cfg kernels_module="<module>"` for `nvptx64-nvidia-cuda` with
/// `cargo` and returns the path of the PTX it wrote. Each module and build has a target dir
/// of its own: builds running at once (a `cargo build` beside a `cargo xtask`) then never
/// overwrite each other's `kernels_gpu.ptx` between a build and its copy.
fn build_kernels_ptx(
    cargo: &KernelCargo,
    workspace: &Path,
    module: &str,
    build: KernelBuild,
) -> Result<PathBuf, String> {
    let target_dir = ptx_target_dir(workspace).join(build.arch()).join(module);
    // Unrolling must be allowed to finish the constant-trip loops of the widest register
    // kernels, or their row arrays go to local memory.
    let mut rustflags = vec![
        format!("-Ctarget-cpu={}", build.arch()),
        "-Cllvm-args=-unroll-threshold=2000".to_owned(),
        "--cfg".to_owned(),
        format!("{MODULE_CFG}=\"{module}\""),
    ];
    if build == KernelBuild::Sm80 {
        rustflags.extend(["--cfg".to_owned(), "kernels_sm80".to_owned()]);
    }
    let status = cargo
        .command()
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
        .env("CARGO_ENCODED_RUSTFLAGS", rustflags.join("\x1f"))
        // Settings of an outer build (clippy's wrapper, a host target dir, host rustflags)
        // must not leak into the device build.
        .env_remove("RUSTFLAGS")
        .env_remove("RUSTC_WRAPPER")
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("CARGO_BUILD_TARGET")
        .status()
        .map_err(|e| format!("could not run {}: {e}", cargo.program.display()))?;
    if !status.success() {
        return Err(format!(
            "building kernels-gpu ({module}, {}) for nvptx64 failed ({status})",
            build.arch()
        ));
    }
    Ok(target_dir
        .join("nvptx64-nvidia-cuda")
        .join("release")
        .join("kernels_gpu.ptx"))
}

/// Where `cargo xtask fetch-ptxas` unpacks `ptxas`.
pub fn fetched_ptxas(workspace: &Path) -> PathBuf {
    workspace
        .join("target")
        .join("ptxas")
        .join("bin")
        .join("ptxas")
}

/// The `ptxas` to compile native code with: `$PTXAS` (a path, or a name looked up on `PATH`),
/// then `$CUDA_HOME/bin` (or `$CUDA_PATH/bin`), `PATH`, `/usr/local/cuda/bin`, and last the one
/// `cargo xtask fetch-ptxas` brings. `None` when there is none (`PTXAS=` set empty also means
/// none).
pub fn find_ptxas(workspace: &Path) -> Option<PathBuf> {
    let on_path = |name: &std::ffi::OsStr| {
        std::env::var_os("PATH")
            .into_iter()
            .flat_map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
            .map(|dir| dir.join(name))
            .find(|p| p.is_file())
    };
    if let Some(chosen) = std::env::var_os("PTXAS") {
        if chosen.is_empty() {
            return None;
        }
        let path = PathBuf::from(&chosen);
        let bare_name = path.components().count() == 1 && !path.is_file();
        return Some(if bare_name {
            on_path(&chosen).unwrap_or(path)
        } else {
            path
        });
    }
    let toolkits = ["CUDA_HOME", "CUDA_PATH"]
        .into_iter()
        .filter_map(std::env::var_os)
        .map(|home| PathBuf::from(home).join("bin").join("ptxas"));
    toolkits
        .chain(on_path("ptxas".as_ref()))
        .chain([
            PathBuf::from("/usr/local/cuda/bin/ptxas"),
            fetched_ptxas(workspace),
        ])
        .find(|p| p.is_file())
}

/// Compiles every `<module>.<arch>.ptx` of `dest_dir` (from [`build_all_ptx`]) with `ptxas`
/// for the architectures its build serves, into `dest_dir/<module>.<arch>.cubin`. Results are
/// kept in `target/cubins`, named by a hash of the PTX, the architecture and the `ptxas`
/// binary's path, size and modification time, so an unchanged module is not compiled again.
/// The compilations run at once; each writes a file of its own process before it takes its
/// place in the cache, so builds running side by side never read one half written.
pub fn compile_cubins(ptxas: &Path, workspace: &Path, dest_dir: &Path) -> Result<(), String> {
    let cache = workspace.join("target").join("cubins");
    std::fs::create_dir_all(&cache).map_err(|e| format!("creating {}: {e}", cache.display()))?;
    let ptxas_identity = std::fs::metadata(ptxas)
        .map(|m| (ptxas.to_path_buf(), m.len(), m.modified().ok()))
        .map_err(|e| format!("{}: {e}", ptxas.display()))?;
    let unique = format!(
        "{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    );
    let mut running: Vec<(Child, PathBuf, PathBuf, String)> = Vec::new();
    let mut copies = Vec::new();
    for build in KernelBuild::ALL {
        for module in MODULES.map(|m| m.name) {
            let ptx_path = dest_dir.join(build.ptx_file(module));
            let ptx = std::fs::read(&ptx_path)
                .map_err(|e| format!("reading {}: {e}", ptx_path.display()))?;
            for &arch in build.native_archs() {
                let mut hasher = DefaultHasher::new();
                (&ptx, arch, &ptxas_identity).hash(&mut hasher);
                let cached = cache.join(format!("{:016x}.cubin", hasher.finish()));
                let dest = dest_dir.join(cubin_file(module, arch));
                if !is_cubin(&cached) {
                    let partial = cached.with_extension(format!("{unique}.partial"));
                    let child = Command::new(ptxas)
                        .args(["-arch", arch, "-o"])
                        .arg(&partial)
                        .arg(&ptx_path)
                        .spawn()
                        .map_err(|e| format!("could not run {}: {e}", ptxas.display()))?;
                    running.push((child, partial, cached.clone(), format!("{module} {arch}")));
                }
                copies.push((cached, dest));
            }
        }
    }
    let mut failures = Vec::new();
    for (mut child, partial, cached, what) in running {
        match child.wait() {
            Ok(status) if status.success() => {
                // Another build may have put the same cubin there first: either copy will do.
                if std::fs::rename(&partial, &cached).is_err() && !is_cubin(&cached) {
                    failures.push(format!("{what}: could not store {}", cached.display()));
                }
                let _ = std::fs::remove_file(&partial);
            }
            Ok(status) => failures.push(format!("ptxas failed on {what} ({status})")),
            Err(e) => failures.push(format!("ptxas on {what}: {e}")),
        }
    }
    if !failures.is_empty() {
        return Err(failures.join("; "));
    }
    for (cached, dest) in copies {
        std::fs::copy(&cached, &dest).map_err(|e| format!("copying {}: {e}", cached.display()))?;
    }
    Ok(())
}

/// Whether `path` holds a whole cubin: an ELF file (ptxas writes its output in place, so a
/// cache entry that is not one was cut short).
fn is_cubin(path: &Path) -> bool {
    use std::io::Read;
    let mut magic = [0u8; 4];
    std::fs::File::open(path)
        .and_then(|mut file| file.read_exact(&mut magic))
        .is_ok_and(|()| magic == *b"\x7fELF")
}

#[cfg(test)]
mod tests {
    use super::{KernelCargo, minify_ptx, pinned_toolchain, with_launch_bounds};

    /// A folder of this test's own holding a `rust-toolchain.toml` that pins `channel`.
    fn workspace_pinning(channel: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "ptx-builder-{}-{}",
            std::process::id(),
            channel.replace('.', "-")
        ));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("rust-toolchain.toml"),
            format!(
                "[toolchain]\nchannel = \"{channel}\"\ncomponents = [\"rust-src\", \"clippy\"]\n"
            ),
        )
        .unwrap();
        dir
    }

    #[test]
    fn the_pinned_toolchain_is_read_from_the_toolchain_file() {
        let dir = workspace_pinning("nightly-2026-10-30");
        let (channel, components) = pinned_toolchain(&dir).unwrap();
        assert_eq!(channel, "nightly-2026-10-30");
        assert_eq!(components, ["rust-src", "clippy"]);
        let _ = std::fs::remove_dir_all(dir);
    }

    /// A pinned toolchain that is not installed is one line with the install command (where
    /// rustup is there to say so; without it the outer cargo is used).
    #[test]
    fn a_missing_pinned_toolchain_names_the_install_command() {
        let dir = workspace_pinning("nightly-1999-01-01");
        match KernelCargo::pinned(&dir, std::path::Path::new("cargo")) {
            Err(message) => {
                assert!(!message.contains('\n'), "{message}");
                assert!(
                    message.contains(
                        "rustup toolchain install nightly-1999-01-01 --profile minimal \
                         --component rust-src,llvm-tools-preview,llvm-bitcode-linker-preview"
                    ),
                    "{message}"
                );
            }
            Ok(cargo) => assert!(cargo.args.is_empty(), "{cargo:?}"),
        }
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn minified_ptx_keeps_every_instruction_and_drops_comments_and_blanks() {
        let ptx = "//\n// Generated by LLVM NVPTX Back-End\n//\n\n.version 7.8\n.target sm_90\n\n\
                   .visible .entry f(\n\t.param .u64 f_param_0\n)\n{\n\
                   \t.reg .b32 \t%r<3>;\n\t// begin inline asm\n\tgriddepcontrol.wait;\n\
                   \t// end inline asm\n$L__BB0_1: // =>This Inner Loop Header: Depth=1\n\
                   \tadd.s32 \t%r1, %r2, 1;   // trailing\n\t.file 1 \"/a//b.rs\"\n\tret;\n}\n";
        assert_eq!(
            minify_ptx(ptx),
            ".version 7.8\n.target sm_90\n.visible .entry f(\n.param .u64 p0\n)\n{\n\
             .reg .b32 %r<3>;\ngriddepcontrol.wait;\n$L0:\nadd.s32 %r1,%r2,1;\n\
             .file 1 \"/a//b.rs\"\nret;\n}\n"
        );
    }

    #[test]
    fn launch_bounds_follow_the_parameters_of_their_entries_only() {
        let ptx = ".visible .entry cross_entropy_bf16(\n.param .align 8 .b8 p0[208]\n)\n{\nret;\n}\n\
                   .visible .entry cross_entropy_totals_bf16(\n.param .align 8 .b8 p0[208]\n)\n\
                   {\nret;\n}\n";
        assert_eq!(
            with_launch_bounds(ptx).0,
            ".visible .entry cross_entropy_bf16(\n.param .align 8 .b8 p0[208]\n)\n\
             .maxntid 512,1,1\n.minnctapersm 2\n{\nret;\n}\n\
             .visible .entry cross_entropy_totals_bf16(\n.param .align 8 .b8 p0[208]\n)\n\
             {\nret;\n}\n"
        );
    }

    #[test]
    fn register_caps_follow_the_parameters_of_their_family_only() {
        let ptx = ".visible .entry op_block_xent_f32_p4_n8(\n.param .align 8 .b8 p0[208]\n)\n\
                   {\nret;\n}\n.visible .entry op_block_fwd_f32_p4_n8(\n.param .b64 p0\n)\n\
                   {\nret;\n}\n";
        let (capped, families) = with_launch_bounds(ptx);
        assert_eq!(
            capped,
            ".visible .entry op_block_xent_f32_p4_n8(\n.param .align 8 .b8 p0[208]\n)\n\
             .maxnreg 64\n{\nret;\n}\n.visible .entry op_block_fwd_f32_p4_n8(\n\
             .param .b64 p0\n)\n{\nret;\n}\n"
        );
        assert_eq!(families, ["op_block_xent_"]);
    }

    /// Parameters and labels take short names in the function that declares them (and only
    /// there), and each anonymous shared symbol one name throughout the module.
    #[test]
    fn minified_ptx_shortens_parameter_and_shared_names_consistently() {
        let ptx = ".extern .shared .align 16 .b8 anon_$_ab12_$_3[];\n\
                   .extern .shared .align 16 .b8 anon_$_cd34_$_0[];\n\
                   .func (.param .b32 func_retval0) _RNvCs1_4core5panic(\n\
                   .param .b64 _RNvCs1_4core5panic_param_0\n)\n;\n\
                   .func _RNvCs2_4core4trap\n(\n.param .b64 _RNvCs2_4core4trap_param_0\n)\n;\n\
                   .visible .entry op_rows_fwd_f32_p4_l8_n2(\n\
                   .param .align 8 .b8 op_rows_fwd_f32_p4_l8_n2_param_0[168],\n\
                   .param .u32 op_rows_fwd_f32_p4_l8_n2_param_1\n)\n{\n\
                   ld.param.b64 %rd1, [op_rows_fwd_f32_p4_l8_n2_param_0+8];\n\
                   ld.param.b32 %r1, [op_rows_fwd_f32_p4_l8_n2_param_1];\n\
                   mov.u64 %rd2, anon_$_cd34_$_0;\nmov.u64 %rd3, anon_$_ab12_$_3;\n\
                   ld.param.b64 %rd4, [other_param_0];\n@%p1 bra $L__BB3_7;\n$L__BB3_2:\n\
                   bra.uni $L__BB3_2;\n$L__BB3_7:\nret;\n}\n";
        assert_eq!(
            minify_ptx(ptx),
            ".extern .shared .align 16 .b8 anon_0[];\n.extern .shared .align 16 .b8 anon_1[];\n\
             .func (.param .b32 func_retval0) _RNvCs1_4core5panic(\n.param .b64 p0\n)\n;\n\
             .func _RNvCs2_4core4trap\n(\n.param .b64 p0\n)\n;\n\
             .visible .entry op_rows_fwd_f32_p4_l8_n2(\n.param .align 8 .b8 p0[168],\n\
             .param .u32 p1\n)\n{\nld.param.b64 %rd1,[p0+8];\nld.param.b32 %r1,[p1];\n\
             mov.u64 %rd2,anon_1;\nmov.u64 %rd3,anon_0;\nld.param.b64 %rd4,[other_param_0];\n\
             @%p1 bra $L0;\n$L1:\nbra.uni $L1;\n$L0:\nret;\n}\n"
        );
    }
}
