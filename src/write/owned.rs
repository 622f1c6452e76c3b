//! What in an output folder is reshard's own, and removing only that.
//!
//! reshard's own names in DST are: `reshard.json` and `.reshard-partial.json`,
//! the names they claim, its temporary files (`.NAME.PID-TOKEN.reshard-tmp`)
//! and its lock file. `reshard.json` claims every name it records
//! ([`Manifest::own_names`]: shards, the index, copied files);
//! `.reshard-partial.json` claims only names reshard generates (shards and
//! indexes, [`is_generated_name`]): a partial manifest never records a
//! mirrored file, so one that lists `notes.txt` was not written by reshard.
//! Everything else is foreign and is never removed.
//!
//! A manifest found in DST is a claim, not proof ([`DstInventory::cleanup`]):
//! a claimed file is removed only when it is a regular file with the size
//! and digest the manifest recorded (a shard's record, or a
//! [`super::manifest::FileRecord`] for the index and the copied files of
//! `reshard.json`) and a name of a kind the manifest records it under. A
//! claimed shard or index name whose bytes are not proven (a shard renamed
//! just before a crash, recorded only after its rename; an index whose
//! manifest never came) is moved aside to `.NAME.PID-K.reshard-aside`, never
//! deleted. A claimed mirrored file that is not as recorded is left where it
//! is. [`may_replace`] is the one rule for writing over a name DST already
//! holds. Removal takes the name
//! itself: a symlink is unlinked, its target never touched; a folder is never
//! removed. A recorded name may be a relative path (`1_Pooling/config.json`,
//! a file copied into a subfolder): the top folder then counts as reshard's,
//! and the file is removed only if every folder on its way is a real folder
//! inside DST (never through a symlink). The caller must hold DST's lock
//! ([`DstLock`]).

use std::collections::BTreeSet;
use std::path::Path;

use super::digest::{file_matches, ShardDigest};
use super::lock::{DstLock, LOCK};
use super::manifest::{FileRecord, Manifest, ManifestError, MANIFEST, PARTIAL};
use super::WriteError;
use crate::names::is_weight_name;

/// Suffix of a claimed file moved aside because its bytes are not proven.
pub const ASIDE_SUFFIX: &str = ".reshard-aside";

/// What [`DstInventory::cleanup`] decided for the claimed names.
#[derive(Debug, Clone, Default)]
pub struct Cleanup {
    /// Proven reshard's (as recorded): removed.
    pub remove: BTreeSet<String>,
    /// Claimed under a name reshard generates, but not proven: each moved
    /// aside, to the name given.
    pub aside: Vec<(String, String)>,
}

/// What an output folder holds, sorted into reshard's own and the rest.
#[derive(Debug, Clone, Default)]
pub struct DstInventory {
    pub manifest: Option<Manifest>,
    /// A partial manifest that cannot be read is an error, as for
    /// `reshard.json`: reshard writes both atomically, so such a file is
    /// not one it wrote, and it is never replaced.
    pub partial: Option<Manifest>,
    /// Names no manifest records and that are not reshard's bookkeeping, in
    /// name order (lossy UTF-8 for display; a name that is not UTF-8 is
    /// never one reshard wrote).
    pub foreign: Vec<String>,
}

impl DstInventory {
    /// Lists `dst` and reads its manifests.
    pub fn read(dst: &Path, _held: &DstLock) -> Result<DstInventory, ManifestError> {
        // reshard writes both as regular files: a symlink at either name
        // (dangling, or to a manifest elsewhere) is not one it wrote.
        for name in [MANIFEST, PARTIAL] {
            let path = dst.join(name);
            if std::fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_symlink()) {
                return Err(ManifestError::Invalid {
                    path,
                    reason: "a symlink, and reshard writes its manifests as regular files".into(),
                });
            }
        }
        let manifest = Manifest::read(&dst.join(MANIFEST))?;
        let partial = Manifest::read(&dst.join(PARTIAL))?;
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

    /// `dst` listed without its lock, when nothing in it is reshard's (no
    /// manifest, no lock, no temporary file): a folder of someone else's
    /// files, which a run may refuse before it writes a byte there, not
    /// even its lock. `None` when DST is not a readable folder or holds
    /// any of reshard's names (a run may be under way there: only the
    /// locked listing may decide then). Nothing is ever removed on the
    /// strength of this listing.
    pub fn unclaimed(dst: &Path) -> Option<DstInventory> {
        let mut foreign = Vec::new();
        for entry in std::fs::read_dir(dst).ok()? {
            let entry = entry.ok()?;
            let name = entry.file_name();
            if name.to_str().is_some_and(is_bookkeeping) {
                return None;
            }
            foreign.push(name.to_string_lossy().into_owned());
        }
        foreign.sort();
        Some(DstInventory {
            manifest: None,
            partial: None,
            foreign,
        })
    }

    /// Every name the manifest or the partial manifest claims (see the
    /// module doc: a partial manifest claims generated names only).
    pub fn own_names(&self) -> BTreeSet<String> {
        let partial = self
            .partial
            .iter()
            .flat_map(Manifest::own_names)
            .filter(|n| is_generated_name(n));
        self.manifest
            .iter()
            .flat_map(Manifest::own_names)
            .chain(partial)
            .map(str::to_string)
            .collect()
    }

    /// Sorts the claimed names still in DST into those proven reshard's
    /// (removed) and those moved aside, reading each claimed shard and
    /// file whose size matches its record to check its digest.
    pub fn cleanup(&self, dst: &Path, _held: &DstLock) -> Cleanup {
        let mut remove = BTreeSet::new();
        let mut unproven = BTreeSet::new();
        for (m, committed) in self
            .manifest
            .iter()
            .map(|m| (m, true))
            .chain(self.partial.iter().map(|m| (m, false)))
        {
            for r in &m.shards {
                if is_generated_name(&r.file) && as_recorded(dst, &r.file, r.size, &r.digest) {
                    remove.insert(r.file.clone());
                } else if is_generated_name(&r.file) {
                    unproven.insert(r.file.clone());
                }
            }
            let records = records_by_name(m);
            for name in m.index_file.iter().chain(&m.planned) {
                let proven = records
                    .get(name.as_str())
                    .is_some_and(|r| as_recorded(dst, name, r.size, &r.digest));
                if is_generated_name(name) && proven {
                    remove.insert(name.clone());
                } else if is_generated_name(name) {
                    unproven.insert(name.clone());
                }
            }
            if !committed {
                // A partial manifest never records a mirrored file.
                continue;
            }
            for name in &m.copied_files {
                let proven = records
                    .get(name.as_str())
                    .is_some_and(|r| as_recorded(dst, name, r.size, &r.digest));
                if proven && !is_weight_name(name) {
                    remove.insert(name.clone());
                }
            }
        }
        let aside = aside_names(dst, unproven.into_iter().filter(|n| !remove.contains(n)));
        Cleanup { remove, aside }
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
    name == MANIFEST || name == PARTIAL || name == LOCK || super::atomic::is_temp_name(name)
}

/// Names reshard generates in DST, the only ones a partial manifest may
/// claim: one plain name of a weight or index file (`model-00001-of-00002.safetensors`,
/// `model.safetensors.index.json`, `model.gguf`).
pub fn is_generated_name(name: &str) -> bool {
    crate::names::is_plain_name(name) && is_weight_name(name)
}

/// A manifest's records of the files beside its shards, by name.
pub fn records_by_name(m: &Manifest) -> std::collections::HashMap<&str, &FileRecord> {
    m.files.iter().map(|r| (r.name.as_str(), r)).collect()
}

/// True if `dst/name` is a regular file (not a link, reached through real
/// folders) of `size` bytes with `digest`: what a manifest recorded.
pub fn as_recorded(dst: &Path, name: &str, size: u64, digest: &ShardDigest) -> bool {
    if !crate::names::is_plain_relative(name) || !real_folders_on_the_way(dst, name) {
        return false;
    }
    let path = dst.join(name);
    std::fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_file() && m.len() == size)
        && file_matches(&path, digest)
}

/// The one rule for writing over a name DST already holds: allowed when
/// nothing is there, when the file there is as `record` says reshard wrote
/// it, or when it already holds exactly the bytes about to be written
/// (`new`, with their size) so nothing is lost. Anything else (a file the
/// user edited, a file reshard never recorded, a symlink) is not replaced.
pub fn may_replace(
    dst: &Path,
    name: &str,
    record: Option<&FileRecord>,
    new: Option<(u64, &ShardDigest)>,
) -> bool {
    match std::fs::symlink_metadata(dst.join(name)) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return true,
        Err(_) => return false,
        Ok(_) => {}
    }
    record.is_some_and(|r| as_recorded(dst, name, r.size, &r.digest))
        || new.is_some_and(|(size, digest)| as_recorded(dst, name, size, digest))
}

/// Moves each of `aside` (a claimed name, its new name) out of the way with
/// a rename inside `dst`; a name gone meanwhile is fine.
/// Each of `names` that `dst` holds, with the free name it would be moved
/// aside to (`.NAME.PID-K.reshard-aside`).
pub fn aside_names(dst: &Path, names: impl IntoIterator<Item = String>) -> Vec<(String, String)> {
    let pid = std::process::id();
    names
        .into_iter()
        .filter(|n| std::fs::symlink_metadata(dst.join(n)).is_ok())
        .map(|n| {
            let free = (0u32..)
                .map(|k| format!(".{n}.{pid}-{k}{ASIDE_SUFFIX}"))
                .find(|to| std::fs::symlink_metadata(dst.join(to)).is_err())
                .unwrap_or_default();
            (n, free)
        })
        .collect()
}

pub fn move_aside(
    dst: &Path,
    aside: &[(String, String)],
    _held: &DstLock,
) -> Result<(), WriteError> {
    for (from, to) in aside {
        if !crate::names::is_plain_name(from) || !crate::names::is_plain_name(to) {
            continue;
        }
        // Never over a file that took the free name since it was chosen.
        match crate::platform::rename_no_replace(&dst.join(from), &dst.join(to)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(WriteError::io(&dst.join(from), e))
            }
            _ => {}
        }
    }
    Ok(())
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
            quantized: None,
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
            files: Vec::new(),
            oversized: Vec::new(),
            dropped: Vec::new(),
            planned: planned.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn a_partial_manifest_claims_generated_names_and_only_proven_ones_are_removed() {
        let tmp = tempfile::tempdir().unwrap();
        let dst = tmp.path().join("dst");
        std::fs::create_dir(&dst).unwrap();
        let lock = DstLock::acquire(&dst).unwrap();
        std::fs::write(tmp.path().join("outside.safetensors"), b"keep").unwrap();
        let mut m = manifest(
            &["a.safetensors", "../outside.safetensors", "c.safetensors"],
            &["b.safetensors", "notes.txt"],
        );
        // a as recorded; c recorded with other bytes; b planned only.
        m.shards[0].digest = crate::write::digest::digest_file(
            &{
                std::fs::write(dst.join("a.safetensors"), b"x").unwrap();
                dst.join("a.safetensors")
            },
            crate::write::digest::DigestAlgo::Blake3,
        )
        .unwrap();
        std::fs::write(dst.join(PARTIAL), m.to_json()).unwrap();
        for name in [
            "b.safetensors",
            "c.safetensors",
            "config.json",
            "mine.safetensors",
            "notes.txt",
        ] {
            std::fs::write(dst.join(name), b"x").unwrap();
        }
        std::fs::write(dst.join(".x.1-0000abcd.reshard-tmp"), b"t").unwrap();
        let inv = DstInventory::read(&dst, &lock).unwrap();
        assert!(inv.manifest.is_none() && inv.partial.is_some());
        // A partial manifest never records a mirrored file: config.json
        // and notes.txt are not reshard's.
        assert_eq!(
            inv.foreign,
            ["config.json", "mine.safetensors", "notes.txt"]
        );
        assert_eq!(inv.foreign_weights(), ["mine.safetensors"]);
        let cleanup = inv.cleanup(&dst, &lock);
        assert_eq!(cleanup.remove.iter().collect::<Vec<_>>(), ["a.safetensors"]);
        let aside: Vec<&str> = cleanup.aside.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(aside, ["b.safetensors", "c.safetensors"]);
        assert_eq!(
            reclaimable(&dst, cleanup.remove.iter().map(String::as_str)),
            1
        );
        move_aside(&dst, &cleanup.aside, &lock).unwrap();
        remove_names(&dst, &cleanup.remove, &lock).unwrap();
        let mut left: Vec<String> = std::fs::read_dir(&dst)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| !n.ends_with(ASIDE_SUFFIX))
            .collect();
        left.sort();
        assert_eq!(
            left,
            [
                ".reshard-partial.json",
                ".reshard.lock",
                ".x.1-0000abcd.reshard-tmp",
                "config.json",
                "mine.safetensors",
                "notes.txt"
            ]
        );
        for (_, to) in &cleanup.aside {
            assert_eq!(std::fs::read(dst.join(to)).unwrap(), b"x");
        }
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

    #[test]
    fn a_partial_manifest_reshard_did_not_write_is_an_error_and_a_foreign_temp_name_is_foreign() {
        let tmp = tempfile::tempdir().unwrap();
        let dst = tmp.path().join("dst");
        std::fs::create_dir(&dst).unwrap();
        let lock = DstLock::acquire(&dst).unwrap();
        std::fs::write(dst.join(".notes.reshard-tmp"), b"mine").unwrap();
        let inv = DstInventory::read(&dst, &lock).unwrap();
        assert_eq!(inv.foreign, [".notes.reshard-tmp"]);
        std::fs::write(dst.join(PARTIAL), b"my own notes").unwrap();
        let err = DstInventory::read(&dst, &lock).unwrap_err().to_string();
        assert!(
            err.contains(".reshard-partial.json") && err.contains("not a reshard manifest"),
            "{err}"
        );
    }
}
