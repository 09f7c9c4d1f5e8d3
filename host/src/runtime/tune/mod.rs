//! The tuning cache behind `Variant::Auto`: which production variant was fastest for a device,
//! a rounded shape and a buffer layout, persisted to a JSON file.
//!
//! The file tolerates being missing (empty cache), corrupt or truncated (ignored with a
//! warning, rewritten at the next save) and old: it records a checksum of the variant and
//! kernel names, and entries made for another set of kernels are dropped. An entry that names
//! anything but a production variant (a seed variant, `auto`, a name this build does not know)
//! is dropped on its own, with a warning: `Auto` may only run what it could have chosen.
//!
//! Memory never claims what the file lacks: an inserted entry counts once [`TuneCache::save`]
//! has written it, and a failed save drops what was inserted since the last one (the error
//! goes to the caller). Each save writes a temporary file of its own and renames it over the
//! cache, so processes saving at once leave one whole file (the last rename wins).

#[cfg(feature = "tune-cache")]
mod file;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::shape::Shape;
use crate::variant::Variant;

#[cfg(feature = "tune-cache")]
pub use file::catalog;

/// A device, a rounded shape (rows to the next power of two, columns to a multiple of 64,
/// exact up to 256) and the two layout facts that decide what each production kernel can run.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "tune-cache", derive(serde::Serialize, serde::Deserialize))]
pub struct TuneKey {
    pub device: String,
    pub rows_bucket: usize,
    pub cols_bucket: usize,
    /// Input and output allow 16-byte accesses (the rows-in-registers capacity depends on it).
    pub aligned: bool,
    /// Input and output are misaligned alike modulo 16 bytes (the kernels that peel a row's
    /// unaligned head depend on it).
    pub peelable: bool,
}

impl TuneKey {
    /// The key of `shape` on `device` for buffers that allow 16-byte accesses (`aligned`) and
    /// whose input and output are misaligned alike (`peelable`).
    pub fn for_layout(device: &str, shape: Shape, aligned: bool, peelable: bool) -> Self {
        let cols_bucket = if shape.cols() <= 256 {
            shape.cols()
        } else {
            shape.cols().div_ceil(64) * 64
        };
        TuneKey {
            device: device.to_owned(),
            rows_bucket: shape.rows().next_power_of_two(),
            cols_bucket,
            aligned,
            peelable,
        }
    }
}

/// Whether a tuned choice may name `variant`: the production kernels `Variant::Auto` picks
/// among, each a concrete kernel family.
pub fn is_tunable(variant: Variant) -> bool {
    Variant::PRODUCTION.contains(&variant)
}

/// The tuned choices, and where they persist.
#[derive(Debug, Default)]
pub struct TuneCache {
    path: Option<PathBuf>,
    /// What the file holds (for an in-memory cache: everything inserted).
    entries: HashMap<TuneKey, Variant>,
    /// Inserted since the last save: they count once a save has written them.
    staged: HashMap<TuneKey, Variant>,
}

/// `$SOFTMAX_TUNE_CACHE`, else `$XDG_CACHE_HOME/softmax-rs/tune.json`, else
/// `$HOME/.cache/softmax-rs/tune.json`.
pub fn default_path() -> Option<PathBuf> {
    if let Some(path) = path_from_env() {
        return Some(path);
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| Path::new(&home).join(".cache")))?;
    Some(cache.join("softmax-rs").join("tune.json"))
}

/// The environment variable naming a tune cache file that `Variant::Auto` reads (see
/// [`crate::Softmax::with_tune_cache`]); without it, or set empty, `Auto` uses the built-in
/// dispatch alone.
pub const TUNE_CACHE_ENV: &str = "SOFTMAX_TUNE_CACHE";

/// The tune cache file the environment names: [`TUNE_CACHE_ENV`], where it is set and
/// not empty (an empty value means unset).
pub fn path_from_env() -> Option<PathBuf> {
    path_from(std::env::var_os(TUNE_CACHE_ENV))
}

/// The tune cache file a value of [`TUNE_CACHE_ENV`] names: none when unset or empty.
fn path_from(value: Option<std::ffi::OsString>) -> Option<PathBuf> {
    value.filter(|value| !value.is_empty()).map(Into::into)
}

/// Refuses a tune cache path that a save could not write: a folder, or a file whose nearest
/// existing folder cannot be written (tried by making and removing a file of this call's own,
/// named apart from every other thread's and process's). Nothing is created on the way.
fn check_writable(path: &Path) -> Result<()> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static PROBES: AtomicU64 = AtomicU64::new(0);
    let io = |source| Error::Io {
        what: format!("the tune cache {} cannot be written", path.display()),
        source,
    };
    if path.is_dir() {
        return Err(io(std::io::Error::other("it is a folder")));
    }
    let folder = path
        .ancestors()
        .skip(1)
        .map(|a| {
            if a.as_os_str().is_empty() {
                Path::new(".")
            } else {
                a
            }
        })
        .find(|a| a.exists())
        .unwrap_or(Path::new("."));
    if !folder.is_dir() {
        return Err(io(std::io::Error::other(format!(
            "{} is not a folder",
            folder.display()
        ))));
    }
    let probe = folder.join(format!(
        ".softmax-rs-probe-{}-{}",
        std::process::id(),
        PROBES.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::write(&probe, b"").map_err(io)?;
    std::fs::remove_file(&probe).map_err(io)
}

impl TuneCache {
    /// Loads the cache at `path` (none: in memory only). A file that cannot be used is
    /// ignored, and an entry that cannot be used dropped, with a warning on stderr; the file
    /// is rewritten at the next save. A path that could not be saved to (a folder, or a file
    /// in a folder that cannot be made or written) is [`Error::Io`] now, not after tuning.
    pub fn open(path: Option<PathBuf>) -> Result<Self> {
        if let Some(path) = &path {
            check_writable(path)?;
        }
        let entries = path.as_deref().map(Self::load).unwrap_or_default();
        Ok(TuneCache {
            path,
            entries,
            staged: HashMap::new(),
        })
    }

    /// The usable entries of the file at `path`, with a warning for what is not used.
    #[cfg(feature = "tune-cache")]
    fn load(path: &Path) -> HashMap<TuneKey, Variant> {
        match file::read(path) {
            Ok((entries, dropped)) => {
                for why in dropped {
                    eprintln!("softmax-rs: tune cache {}: {why}", path.display());
                }
                entries
            }
            Err(why) => {
                eprintln!(
                    "softmax-rs: ignoring tune cache {}: {why}; it will be rebuilt",
                    path.display()
                );
                HashMap::new()
            }
        }
    }

    /// Without the `tune-cache` feature there is no file format: the cache lives in memory.
    #[cfg(not(feature = "tune-cache"))]
    fn load(path: &Path) -> HashMap<TuneKey, Variant> {
        eprintln!(
            "softmax-rs: built without the tune-cache feature: {} is not read or written",
            path.display()
        );
        HashMap::new()
    }

    /// Whether no choice is recorded: `Auto` then skips building a key on every call.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The tuned choice for `key`, once saved.
    pub fn get(&self, key: &TuneKey) -> Option<Variant> {
        self.entries.get(key).copied()
    }

    /// Records `variant` for `key`; it counts from the next successful [`TuneCache::save`]
    /// (at once for an in-memory cache). A variant that is not a production one (see
    /// [`is_tunable`]) is not recorded, with a warning.
    pub fn insert(&mut self, key: TuneKey, variant: Variant) {
        if !is_tunable(variant) {
            eprintln!(
                "softmax-rs: not recording `{variant}` for {key:?}: not a production variant"
            );
            return;
        }
        if self.path.is_some() {
            self.staged.insert(key, variant);
        } else {
            self.entries.insert(key, variant);
        }
    }

    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// Writes the saved and the staged entries to the file (through a temporary file of this
    /// save's own and a rename, so a reader never sees half a file); the staged entries count
    /// from then on. If that fails, they are dropped and the error returned. Nothing to do for
    /// an in-memory cache.
    pub fn save(&mut self) -> Result<()> {
        let Some(path) = &self.path else {
            return Ok(());
        };
        let mut all = self.entries.clone();
        all.extend(self.staged.drain());
        #[cfg(feature = "tune-cache")]
        file::write_atomically(path, &all)?;
        #[cfg(not(feature = "tune-cache"))]
        let _ = path;
        self.entries = all;
        Ok(())
    }
}

#[cfg(test)]
mod path_tests {
    use super::*;

    #[test]
    fn an_empty_variable_means_no_tune_cache() {
        assert_eq!(path_from(None), None);
        assert_eq!(path_from(Some("".into())), None);
        assert_eq!(
            path_from(Some("/tmp/t.json".into())),
            Some("/tmp/t.json".into())
        );
    }

    /// A folder, or a path below a file, cannot be a tune cache; a path whose folders do not
    /// exist yet can, and checking it creates nothing.
    #[test]
    fn unwritable_tune_cache_paths_are_refused_when_opened() {
        let scratch = std::env::temp_dir().join(format!("tune-path-{}", std::process::id()));
        std::fs::create_dir_all(&scratch).unwrap();
        let file = scratch.join("a-file");
        std::fs::write(&file, b"").unwrap();
        assert!(matches!(
            TuneCache::open(Some(scratch.clone())),
            Err(Error::Io { .. })
        ));
        assert!(matches!(
            TuneCache::open(Some(file.join("tune.json"))),
            Err(Error::Io { .. })
        ));
        let nested = scratch.join("not").join("yet").join("tune.json");
        assert!(TuneCache::open(Some(nested)).is_ok());
        assert!(!scratch.join("not").exists());
        let _ = std::fs::remove_dir_all(scratch);
    }
}

#[cfg(all(test, feature = "tune-cache"))]
mod tests {
    use super::file::{self, FORMAT, catalog};
    use super::*;

    fn key(rows: usize, cols: usize) -> TuneKey {
        TuneKey::for_layout("nvidia-h200", Shape::new(rows, cols).unwrap(), true, true)
    }

    /// A folder of this test's own, removed when the guard drops (the test passed or not).
    struct ScratchDir(PathBuf);

    impl Drop for ScratchDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// A cache file path in a fresh scratch folder (not created yet), and the folder's guard.
    fn temp_path(name: &str) -> (ScratchDir, PathBuf) {
        let dir =
            std::env::temp_dir().join(format!("softmax-rs-tune-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = dir.join("tune.json");
        (ScratchDir(dir), path)
    }

    /// A file of this build's format and catalog with one entry per variant name.
    fn file_naming(variants: &[&str]) -> String {
        let entries: Vec<String> = variants
            .iter()
            .enumerate()
            .map(|(i, variant)| {
                format!(
                    r#"{{"device": "nvidia-h200", "rows_bucket": {}, "cols_bucket": 1024,
                        "aligned": true, "peelable": true, "variant": "{variant}"}}"#,
                    1 << i
                )
            })
            .collect();
        format!(
            r#"{{"format": {FORMAT}, "catalog": "{}", "entries": [{}]}}"#,
            catalog(),
            entries.join(",")
        )
    }

    #[test]
    fn shapes_round_into_buckets() {
        assert_eq!(key(100, 1000), key(128, 1024));
        assert_ne!(key(100, 1000), key(129, 1000));
        assert_eq!(key(3, 33).cols_bucket, 33);
        assert_ne!(key(8, 128256), key(8, 128320 + 64));
    }

    #[test]
    fn alignment_and_peelability_are_part_of_the_key() {
        let shape = Shape::new(32, 2048).unwrap();
        let layouts = [(true, true), (true, false), (false, true), (false, false)];
        for (i, &(aligned, peelable)) in layouts.iter().enumerate() {
            for &(other_aligned, other_peelable) in &layouts[i + 1..] {
                assert_ne!(
                    TuneKey::for_layout("h", shape, aligned, peelable),
                    TuneKey::for_layout("h", shape, other_aligned, other_peelable)
                );
            }
        }
        let (_scratch, path) = temp_path("layout");
        let mut cache = TuneCache::open(Some(path.clone())).unwrap();
        cache.insert(
            TuneKey::for_layout("h", shape, true, true),
            Variant::RowsInRegisters,
        );
        cache.save().unwrap();
        let reloaded = TuneCache::open(Some(path)).unwrap();
        let aligned = TuneKey::for_layout("h", shape, true, true);
        let unaligned = TuneKey::for_layout("h", shape, false, true);
        assert_eq!(reloaded.get(&aligned), Some(Variant::RowsInRegisters));
        assert_eq!(reloaded.get(&unaligned), None, "tuned on aligned buffers");
    }

    #[test]
    fn entries_survive_a_save_and_reload() {
        let (_scratch, path) = temp_path("roundtrip");
        let mut cache = TuneCache::open(Some(path.clone())).unwrap();
        cache.insert(key(32, 151936), Variant::RowSlices);
        cache.insert(key(8, 128256), Variant::BlockRegisters);
        cache.save().unwrap();
        let reloaded = TuneCache::open(Some(path)).unwrap();
        assert_eq!(reloaded.get(&key(32, 151936)), Some(Variant::RowSlices));
        assert_eq!(reloaded.get(&key(7, 128256)), Some(Variant::BlockRegisters));
        assert_eq!(reloaded.get(&key(64, 128256)), None);
    }

    #[test]
    fn missing_corrupt_truncated_and_foreign_files_give_an_empty_cache() {
        let (_scratch, path) = temp_path("bad");
        assert!(
            TuneCache::open(Some(path.clone()))
                .unwrap()
                .entries
                .is_empty(),
            "missing file"
        );
        let mut cache = TuneCache::open(Some(path.clone())).unwrap();
        cache.insert(key(1, 32000), Variant::RowSlices);
        cache.save().unwrap();
        let good = std::fs::read_to_string(&path).unwrap();
        let foreign = good.replace(&catalog(), "0123456789abcdef");
        let old_format = good.replace(&format!("\"format\": {FORMAT}"), "\"format\": 1");
        let unknown_variant = good.replace("row-slices", "warp-specialized");
        for bad in [
            &good[..good.len() / 2],
            "\u{0}garbage",
            "{}",
            foreign.as_str(),
            old_format.as_str(),
            unknown_variant.as_str(),
        ] {
            std::fs::write(&path, bad).unwrap();
            let mut reopened = TuneCache::open(Some(path.clone())).unwrap();
            assert!(reopened.entries.is_empty(), "{bad:?} was accepted");
            reopened.save().unwrap();
            assert!(
                TuneCache::open(Some(path.clone()))
                    .unwrap()
                    .entries
                    .is_empty(),
                "rebuilt file must load cleanly"
            );
        }
    }

    /// `auto` runs a tuned choice without planning it as `auto` again, so a choice naming
    /// `block-smem-autotuned` (resolved only by its own tuner), `auto` itself or a seed
    /// variant must never get into the cache.
    #[test]
    fn entries_naming_anything_but_a_production_variant_are_dropped_with_a_warning() {
        let (_scratch, path) = temp_path("not-production");
        let mut names: Vec<&str> = Variant::NAMES.to_vec();
        names.extend(["block-smem:256", "split-rows", "warp-specialized"]);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, file_naming(&names)).unwrap();
        let (entries, dropped) = file::read(&path).unwrap();
        let mut kept: Vec<Variant> = entries.values().copied().collect();
        kept.sort();
        assert_eq!(
            kept,
            [
                Variant::RowsInRegisters,
                Variant::BlockRegisters,
                Variant::RowSlices,
                Variant::RowCluster
            ]
        );
        assert_eq!(dropped.len(), names.len() - kept.len(), "{dropped:?}");
        for name in [
            "block-smem-autotuned",
            "auto",
            "split-rows",
            "warp-specialized",
        ] {
            assert!(
                dropped.iter().any(|why| why.contains(&format!("`{name}`"))),
                "no warning names {name}: {dropped:?}"
            );
        }
        let cache = TuneCache::open(Some(path)).unwrap();
        for (i, name) in names.iter().enumerate() {
            let key = TuneKey {
                rows_bucket: 1 << i,
                ..key(1, 1024)
            };
            let variant = cache.get(&key);
            assert!(
                variant.is_none_or(is_tunable),
                "{name} was kept as {variant:?}"
            );
        }
    }

    #[test]
    fn inserting_a_variant_that_is_not_production_records_nothing() {
        let (_scratch, path) = temp_path("insert-not-production");
        let mut cache = TuneCache::open(Some(path.clone())).unwrap();
        cache.insert(key(64, 1024), Variant::BlockPerRowAutotuned);
        cache.insert(key(64, 1024), Variant::Auto);
        cache.save().unwrap();
        assert_eq!(cache.get(&key(64, 1024)), None);
        assert!(TuneCache::open(Some(path)).unwrap().entries.is_empty());
    }

    /// The cache path blocked by a directory: the save fails, and the entry it was to persist
    /// is not claimed; what an earlier save persisted still is.
    #[test]
    fn a_failed_save_leaves_no_unsaved_entry_claimed() {
        let (_scratch, path) = temp_path("save-fails");
        let mut cache = TuneCache::open(Some(path.clone())).unwrap();
        cache.insert(key(32, 4096), Variant::BlockRegisters);
        cache.save().unwrap();
        std::fs::remove_file(&path).unwrap();
        std::fs::create_dir_all(path.join("in-the-way")).unwrap();
        cache.insert(key(8, 128256), Variant::RowSlices);
        assert!(cache.save().is_err(), "saving over a directory succeeded");
        assert_eq!(cache.get(&key(8, 128256)), None, "claims an unsaved entry");
        assert_eq!(cache.get(&key(32, 4096)), Some(Variant::BlockRegisters));
        let leftovers: Vec<_> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .filter(|name| name.to_string_lossy().ends_with(".tmp"))
            .collect();
        assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");
    }

    /// Two writers saving different entries to one file while a reader reads it: every save
    /// succeeds and the file always parses.
    #[test]
    fn concurrent_saves_always_leave_a_file_that_parses() {
        const SAVES: usize = 200;
        let (_scratch, path) = temp_path("concurrent");
        let writers: Vec<_> = [Variant::RowSlices, Variant::BlockRegisters]
            .into_iter()
            .enumerate()
            .map(|(writer, variant)| {
                let path = path.clone();
                std::thread::spawn(move || {
                    let mut cache = TuneCache::open(Some(path)).unwrap();
                    for i in 0..SAVES {
                        cache.insert(key(1 + i, 1024 * (1 + writer)), variant);
                        cache.save().unwrap();
                    }
                })
            })
            .collect();
        let mut reads = 0;
        while !writers.iter().all(|w| w.is_finished()) {
            if let Err(why) = file::read(&path) {
                panic!("read {reads}: the file does not parse: {why}");
            }
            reads += 1;
        }
        for writer in writers {
            writer.join().expect("a writer failed");
        }
        let (entries, dropped) = file::read(&path).unwrap();
        assert!(dropped.is_empty());
        assert!(!entries.is_empty());
    }

    #[test]
    fn the_catalog_changes_with_the_kernel_set() {
        assert_eq!(catalog(), catalog());
        assert_eq!(catalog().len(), 16);
    }
}
