//! The embedded kernel modules (one enum names them all), which build and image of them a
//! device loads, and, for a loaded module, a handle for each of its entries, looked up once,
//! and the occupancy queries the planner asks of them.

use std::collections::HashMap;
use std::ffi::c_int;

use cust::module::Module;
use cust::sys;
use kernels_gpu::launch::cross_entropy::CrossEntropyKind;
use kernels_gpu::launch::ops::{DType, OpKernelShape};

use super::driver::{self, DeviceInfo};
use crate::error::{CudaContext, Error, Result};
use crate::plan::{self, Entry};

/// The code embedded for one module: the PTX of every kernel build (in the order of
/// [`KernelBuild::ALL`]), and the cubins `ptxas` compiled from them at build time (none where
/// the build found no `ptxas`).
#[derive(Debug)]
pub(crate) struct ModuleImages {
    pub ptx: [&'static str; KernelBuild::ALL.len()],
    /// `(architecture, cubin)`: `("sm_90", …)` from the sm_90 PTX, `("sm_80", …)` and
    /// `("sm_89", …)` from the sm_80 PTX.
    pub cubins: &'static [(&'static str, &'static [u8])],
}

// The module table, from ptx-builder's lists of modules and builds: `MODULE_COUNT`,
// `ModuleId::{ALL, index, name}`, `KernelBuild::{ALL, index, name}`, `MODULE_IMAGES`. Written
// by build.rs. A table of loaded modules is `[Option<LoadedModule>; MODULE_COUNT]`, indexed by
// `ModuleId::index`.
include!(concat!(env!("OUT_DIR"), "/images.rs"));

/// The environment variable that chooses the kernel build ([`KernelBuild::from_name`]), as
/// [`crate::Softmax::new`] reads it: `sm_80` runs the Ampere build on any GPU from 8.0 on.
pub const KERNEL_BUILD_ENV: &str = "SOFTMAX_KERNEL_BUILD";

/// Which build of the kernels an instance loads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum KernelBuild {
    /// For compute capability 9.0 and later: kernels may overlap the previous grid's tail
    /// (programmatic dependent launch), and few wide rows may take a thread-block cluster each.
    Sm90,
    /// For every GPU from compute capability 8.0 (Ampere, Ada) on: neither of those.
    Sm80,
}

impl KernelBuild {
    /// The build a device runs by default: [`KernelBuild::Sm90`] from 9.0 on, else
    /// [`KernelBuild::Sm80`]; below 8.0, [`Error::UnsupportedDevice`].
    pub fn native_for(device: &DeviceInfo) -> Result<KernelBuild> {
        match device.compute_capability {
            (major, _) if major >= 9 => Ok(KernelBuild::Sm90),
            (8, _) => Ok(KernelBuild::Sm80),
            _ => Err(unsupported(
                device,
                "the kernels need compute capability 8.0 (Ampere) or later",
            )),
        }
    }

    /// The build [`KernelBuild::name`] spells `name` (`sm_80` or `sm_90`).
    pub fn from_name(name: &str) -> Option<KernelBuild> {
        KernelBuild::ALL
            .into_iter()
            .find(|build| build.name() == name)
    }

    /// The build [`KERNEL_BUILD_ENV`] asks for, if set (and not empty).
    pub(crate) fn from_env() -> Result<Option<KernelBuild>> {
        let Some(value) = std::env::var_os(KERNEL_BUILD_ENV).filter(|v| !v.is_empty()) else {
            return Ok(None);
        };
        value
            .to_str()
            .and_then(KernelBuild::from_name)
            .map(Some)
            .ok_or_else(|| Error::UnknownKernelBuild {
                variable: KERNEL_BUILD_ENV,
                value: value.to_string_lossy().into_owned(),
            })
    }

    /// `self` if `device` can run it ([`KernelBuild::Sm90`] needs 9.0, every build 8.0).
    pub(crate) fn checked_for(self, device: &DeviceInfo) -> Result<KernelBuild> {
        let native = KernelBuild::native_for(device)?;
        if self == KernelBuild::Sm90 && native != KernelBuild::Sm90 {
            return Err(unsupported(
                device,
                "the sm_90 kernel build needs compute capability 9.0 or later",
            ));
        }
        Ok(self)
    }

    /// Whether launches may overlap the previous grid's tail and use thread-block clusters.
    pub(crate) fn hopper_features(self) -> bool {
        self == KernelBuild::Sm90
    }
}

impl std::fmt::Display for KernelBuild {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

fn unsupported(device: &DeviceInfo, why: &str) -> Error {
    let (major, minor) = device.compute_capability;
    Error::UnsupportedDevice {
        device: device.name.clone(),
        major,
        minor,
        why: why.into(),
    }
}

/// What a module loads as: native code for one architecture, or PTX the driver compiles.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelImage {
    /// A cubin `ptxas` made at build time for this architecture (`sm_90`, say).
    Native(&'static str),
    /// PTX of this build, compiled by the driver when the module loads (its JIT cache keeps
    /// the result between processes unless disabled).
    Ptx(KernelBuild),
}

impl std::fmt::Display for KernelImage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KernelImage::Native(arch) => write!(f, "{arch} cubin"),
            KernelImage::Ptx(build) => write!(f, "{build} PTX (compiled by the driver)"),
        }
    }
}

/// One module the library embeds: `kernels-gpu` built with one `kernels_module` cfg (the
/// table in ptx-builder's `MODULES`; build.rs generates `ALL`, `index` and `name`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum ModuleId {
    /// The f32 softmax variants (the seeds and the production kernels).
    Softmax,
    /// The operation kernels of one input type, and that type's row-slices entries when it is
    /// a 16-bit type.
    Operations(DType),
}

impl ModuleId {
    pub fn images(self) -> &'static ModuleImages {
        &MODULE_IMAGES[self.index()]
    }

    /// The PTX of `build`.
    pub fn ptx(self, build: KernelBuild) -> &'static str {
        self.images().ptx[build.index()]
    }

    /// The image of `build` that a device of compute capability `(major, minor)` loads: the
    /// cubin made for it where there is one (an sm_80 cubin also runs on 8.6 and 8.7), else
    /// the build's PTX.
    pub fn image_for(self, build: KernelBuild, (major, minor): (u32, u32)) -> KernelImage {
        let arch = match (build, major, minor) {
            (KernelBuild::Sm90, 9, 0) => Some("sm_90"),
            (KernelBuild::Sm80, 8, 9) => Some("sm_89"),
            (KernelBuild::Sm80, 8, _) => Some("sm_80"),
            _ => None,
        };
        arch.and_then(|arch| self.images().cubins.iter().find(|(a, _)| *a == arch))
            .map_or(KernelImage::Ptx(build), |(arch, _)| {
                KernelImage::Native(arch)
            })
    }

    /// Every entry a plan can name in this module's `build`.
    pub fn entries(self, build: KernelBuild) -> Vec<Entry> {
        match self {
            ModuleId::Softmax => plan::softmax_module_entries(build.hopper_features()),
            ModuleId::Operations(input) => plan::operation_module_entries(input),
        }
    }
}

impl Entry {
    /// The module that holds this entry.
    pub(crate) fn module(self) -> ModuleId {
        match self {
            Entry::RowSlices(name) if name.dtype != DType::F32 => ModuleId::Operations(name.dtype),
            Entry::Operation(name) => ModuleId::Operations(name.input),
            Entry::CrossEntropy(name) => ModuleId::Operations(name.dtype),
            Entry::Sampling(name) => ModuleId::Operations(name.dtype),
            _ => ModuleId::Softmax,
        }
    }

    /// Entries that may take more dynamic shared memory than the default 48 KiB.
    fn takes_large_shared_memory(self) -> bool {
        matches!(
            self,
            Entry::RowSlices(_)
                | Entry::RowCluster { .. }
                | Entry::CrossEntropy(_)
                | Entry::Sampling(_)
        )
    }

    /// Whether the planner may launch this entry in clusters of a row's slices (up to
    /// [`MAX_CLUSTER_BLOCKS`](kernels_gpu::launch::MAX_CLUSTER_BLOCKS), above the portable 8).
    fn runs_in_clusters(self) -> bool {
        match self {
            Entry::RowCluster { .. } | Entry::BlockRegisters(_) => true,
            Entry::Operation(instance) => matches!(instance.shape, OpKernelShape::Block { .. }),
            Entry::CrossEntropy(name) => name.kind == CrossEntropyKind::Rows,
            _ => false,
        }
    }
}

/// One loaded module and a handle for each entry.
#[derive(Debug)]
pub(crate) struct LoadedModule {
    id: ModuleId,
    functions: HashMap<Entry, sys::CUfunction>,
    /// Keeps the functions valid; dropped after them.
    _module: Module,
}

impl LoadedModule {
    /// Loads `id`'s `image` of `build` (from PTX, the driver compiles it for the current
    /// context's device), resolves every entry (a missing one is an error now rather than at
    /// the first launch) and lets the entries that need it use `max_shared_per_block` bytes of
    /// dynamic shared memory and, with clusters, clusters above the portable 8 blocks.
    pub fn load(
        id: ModuleId,
        build: KernelBuild,
        image: KernelImage,
        max_shared_per_block: u32,
    ) -> Result<Self> {
        let module = match image {
            KernelImage::Native(arch) => {
                let (_, cubin) = id
                    .images()
                    .cubins
                    .iter()
                    .find(|(a, _)| *a == arch)
                    .ok_or_else(|| Error::Unsupported {
                        variant: format!("{arch} cubin"),
                        rows: 0,
                        cols: 0,
                        why: "not embedded in this build".into(),
                    })?;
                Module::from_cubin(cubin, &[]).during("loading a cubin module")?
            }
            KernelImage::Ptx(ptx_build) => {
                Module::from_ptx(id.ptx(ptx_build), &[]).during("loading a PTX module")?
            }
        };
        let clusters = build.hopper_features();
        let mut functions = HashMap::new();
        for entry in id.entries(build) {
            let function = module
                .get_function(entry.to_string())
                .during("looking up a kernel entry in the module")?;
            functions.insert(entry, function.to_raw());
        }
        let loaded = LoadedModule {
            id,
            functions,
            _module: module,
        };
        for (&entry, &function) in &loaded.functions {
            if entry.takes_large_shared_memory() {
                driver::set_attribute(
                    function,
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
                        as c_int,
                    max_shared_per_block as c_int,
                    "raising a kernel's shared-memory limit",
                )?;
            }
            if clusters && entry.runs_in_clusters() {
                driver::set_attribute(
                    function,
                    driver::FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED,
                    1,
                    "allowing non-portable cluster sizes",
                )?;
            }
        }
        Ok(loaded)
    }

    /// The handle of `entry` (an error, not a panic, if the module does not hold it).
    pub fn function(&self, entry: Entry) -> Result<sys::CUfunction> {
        self.functions
            .get(&entry)
            .copied()
            .ok_or_else(|| Error::Unsupported {
                variant: entry.to_string(),
                rows: 0,
                cols: 0,
                why: format!("the kernel entry is not in the {} module", self.id.name()),
            })
    }

    /// Blocks of `entry` resident per multiprocessor at this block size and shared memory.
    pub fn blocks_per_sm(&self, entry: Entry, threads: u32, shared_bytes: u32) -> Result<u32> {
        driver::blocks_per_sm(self.function(entry)?, threads, shared_bytes)
    }

    /// Clusters of `cluster` blocks of `entry` (with this block size and dynamic shared
    /// memory) that can be active on the device at once; 0 when not even one can be
    /// scheduled.
    pub fn active_clusters(
        &self,
        entry: Entry,
        threads: u32,
        shared_bytes: u32,
        cluster: u32,
    ) -> Result<u32> {
        driver::active_clusters(self.function(entry)?, threads, shared_bytes, cluster)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kernels_gpu::launch::cross_entropy::CrossEntropyEntry;
    use kernels_gpu::launch::ops::Direction;

    /// Whether a line of an entry's body may come before its `griddepcontrol.wait`: the
    /// parameter list, declarations, braces, comments, parameter loads and register arithmetic
    /// without a guard. Any label, branch, call, exit or other memory access is refused, as is
    /// anything else the list does not know (extend it when a new harmless opcode shows up).
    fn may_precede_the_wait(line: &str) -> bool {
        let line = line.trim();
        if line.is_empty()
            || line.starts_with("//")
            || line.starts_with('.')
            || line.starts_with(')')
            || line == "{"
        {
            return true;
        }
        let opcode = line.split_whitespace().next().unwrap_or("");
        let base = opcode.split('.').next().unwrap_or("");
        (opcode.starts_with("ld.param."))
            || [
                "mov", "cvta", "cvt", "shr", "shl", "and", "or", "add", "sub", "mul", "mad",
            ]
            .contains(&base)
    }

    #[test]
    fn only_parameter_loads_and_arithmetic_may_precede_the_wait() {
        assert!(may_precede_the_wait(
            "\tld.param.b64 \t%rd41, [entry_param_0];"
        ));
        assert!(may_precede_the_wait("\tcvta.to.global.u64 \t%rd1, %rd41;"));
        assert!(may_precede_the_wait("\t.reg .b32 \t%r<638>;"));
        assert!(may_precede_the_wait("\t// begin inline asm"));
        for line in [
            "\tld.global.b16 %rs1, [%rd59];",
            "\tld.u32 %r1, [%rd2];",
            "\tst.global.v4.f32 [%rd3], {%r1, %r2, %r3, %r4};",
            "\tatom.acq_rel.gpu.add.u32 %r1, [%rd2], %r3;",
            "\tcp.async.ca.shared.global [%rd1], [%rd2], 16;",
            "\tprefetch.global.L2 [%rd1];",
            "\t@%p1 bra \t$L__BB0_2;",
            "$L__BB0_2:",
            "\tcall.uni \tpanic, (param0);",
            "\tret;",
            "\t@%p1 add.s32 %r1, %r2, %r3;",
        ] {
            assert!(!may_precede_the_wait(line), "{line}");
        }
    }

    /// The entries of one PTX module (names) and, for each that does not start with the wait,
    /// why.
    fn entries_and_faults(ptx: &str) -> (Vec<String>, Vec<String>) {
        let (mut names, mut faults) = (Vec::new(), Vec::new());
        for entry in ptx.split(".entry ").skip(1) {
            let name = entry
                .split('(')
                .next()
                .unwrap_or_default()
                .trim()
                .to_owned();
            let body = &entry[..entry.find("\n}").unwrap_or(entry.len())];
            let lines: Vec<&str> = body.lines().skip(1).collect();
            match lines
                .iter()
                .position(|line| line.trim() == "griddepcontrol.wait;")
            {
                None => faults.push(format!("{name} never executes griddepcontrol.wait")),
                Some(wait) => {
                    if let Some(line) = lines[..wait].iter().find(|l| !may_precede_the_wait(l)) {
                        faults.push(format!("{name}: `{}` comes before the wait", line.trim()));
                    }
                }
            }
            names.push(name);
        }
        (names, faults)
    }

    #[test]
    fn entries_that_do_not_wait_first_are_found() {
        let ptx = ".visible .entry good(\n\t.param .u64 good_param_0\n)\n{\n\t.reg .b64 %rd<3>;\n\
                   \tld.param.b64 %rd1, [good_param_0];\n\tgriddepcontrol.wait;\n\
                   \tld.global.b32 %r1, [%rd1];\n\tret;\n}\n\
                   .visible .entry late(\n\t.param .u64 late_param_0\n)\n{\n\
                   \t@%p1 bra $L__BB1_2;\n\tgriddepcontrol.wait;\n$L__BB1_2:\n\tret;\n}\n\
                   .visible .entry never(\n\t.param .u64 never_param_0\n)\n{\n\tret;\n}\n";
        let (names, faults) = entries_and_faults(ptx);
        assert_eq!(names, ["good", "late", "never"]);
        assert_eq!(faults.len(), 2, "{faults:?}");
        assert!(faults[0].starts_with("late: `@%p1 bra"), "{faults:?}");
        assert!(faults[1].starts_with("never never executes"), "{faults:?}");
    }

    #[test]
    fn every_entry_belongs_to_the_module_that_lists_it() {
        for module in ModuleId::ALL {
            for build in [KernelBuild::Sm90, KernelBuild::Sm80] {
                for entry in module.entries(build) {
                    assert_eq!(entry.module(), module, "{entry}");
                }
            }
        }
    }

    #[test]
    fn every_entry_awaits_the_previous_grid_before_anything_else() {
        // Launches other than cooperative ones allow programmatic overlap with the previous
        // kernel in the stream; that is only sound if each kernel waits before it reads or
        // writes memory. So every entry the host loads must execute the wait unconditionally,
        // in its first block, before any branch or memory access.
        for module in ModuleId::ALL {
            let (names, faults) = entries_and_faults(module.ptx(KernelBuild::Sm90));
            assert!(faults.is_empty(), "{faults:#?}");
            for entry in module.entries(KernelBuild::Sm90) {
                let name = entry.to_string();
                assert!(
                    names.contains(&name),
                    "{name} is loaded but not in its module"
                );
            }
        }
    }

    #[test]
    fn the_sm_80_build_has_every_entry_it_lists_and_no_hopper_instruction() {
        for module in ModuleId::ALL {
            let ptx = module.ptx(KernelBuild::Sm80);
            assert!(ptx.contains("\n.target sm_80"), "{module:?}");
            for hopper in ["griddepcontrol", "barrier.cluster", "mapa", "%cluster_"] {
                assert!(!ptx.contains(hopper), "{module:?} holds {hopper}");
            }
            let (names, _) = entries_and_faults(ptx);
            for entry in module.entries(KernelBuild::Sm80) {
                let name = entry.to_string();
                assert!(
                    names.contains(&name),
                    "{name} is loaded but not in its module"
                );
            }
            let clusters = module
                .entries(KernelBuild::Sm80)
                .into_iter()
                .any(|entry| matches!(entry, Entry::RowCluster { .. }));
            assert!(!clusters, "the sm_80 build lists row-cluster entries");
        }
    }

    #[test]
    fn each_device_loads_the_image_made_for_it() {
        let with_cubins = !ModuleId::Softmax.images().cubins.is_empty();
        let native = |arch| {
            if with_cubins {
                KernelImage::Native(arch)
            } else {
                KernelImage::Ptx(if arch == "sm_90" {
                    KernelBuild::Sm90
                } else {
                    KernelBuild::Sm80
                })
            }
        };
        let image = |build, capability| ModuleId::Softmax.image_for(build, capability);
        assert_eq!(image(KernelBuild::Sm90, (9, 0)), native("sm_90"));
        assert_eq!(image(KernelBuild::Sm80, (8, 0)), native("sm_80"));
        assert_eq!(image(KernelBuild::Sm80, (8, 6)), native("sm_80"));
        assert_eq!(image(KernelBuild::Sm80, (8, 9)), native("sm_89"));
        // No cubin runs there: the driver compiles the build's PTX.
        assert_eq!(
            image(KernelBuild::Sm90, (10, 0)),
            KernelImage::Ptx(KernelBuild::Sm90)
        );
        assert_eq!(
            image(KernelBuild::Sm80, (9, 0)),
            KernelImage::Ptx(KernelBuild::Sm80)
        );
        // Every module carries the same images.
        for module in ModuleId::ALL {
            let archs: Vec<&str> = module.images().cubins.iter().map(|(a, _)| *a).collect();
            let expected: &[&str] = if with_cubins {
                &["sm_90", "sm_80", "sm_89"]
            } else {
                &[]
            };
            assert_eq!(archs, expected, "{module:?}");
        }
    }

    fn device(capability: (u32, u32)) -> DeviceInfo {
        DeviceInfo {
            name: "a GPU".into(),
            compute_capability: capability,
            ..crate::runtime::driver::fixtures::h200()
        }
    }

    #[test]
    fn devices_choose_their_build_and_older_ones_are_refused_by_name() {
        let native = |capability| KernelBuild::native_for(&device(capability));
        assert_eq!(native((9, 0)).unwrap(), KernelBuild::Sm90);
        assert_eq!(native((12, 0)).unwrap(), KernelBuild::Sm90);
        assert_eq!(native((8, 9)).unwrap(), KernelBuild::Sm80);
        assert_eq!(native((8, 0)).unwrap(), KernelBuild::Sm80);
        match native((7, 5)) {
            Err(
                error @ Error::UnsupportedDevice {
                    major: 7, minor: 5, ..
                },
            ) => {
                assert!(
                    error.to_string().contains("compute capability 7.5"),
                    "{error}"
                );
            }
            other => panic!("7.5 gave {other:?}"),
        }
        assert!(KernelBuild::Sm80.checked_for(&device((9, 0))).is_ok());
        assert!(matches!(
            KernelBuild::Sm90.checked_for(&device((8, 6))),
            Err(Error::UnsupportedDevice {
                major: 8,
                minor: 6,
                ..
            })
        ));
        assert_eq!(KernelBuild::from_name("sm_80"), Some(KernelBuild::Sm80));
        assert_eq!(KernelBuild::from_name("sm_90"), Some(KernelBuild::Sm90));
        assert_eq!(KernelBuild::from_name("sm_86"), None);
    }

    #[test]
    fn both_builds_target_their_architecture_without_local_memory() {
        for module in ModuleId::ALL {
            for build in [KernelBuild::Sm90, KernelBuild::Sm80] {
                let ptx = module.ptx(build);
                assert!(
                    ptx.contains(&format!(".target {build}")),
                    "{module:?} {build}"
                );
                assert!(
                    !ptx.contains("__local_depot"),
                    "{module:?} {build}: a kernel keeps an array in local memory"
                );
                assert!(
                    ptx.contains("ld.global.v4"),
                    "{module:?} {build}: the vector kernels must use 16-byte loads"
                );
            }
        }
    }

    /// The parameter declarations of entry `name` in `ptx`.
    fn entry_parameters<'a>(ptx: &'a str, name: &str) -> Vec<&'a str> {
        let header = format!(".entry {name}(");
        let Some(start) = ptx.find(&header) else {
            return Vec::new();
        };
        let list = &ptx[start + header.len()..];
        let list = &list[..list.find(')').unwrap_or(list.len())];
        list.lines()
            .map(|line| line.trim().trim_end_matches(','))
            .filter(|line| line.starts_with(".param"))
            .collect()
    }

    /// Every entry takes what the launch path passes it: an operation entry one
    /// `RowOpParams`, a cross-entropy entry one `CrossEntropyParams`, every other entry each
    /// field of `SoftmaxParams` as a parameter of the field's size, in field order.
    #[test]
    fn every_entry_takes_the_parameters_the_launch_passes() {
        use kernels_gpu::launch::ops::RowOpParams;
        use kernels_gpu::launch::softmax::SoftmaxParams;
        let probe = SoftmaxParams::default();
        let field_bytes = {
            let mut copy = probe;
            let pointers = copy.argument_pointers();
            let base = (&raw mut copy).cast::<u8>();
            let mut offsets: Vec<usize> = pointers
                .iter()
                .map(|p| p.cast::<u8>() as usize - base as usize)
                .collect();
            offsets.push(std::mem::size_of::<SoftmaxParams>());
            offsets
                .windows(2)
                .map(|pair| pair[1] - pair[0])
                .collect::<Vec<_>>()
        };
        for module in ModuleId::ALL {
            for build in KernelBuild::ALL {
                let ptx = module.ptx(build);
                for entry in module.entries(build) {
                    let parameters = entry_parameters(ptx, &entry.to_string());
                    let whole = match entry {
                        // The cross-entropy block entries take the cross-entropy's struct.
                        Entry::Operation(k) if k.direction != Direction::CrossEntropy => {
                            Some(std::mem::size_of::<RowOpParams>())
                        }
                        Entry::Operation(_) | Entry::CrossEntropy(_) => Some(std::mem::size_of::<
                            kernels_gpu::launch::cross_entropy::CrossEntropyParams,
                        >(
                        )),
                        Entry::Sampling(_) => Some(std::mem::size_of::<
                            kernels_gpu::launch::sampling::SamplingParams,
                        >()),
                        _ => None,
                    };
                    if let Some(bytes) = whole {
                        let expected = format!(".param .align 8 .b8 p0[{bytes}]");
                        assert_eq!(parameters, [expected.as_str()], "{entry} ({build})");
                        continue;
                    }
                    assert_eq!(parameters.len(), SoftmaxParams::FIELDS, "{entry} ({build})");
                    for (i, (parameter, &bytes)) in parameters.iter().zip(&field_bytes).enumerate()
                    {
                        // Fields are packed without padding but for alignment, which a
                        // 32-bit field followed by a 64-bit one would show.
                        let width = if parameter.contains(".b64") || parameter.contains(".u64") {
                            8
                        } else {
                            4
                        };
                        assert!(
                            parameter.ends_with(&format!(" p{i}")) && width <= bytes,
                            "{entry} ({build}): parameter {i} is `{parameter}`, field of {bytes} bytes"
                        );
                    }
                }
            }
        }
    }

    /// The family of `entry` and the file that generates it, for docs/entries.md.
    fn family_and_source(entry: Entry) -> (&'static str, &'static str) {
        match entry {
            Entry::UnfusedRowMax
            | Entry::UnfusedSubtract
            | Entry::UnfusedExp
            | Entry::UnfusedRowSum
            | Entry::UnfusedDivide => ("unfused (seed)", "seeds/unfused.rs"),
            Entry::ThreadPerRowNaive | Entry::ThreadPerRowOnline => {
                ("thread per row (seed)", "seeds/thread_per_row.rs")
            }
            Entry::WarpPerRowOnline => ("warp per row (seed)", "seeds/warp_per_row.rs"),
            Entry::BlockPerRowSmem => (
                "block per row, shared memory (seed)",
                "seeds/block_per_row_smem.rs",
            ),
            Entry::RowsInRegisters(_) => ("rows in registers", "production/rows_in_registers.rs"),
            Entry::BlockRegisters(_) => ("block registers", "production/block_registers.rs"),
            Entry::RowSlices(_) => ("row slices", "production/row_slices.rs"),
            Entry::RowCluster { .. } => ("row cluster", "production/row_cluster.rs"),
            Entry::Operation(instance) => match instance.shape {
                _ if instance.direction == Direction::CrossEntropy => (
                    "cross-entropy, block per row or slice",
                    "ops/cross_entropy_block.rs",
                ),
                OpKernelShape::Rows { .. } => ("operation, group per row", "ops/rows.rs"),
                OpKernelShape::Block { .. } => {
                    ("operation, block per row or slice", "ops/block.rs")
                }
            },
            Entry::CrossEntropy(CrossEntropyEntry {
                kind: CrossEntropyKind::Slices,
                ..
            }) => ("cross-entropy, row slices", "ops/cross_entropy_slices.rs"),
            Entry::CrossEntropy(_) => ("cross-entropy", "ops/cross_entropy.rs"),
            Entry::Sampling(_) => ("sampling", "ops/sampling.rs"),
        }
    }

    /// docs/entries.md: every entry of every module, with its module, the builds that hold
    /// it, its family and the file that generates it.
    fn entry_listing() -> String {
        let mut listing = String::from(
            "# Kernel entries\n\n\
             Every PTX entry the library embeds, by module, in the planner's order. Generated \
             from the host's entry tables (whose names come from `entry_name_pieces!` in \
             `kernels-gpu/src/launch/mod.rs`, as the kernels' exported names do) by `cargo \
             xtask entries`; a host test fails when this file is stale. Sources are under \
             `kernels-gpu/src/`.\n\n\
             | entry | module | builds | family | source |\n|---|---|---|---|---|\n",
        );
        for module in ModuleId::ALL {
            let everywhere = module.entries(KernelBuild::Sm80);
            for entry in module.entries(KernelBuild::Sm90) {
                let builds = if everywhere.contains(&entry) {
                    "sm_90, sm_80"
                } else {
                    "sm_90"
                };
                let (family, source) = family_and_source(entry);
                listing += &format!(
                    "| `{entry}` | {} | {builds} | {family} | `{source}` |\n",
                    module.name()
                );
            }
        }
        listing
    }

    /// The environment variable with which the listing test rewrites docs/entries.md.
    const WRITE_ENTRIES_ENV: &str = "SOFTMAX_WRITE_ENTRIES";

    #[test]
    fn the_entry_listing_is_current() {
        let workspace = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("host/ sits in the workspace");
        for module in ModuleId::ALL {
            for entry in module.entries(KernelBuild::Sm90) {
                let (_, source) = family_and_source(entry);
                let file = workspace.join("kernels-gpu/src").join(source);
                assert!(file.is_file(), "{entry}: {} is missing", file.display());
            }
        }
        let path = workspace.join("docs/entries.md");
        let listing = entry_listing();
        if std::env::var_os(WRITE_ENTRIES_ENV).is_some() {
            std::fs::write(&path, &listing).unwrap();
        }
        let written = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            written == listing,
            "docs/entries.md is stale: regenerate it with `cargo xtask entries`"
        );
    }

    /// The instance tables (which the host plans from) and the entries the kernel crate
    /// generates (from its own lists) name the same kernels, in both builds: no entry is
    /// missing, none is extra (instances that differ only in their width share an entry).
    #[test]
    fn each_module_holds_exactly_the_entries_the_planner_names() {
        for module in ModuleId::ALL {
            for build in [KernelBuild::Sm90, KernelBuild::Sm80] {
                let ptx = module.ptx(build);
                let names: std::collections::BTreeSet<String> =
                    module.entries(build).iter().map(Entry::to_string).collect();
                for name in &names {
                    assert!(ptx.contains(&format!(".entry {name}(")), "{name} missing");
                }
                assert_eq!(
                    ptx.matches(".entry ").count(),
                    names.len(),
                    "{module:?} {build}: extra entries"
                );
            }
        }
    }
}
