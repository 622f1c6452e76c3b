//! What to do with what DST already holds, and whether the output fits.
//!
//! The rules, in order (DST is locked and listed by the caller; a folder
//! holding none of reshard's names is judged first on a listing taken
//! without the lock, [`DstInventory::unclaimed`], only so that it can be
//! refused before anything is written into it):
//!
//! 1. `reshard.json` of this exact plan: up to date, nothing is written;
//!    if a shard it records is missing or not its recorded size, resumed.
//! 2. Foreign weight files (weights or indexes no manifest records): refused,
//!    `--overwrite` or not; reshard never deletes them and a loader could
//!    mix them with its output.
//! 3. A partial manifest of this plan: resume, keeping its verified shards.
//! 4. `reshard.json` of another plan: refused without `--overwrite`; with it,
//!    the names either manifest claims are cleaned up.
//! 5. A partial manifest of another plan (reshard's own run that never
//!    committed): the names it claims are cleaned up and the run starts over.
//! 6. Other foreign files (beside a partial manifest or none): refused
//!    without `--overwrite`; with it, written beside and never removed.
//!
//! Cleaning up ([`crate::write::owned::DstInventory::cleanup`]) removes a
//! claimed file only when its size and digest are what the manifest
//! recorded, and moves an unproven shard or index aside. And before
//! anything is written, [`check_replacements`] refuses a run that would
//! write over a file DST holds that reshard cannot prove it wrote (a
//! hand-edited `config.json`), `--overwrite` or not.

use std::collections::BTreeSet;
use std::path::Path;

use super::other::OtherFiles;
use super::ConvertError;
use crate::format::Checkpoint;
use crate::plan::Plan;
use crate::write::digest::ShardDigest;
use crate::write::lock::DstLock;
use crate::write::manifest::{Manifest, ShardRecord, MANIFEST, PARTIAL};
use crate::write::owned::{
    as_recorded, may_replace, move_aside, reclaimable, remove_names, Cleanup, DstInventory,
};
use crate::write::{sync_dir, write_atomic, WriteError};

pub enum DstState {
    UpToDate(Manifest),
    Resume(Manifest),
    /// Start from nothing after cleaning up what the manifests claim.
    Fresh,
}

/// Applies the rules of the module doc.
pub fn decide(
    dst: &Path,
    inv: &DstInventory,
    id: &str,
    overwrite: bool,
) -> Result<DstState, ConvertError> {
    if let Some(m) = inv.manifest.as_ref().filter(|m| m.plan_id == id) {
        // A shard gone, or of another size than recorded (truncated, a
        // link put there): resume, which rewrites every shard that fails
        // its digest, rather than call a damaged output up to date.
        // The files beside the shards are small: each is checked by its
        // digest (a digit changed in the index's total_size or in
        // config.json keeps the size). A manifest from before they were
        // recorded proves nothing of them: resumed once. A copy that is
        // gone is put back by the refresh of an up-to-date output.
        let beside_recorded =
            !m.files.is_empty() || (m.index_file.is_none() && m.copied_files.is_empty());
        let intact = beside_recorded
            && m.shards.iter().all(|r| {
                std::fs::symlink_metadata(dst.join(&r.file))
                    .is_ok_and(|f| f.file_type().is_file() && f.len() == r.size)
            })
            && m.files.iter().all(|r| {
                // A mirrored copy that is gone is put back by the refresh.
                let gone = std::fs::symlink_metadata(dst.join(&r.name)).is_err()
                    && m.index_file.as_deref() != Some(r.name.as_str());
                gone || as_recorded(dst, &r.name, r.size, &r.digest)
            });
        return Ok(if intact {
            DstState::UpToDate(m.clone())
        } else {
            DstState::Resume(m.clone())
        });
    }
    let foreign = inv.foreign_weights();
    if !foreign.is_empty() {
        return Err(ConvertError::ForeignWeights {
            dst: dst.to_path_buf(),
            names: list_names(&foreign),
        });
    }
    match (&inv.manifest, &inv.partial) {
        (None, Some(p)) if p.plan_id == id => return Ok(DstState::Resume(p.clone())),
        (Some(_), _) if !overwrite => {
            return Err(ConvertError::DstHoldsOther {
                dst: dst.to_path_buf(),
            })
        }
        (None, _) if !inv.foreign.is_empty() && !overwrite => {
            return Err(ConvertError::DstNotEmpty {
                dst: dst.to_path_buf(),
            })
        }
        _ => {}
    }
    Ok(DstState::Fresh)
}

/// Refuses, before anything is written, a run that would write over a
/// file DST holds that reshard cannot prove it wrote
/// ([`crate::write::owned::may_replace`]: as `reshard.json` recorded it, or
/// already the bytes about to be written). `writes` are the names beside
/// the shards the run writes, each with the size and digest of its new
/// bytes (`new_bytes`); names that `cleanup` removes are not in the way.
pub fn check_replacements(
    dst: &Path,
    inv: &DstInventory,
    writes: &[String],
    cleanup: Option<&Cleanup>,
    new_bytes: &dyn Fn(&str) -> Option<(u64, ShardDigest)>,
) -> Result<(), ConvertError> {
    let records = inv
        .manifest
        .as_ref()
        .map(crate::write::owned::records_by_name)
        .unwrap_or_default();
    let blocked: Vec<&str> = writes
        .iter()
        .filter(|name| !cleanup.is_some_and(|c| c.remove.contains(*name)))
        .filter(|name| {
            // The new bytes are read only where DST holds something.
            std::fs::symlink_metadata(dst.join(name)).is_ok() && {
                let new = new_bytes(name);
                let record = records.get(name.as_str()).copied();
                !may_replace(dst, name, record, new.as_ref().map(|(n, d)| (*n, d)))
            }
        })
        .map(String::as_str)
        .collect();
    if blocked.is_empty() {
        return Ok(());
    }
    Err(ConvertError::WouldReplace {
        dst: dst.to_path_buf(),
        names: list_names(&blocked),
    })
}

/// The first three names quoted, and how many more.
fn list_names(names: &[&str]) -> String {
    let mut list = names
        .iter()
        .take(3)
        .map(|n| format!("{:?}", crate::names::escape(n)))
        .collect::<Vec<_>>()
        .join(", ");
    if names.len() > 3 {
        list.push_str(&format!(" and {} more", names.len() - 3));
    }
    list
}

/// Cleans up after an earlier conversion: moves its unproven names aside,
/// then removes its proven ones. With a committed manifest, it is first
/// demoted to a partial manifest that records every doomed name (so a run
/// killed half way through leaves a record the next run finishes
/// cleaning), then the commit point goes, then the index, then the rest.
pub fn clear(
    dst: &Path,
    inv: &DstInventory,
    cleanup: &Cleanup,
    lock: &DstLock,
) -> Result<(), WriteError> {
    move_aside(dst, &cleanup.aside, lock)?;
    let doomed = &cleanup.remove;
    if let Some(m) = &inv.manifest {
        let mut record = m.clone();
        record.planned = doomed.iter().cloned().collect();
        write_atomic(dst, PARTIAL, &record.to_json())?;
        match std::fs::remove_file(dst.join(MANIFEST)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(WriteError::io(&dst.join(MANIFEST), e))
            }
            _ => {}
        }
    }
    remove_names(dst, doomed, lock)
}

/// Takes back the shards this run `wrote` when it may not commit: the
/// partial manifest stops recording them first (each stays a planned name,
/// so a run killed in between still removes it), then they are removed.
/// Shards an earlier run finished are kept, as after any failed run.
pub fn forget(
    dst: &Path,
    partial: &Manifest,
    wrote: &[ShardRecord],
    lock: &DstLock,
) -> Result<(), WriteError> {
    let names: BTreeSet<String> = wrote.iter().map(|r| r.file.clone()).collect();
    let mut record = partial.clone();
    record.shards.retain(|r| !names.contains(&r.file));
    write_atomic(dst, PARTIAL, &record.to_json())?;
    remove_names(dst, &names, lock)?;
    sync_dir(dst)
}

/// Refuses early when the output cannot fit: the shards still to write
/// (header and data), the index, the manifests and the other files, against
/// what DST's file system has available plus what removing the old output
/// gives back. A file system that cannot tell its free space is not checked.
pub fn check_space(
    dst: &Path,
    ck: &Checkpoint,
    plan: &Plan,
    done: &[ShardRecord],
    others: &OtherFiles,
    doomed: Option<&BTreeSet<String>>,
) -> Result<(), ConvertError> {
    let Ok(free) = fs4::available_space(dst) else {
        return Ok(());
    };
    let needed = planned_bytes(plan, done, ck.tensors.len(), others.bytes());
    let freed = doomed.map_or(0, |d| {
        reclaimable(dst, d.iter().map(String::as_str).chain([MANIFEST]))
    });
    let available = free.saturating_add(freed);
    if needed > available {
        return Err(ConvertError::NoSpace {
            dst: dst.to_path_buf(),
            needed,
            available,
        });
    }
    Ok(())
}

/// A manifest costs about this much per tensor (name, shape, checksum, cast
/// figures); the partial and the final one exist together for a moment.
const MANIFEST_BYTES_PER_TENSOR: u64 = 256;

/// Bytes this run will add to DST.
fn planned_bytes(plan: &Plan, done: &[ShardRecord], tensors: usize, others: u64) -> u64 {
    let shards = plan
        .shards
        .iter()
        .filter(|s| !done.iter().any(|d| d.file == s.file))
        .map(|s| {
            let header = crate::write::format::of_plan(plan)
                .header_bytes(Path::new(&s.file), plan, s)
                .map_or(0, |h| h.len() as u64);
            header.saturating_add(s.data_len)
        })
        .fold(0u64, u64::saturating_add);
    let index = plan.index_file.as_ref().map_or(0, |_| {
        crate::write::format::of_plan(plan).index_bytes(plan).len() as u64
    });
    let manifests = (tensors as u64)
        .saturating_mul(MANIFEST_BYTES_PER_TENSOR)
        .saturating_add(4096)
        .saturating_mul(2);
    shards
        .saturating_add(index)
        .saturating_add(manifests)
        .saturating_add(others)
}
