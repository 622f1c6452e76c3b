//! What in an output folder is reshard's own, and removing only that.
//!
//! reshard's own names in DST are: `reshard.json` and `.reshard-partial.json`,
//! every name either of them records ([`Manifest::own_names`]: shards, the
//! index, copied files, and the names a partial run planned to write), its
//! temporary files (`.NAME.PID-TOKEN.reshard-tmp`) and its lock file.
//! Everything else is foreign and is never removed. Removal takes the name
//! itself: a symlink is unlinked, its target never touched; a folder is never
//! removed. A recorded name may be a relative path (`1_Pooling/config.json`,
//! a file copied into a subfolder): the top folder then counts as reshard's,
//! and the file is removed only if every folder on its way is a real folder
//! inside DST (never through a symlink). The caller must hold DST's lock
//! ([`DstLock`]).

use std::collections::BTreeSet;
use std::path::Path;

use super::lock::{DstLock, LOCK};
use super::manifest::{Manifest, ManifestError, MANIFEST, PARTIAL};
use super::{WriteError, TEMP_SUFFIX};
use crate::names::is_weight_name;

/// What an output folder holds, sorted into reshard's own and the rest.
#[derive(Debug, Clone, Default)]
pub struct DstInventory {
    pub manifest: Option<Manifest>,
    /// `None` also when the partial manifest is unreadable: it records
    /// nothing then, and is replaced.
    pub partial: Option<Manifest>,
    /// Names no manifest records and that are not reshard's bookkeeping, in
    /// name order (lossy UTF-8 for display; a name that is not UTF-8 is
    /// never one reshard wrote).
    pub foreign: Vec<String>,
}

impl DstInventory {
    /// Lists `dst` and reads its manifests.
    pub fn read(dst: &Path, _held: &DstLock) -> Result<DstInventory, ManifestError> {
        let manifest = Manifest::read(&dst.join(MANIFEST))?;
        let partial = Manifest::read(&dst.join(PARTIAL)).ok().flatten();
        let mut inv = DstInventory {
            manifest,
            partial,
            foreign: Vec::new(),
        };
        let own = inv.own_names();
        let entries = std::fs::read_dir(dst).map_err(|source| ManifestError::Io {
            path: dst.to_path_buf(),
            source,
        })?;
        for entry in entries.filter_map(Result::ok) {
            let name = entry.file_name();
            let ours = name.to_str().is_some_and(|n| {
                own.contains(n)
                    || is_bookkeeping(n)
                    || own
                        .iter()
                        .any(|o| o.strip_prefix(n).is_some_and(|r| r.starts_with('/')))
            });
            if !ours {
                inv.foreign.push(name.to_string_lossy().into_owned());
            }
        }
        inv.foreign.sort();
        Ok(inv)
    }

    /// Every name the manifest or the partial manifest records.
    pub fn own_names(&self) -> BTreeSet<String> {
        self.manifest
            .iter()
            .chain(&self.partial)
            .flat_map(Manifest::own_names)
            .map(str::to_string)
            .collect()
    }

    /// Foreign names that look like weights or indexes: a folder holding
    /// these is never written into (a loader could mix them with ours).
    pub fn foreign_weights(&self) -> Vec<&str> {
        self.foreign
            .iter()
            .map(String::as_str)
            .filter(|n| is_weight_name(n))
            .collect()
    }
}

/// reshard's own bookkeeping names: manifests, the lock, temporary files.
/// A model folder that is itself an output holds them; they are never
/// copied, and not named in "not copied" notes either.
pub(crate) fn is_bookkeeping(name: &str) -> bool {
    name == MANIFEST
        || name == PARTIAL
        || name == LOCK
        || (name.starts_with('.') && name.ends_with(TEMP_SUFFIX))
}

/// Bytes that removing `names` from `dst` gives back: regular files only
/// (a symlink frees nothing worth counting).
pub fn reclaimable<'a>(dst: &Path, names: impl IntoIterator<Item = &'a str>) -> u64 {
    names
        .into_iter()
        .filter_map(|n| std::fs::symlink_metadata(dst.join(n)).ok())
        .filter(|m| m.file_type().is_file())
        .map(|m| m.len())
        .fold(0u64, u64::saturating_add)
}

/// Removes `names` from `dst`: index files first, so no moment shows an
/// index over missing shards, then the rest. Each must be a plain name; a
/// missing one is fine; a folder is left alone; a symlink is unlinked.
pub fn remove_names(
    dst: &Path,
    names: &BTreeSet<String>,
    _held: &DstLock,
) -> Result<(), WriteError> {
    let (indexes, rest): (Vec<&String>, Vec<&String>) =
        names.iter().partition(|n| n.ends_with(".index.json"));
    for name in indexes.into_iter().chain(rest) {
        if !crate::names::is_plain_relative(name) || !real_folders_on_the_way(dst, name) {
            continue;
        }
        let path = dst.join(name);
        match std::fs::symlink_metadata(&path) {
            Ok(m) if m.file_type().is_dir() => continue,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(WriteError::io(&path, e)),
        }
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(WriteError::io(&path, e))
            }
            _ => {}
        }
    }
    Ok(())
}

/// True if every folder between `dst` and the relative `name` is a real
/// folder (not a symlink).
fn real_folders_on_the_way(dst: &Path, name: &str) -> bool {
    let mut dir = dst.to_path_buf();
    let parts: Vec<&str> = name.split('/').collect();
    parts[..parts.len().saturating_sub(1)].iter().all(|p| {
        dir.push(p);
        std::fs::symlink_metadata(&dir).is_ok_and(|m| m.file_type().is_dir())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::write::manifest::SourceIdentity;

    fn manifest(shards: &[&str], planned: &[&str]) -> Manifest {
        Manifest {
            quantization: None,
            gguf: None,
            reshard_version: "0".into(),
            plan_id: "p".into(),
            source: SourceIdentity {
                dir: "src".into(),
                root: None,
                format: crate::format::Format::Safetensors,
                files: Vec::new(),
            },
            options: Default::default(),
            index_file: Some("model.safetensors.index.json".into()),
            shards: shards
                .iter()
                .map(|f| crate::write::manifest::ShardRecord {
                    file: f.to_string(),
                    size: 1,
                    digest: crate::write::digest::ShardDigest::Blake3(String::new()),
                    tensors: Vec::new(),
                })
                .collect(),
            copied_files: vec!["config.json".into()],
            copied_sources: Vec::new(),
            oversized: Vec::new(),
            dropped: Vec::new(),
            planned: planned.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn only_recorded_plain_names_are_ours_and_only_they_are_removed() {
        let tmp = tempfile::tempdir().unwrap();
        let dst = tmp.path().join("dst");
        std::fs::create_dir(&dst).unwrap();
        let lock = DstLock::acquire(&dst).unwrap();
        std::fs::write(tmp.path().join("outside.safetensors"), b"keep").unwrap();
        let m = manifest(
            &["a.safetensors", "../outside.safetensors"],
            &["b.safetensors"],
        );
        std::fs::write(dst.join(PARTIAL), m.to_json()).unwrap();
        for name in [
            "a.safetensors",
            "b.safetensors",
            "config.json",
            "mine.safetensors",
            "notes.txt",
        ] {
            std::fs::write(dst.join(name), b"x").unwrap();
        }
        std::fs::write(dst.join(".x.1-2.reshard-tmp"), b"t").unwrap();
        let inv = DstInventory::read(&dst, &lock).unwrap();
        assert!(inv.manifest.is_none() && inv.partial.is_some());
        assert_eq!(inv.foreign, ["mine.safetensors", "notes.txt"]);
        assert_eq!(inv.foreign_weights(), ["mine.safetensors"]);
        assert_eq!(
            reclaimable(&dst, inv.own_names().iter().map(String::as_str)),
            3
        );
        remove_names(&dst, &inv.own_names(), &lock).unwrap();
        let mut left: Vec<String> = std::fs::read_dir(&dst)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(
            left,
            [
                ".reshard-partial.json",
                ".reshard.lock",
                ".x.1-2.reshard-tmp",
                "mine.safetensors",
                "notes.txt"
            ]
        );
        assert_eq!(
            std::fs::read(tmp.path().join("outside.safetensors")).unwrap(),
            b"keep"
        );
    }

    #[cfg(unix)]
    #[test]
    fn a_recorded_subfolder_file_is_removed_only_through_real_folders() {
        let tmp = tempfile::tempdir().unwrap();
        let dst = tmp.path().join("dst");
        std::fs::create_dir_all(dst.join("1_Pooling")).unwrap();
        let lock = DstLock::acquire(&dst).unwrap();
        std::fs::write(dst.join("1_Pooling/config.json"), b"x").unwrap();
        let elsewhere = tmp.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        std::fs::write(elsewhere.join("config.json"), b"precious").unwrap();
        std::os::unix::fs::symlink(&elsewhere, dst.join("linked")).unwrap();
        let mut m = manifest(&[], &[]);
        m.copied_files = vec!["1_Pooling/config.json".into(), "linked/config.json".into()];
        std::fs::write(dst.join(MANIFEST), m.to_json()).unwrap();
        let inv = DstInventory::read(&dst, &lock).unwrap();
        assert!(inv.foreign.is_empty(), "{:?}", inv.foreign);
        remove_names(&dst, &inv.own_names(), &lock).unwrap();
        assert!(!dst.join("1_Pooling/config.json").exists());
        assert_eq!(
            std::fs::read(elsewhere.join("config.json")).unwrap(),
            b"precious"
        );
    }

    #[cfg(unix)]
    #[test]
    fn a_recorded_symlink_is_unlinked_and_its_target_kept() {
        let tmp = tempfile::tempdir().unwrap();
        let dst = tmp.path().join("dst");
        std::fs::create_dir(&dst).unwrap();
        let lock = DstLock::acquire(&dst).unwrap();
        let target = tmp.path().join("weights.safetensors");
        std::fs::write(&target, b"precious").unwrap();
        std::os::unix::fs::symlink(&target, dst.join("a.safetensors")).unwrap();
        let names: BTreeSet<String> = ["a.safetensors".to_string()].into();
        assert_eq!(reclaimable(&dst, names.iter().map(String::as_str)), 0);
        remove_names(&dst, &names, &lock).unwrap();
        assert!(std::fs::symlink_metadata(dst.join("a.safetensors")).is_err());
        assert_eq!(std::fs::read(&target).unwrap(), b"precious");
    }
}
