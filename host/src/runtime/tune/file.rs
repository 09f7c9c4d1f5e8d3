//! The tune cache's file: JSON with a format version, a checksum of the kernel set, and one
//! entry per key (feature `tune-cache`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

use super::{TuneKey, is_tunable};
use crate::error::{Error, Result};
use crate::plan::all_kernel_names;
use crate::variant::Variant;

/// Format version of the file (2: the key records alignment and peelability).
pub(super) const FORMAT: u32 = 2;

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

/// What a file must agree on before its entries are read.
#[derive(Deserialize)]
struct Header {
    format: u32,
    catalog: String,
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

/// The entries of a file and a warning for each entry dropped.
type Loaded = (HashMap<TuneKey, Variant>, Vec<String>);

/// Reads the cache file at `path` (missing: empty).
pub(super) fn read(path: &Path) -> std::result::Result<Loaded, String> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok((HashMap::new(), Vec::new()));
        }
        Err(e) => return Err(e.to_string()),
    };
    let not_a_cache = |e: serde_json::Error| format!("not a tune cache ({e})");
    let header: Header = serde_json::from_str(&text).map_err(not_a_cache)?;
    if header.format != FORMAT || header.catalog != catalog() {
        return Err("made for another set of kernels or another format".into());
    }
    let file: CacheFile = serde_json::from_str(&text).map_err(not_a_cache)?;
    let (mut entries, mut dropped) = (HashMap::new(), Vec::new());
    for entry in file.entries {
        match entry.variant.parse::<Variant>() {
            Ok(variant) if is_tunable(variant) => {
                entries.insert(entry.key, variant);
            }
            Ok(_) => dropped.push(format!(
                "dropped the entry for {:?}: `{}` is not a production variant",
                entry.key, entry.variant
            )),
            Err(_) => dropped.push(format!(
                "dropped the entry for {:?}: unknown variant `{}`",
                entry.key, entry.variant
            )),
        }
    }
    Ok((entries, dropped))
}

/// Writes `entries` as the cache file at `path`.
pub(super) fn write_atomically(path: &Path, entries: &HashMap<TuneKey, Variant>) -> Result<()> {
    let io = |source| Error::Io {
        what: format!("saving the tune cache {}", path.display()),
        source,
    };
    let mut entries: Vec<Entry> = entries
        .iter()
        .map(|(key, variant)| Entry {
            key: key.clone(),
            variant: variant.name(),
        })
        .collect();
    entries.sort_by(|a, b| a.key.cmp(&b.key));
    let file = CacheFile {
        format: FORMAT,
        catalog: catalog(),
        entries,
    };
    let text = serde_json::to_string_pretty(&file).map_err(|e| io(std::io::Error::other(e)))?;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    let temporary = temporary_path(path);
    let written = std::fs::write(&temporary, text).and_then(|()| std::fs::rename(&temporary, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    written.map_err(io)
}

/// `<path>.<pid>.<count>.<nanos>.tmp`: no other save, in this process or another, writes it.
fn temporary_path(path: &Path) -> PathBuf {
    static SAVES: AtomicU64 = AtomicU64::new(0);
    let count = SAVES.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".{}.{count}.{nanos}.tmp", std::process::id()));
    path.with_file_name(name)
}
