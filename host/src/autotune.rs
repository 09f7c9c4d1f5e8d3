//! The tuning cache behind `Variant::Auto`: which production variant was fastest for a device
//! and a rounded shape, persisted to a JSON file.
//!
//! The file tolerates being missing (empty cache), corrupt or truncated (ignored with a
//! warning, rewritten at the next save) and old: it records a checksum of the variant and
//! kernel names, and entries made for another set of kernels are dropped.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::plan::all_kernel_names;
use crate::shape::Shape;
use crate::variant::Variant;

/// Format version of the file.
const FORMAT: u32 = 1;

/// A device and a rounded shape: rows to the next power of two, columns to a multiple of 64
/// (exact up to 256), and whether 16-byte access is possible.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TuneKey {
    pub device: String,
    pub rows_bucket: usize,
    pub cols_bucket: usize,
    pub vector: bool,
}

impl TuneKey {
    pub fn new(device: &str, shape: Shape, vector: bool) -> Self {
        let cols_bucket = if shape.cols() <= 256 {
            shape.cols()
        } else {
            shape.cols().div_ceil(64) * 64
        };
        TuneKey {
            device: device.to_owned(),
            rows_bucket: shape.rows().next_power_of_two(),
            cols_bucket,
            vector,
        }
    }
}

#[derive(Serialize, Deserialize)]
struct Entry {
    #[serde(flatten)]
    key: TuneKey,
    variant: String,
}

#[derive(Serialize, Deserialize)]
struct CacheFile {
    format: u32,
    catalog: String,
    entries: Vec<Entry>,
}

/// The tuned choices, and where they persist.
#[derive(Debug, Default)]
pub struct TuneCache {
    path: Option<PathBuf>,
    entries: HashMap<TuneKey, Variant>,
}

/// FNV-1a of every variant and kernel name: changes whenever the set of candidates does.
pub fn catalog() -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for name in Variant::NAMES
        .iter()
        .map(|s| s.to_string())
        .chain(all_kernel_names())
    {
        for byte in name.bytes().chain([0]) {
            hash = (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    format!("{hash:016x}")
}

/// `$SOFTMAX_TUNE_CACHE`, else `$XDG_CACHE_HOME/softmax-rs/tune.json`, else
/// `$HOME/.cache/softmax-rs/tune.json`.
pub fn default_path() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("SOFTMAX_TUNE_CACHE") {
        return Some(path.into());
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| Path::new(&home).join(".cache")))?;
    Some(cache.join("softmax-rs").join("tune.json"))
}

impl TuneCache {
    /// Loads the cache at `path` (none: in memory only). A file that cannot be used is
    /// ignored with a warning on stderr and replaced at the next save.
    pub fn open(path: Option<PathBuf>) -> Self {
        let entries = match &path {
            Some(p) => Self::read(p).unwrap_or_else(|why| {
                eprintln!(
                    "softmax-rs: ignoring tune cache {}: {why}; it will be rebuilt",
                    p.display()
                );
                HashMap::new()
            }),
            None => HashMap::new(),
        };
        TuneCache { path, entries }
    }

    fn read(path: &Path) -> std::result::Result<HashMap<TuneKey, Variant>, String> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(HashMap::new()),
            Err(e) => return Err(e.to_string()),
        };
        let file: CacheFile =
            serde_json::from_str(&text).map_err(|e| format!("not a tune cache ({e})"))?;
        if file.format != FORMAT || file.catalog != catalog() {
            return Err("made for another set of kernels".into());
        }
        file.entries
            .into_iter()
            .map(|entry| {
                let variant = entry
                    .variant
                    .parse()
                    .map_err(|_| format!("unknown variant `{}`", entry.variant))?;
                Ok((entry.key, variant))
            })
            .collect()
    }

    pub fn get(&self, key: &TuneKey) -> Option<Variant> {
        self.entries.get(key).copied()
    }

    pub fn insert(&mut self, key: TuneKey, variant: Variant) {
        self.entries.insert(key, variant);
    }

    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// Writes the cache to its file (through a temporary file and a rename, so a reader
    /// never sees half a file). Nothing to do for an in-memory cache.
    pub fn save(&self) -> Result<()> {
        let Some(path) = &self.path else {
            return Ok(());
        };
        let io = |source| Error::Io {
            what: format!("saving the tune cache {}", path.display()),
            source,
        };
        let mut entries: Vec<Entry> = self
            .entries
            .iter()
            .map(|(key, variant)| Entry {
                key: key.clone(),
                variant: variant.name(),
            })
            .collect();
        entries.sort_by(|a, b| {
            (&a.key.device, a.key.rows_bucket, a.key.cols_bucket).cmp(&(
                &b.key.device,
                b.key.rows_bucket,
                b.key.cols_bucket,
            ))
        });
        let file = CacheFile {
            format: FORMAT,
            catalog: catalog(),
            entries,
        };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        let temporary = path.with_extension("json.tmp");
        std::fs::write(
            &temporary,
            serde_json::to_string_pretty(&file).expect("serializable"),
        )
        .map_err(io)?;
        std::fs::rename(&temporary, path).map_err(io)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(rows: usize, cols: usize) -> TuneKey {
        TuneKey::new("nvidia-h200", Shape::new(rows, cols).unwrap(), true)
    }

    fn temp_path(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("softmax-rs-tune-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir.join("tune.json")
    }

    #[test]
    fn shapes_round_into_buckets() {
        assert_eq!(key(100, 1000), key(128, 1024));
        assert_ne!(key(100, 1000), key(129, 1000));
        assert_eq!(key(3, 33).cols_bucket, 33);
        assert_ne!(key(8, 128256), key(8, 128320 + 64));
    }

    #[test]
    fn entries_survive_a_save_and_reload() {
        let path = temp_path("roundtrip");
        let mut cache = TuneCache::open(Some(path.clone()));
        cache.insert(key(32, 151936), Variant::RowSlices);
        cache.insert(key(8, 128256), Variant::BlockRegisters);
        cache.save().unwrap();
        let reloaded = TuneCache::open(Some(path));
        assert_eq!(reloaded.get(&key(32, 151936)), Some(Variant::RowSlices));
        assert_eq!(reloaded.get(&key(7, 128256)), Some(Variant::BlockRegisters));
        assert_eq!(reloaded.get(&key(64, 128256)), None);
    }

    #[test]
    fn missing_corrupt_truncated_and_foreign_files_give_an_empty_cache() {
        let path = temp_path("bad");
        assert!(
            TuneCache::open(Some(path.clone())).entries.is_empty(),
            "missing file"
        );
        let mut cache = TuneCache::open(Some(path.clone()));
        cache.insert(key(1, 32000), Variant::RowCluster);
        cache.save().unwrap();
        let good = std::fs::read_to_string(&path).unwrap();
        let foreign = good.replace(&catalog(), "0123456789abcdef");
        let unknown_variant = good.replace("row-cluster", "warp-specialized");
        for bad in [
            &good[..good.len() / 2],
            "\u{0}garbage",
            "{}",
            foreign.as_str(),
            unknown_variant.as_str(),
        ] {
            std::fs::write(&path, bad).unwrap();
            let reopened = TuneCache::open(Some(path.clone()));
            assert!(reopened.entries.is_empty(), "{bad:?} was accepted");
            reopened.save().unwrap();
            assert!(
                TuneCache::open(Some(path.clone())).entries.is_empty(),
                "rebuilt file must load cleanly"
            );
        }
    }

    #[test]
    fn the_catalog_changes_with_the_kernel_set() {
        assert_eq!(catalog(), catalog());
        assert_eq!(catalog().len(), 16);
    }
}
