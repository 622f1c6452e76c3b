//! PyTorch `.bin` / `.pt` checkpoints (the torch.save zip format, torch >=
//! 1.6), read as data only: a restricted pickle machine that never imports or
//! calls anything, and storages read in place.
//!
//! The steps, one submodule each: [`zip`] indexes the archive and checks each
//! entry against the file; [`pickle`] runs `data.pkl` on a whitelist of
//! opcodes, with [`globals`] turning the few allowed Python names into data;
//! [`state`] reads the result as a state dict and places every tensor in its
//! storage entry; [`value`], below all three, holds the data they share.
//! No tensor bytes are read here: [`crate::format::read`] streams them later
//! from the [`DataRef`]s this module returns.
//!
//! Entry points: [`read_file`] for a checkpoint on disk, [`read_bytes`] and
//! [`parse_pickle`] for the same work on bytes in memory (the fuzz targets).

pub(crate) mod budget;
pub(crate) mod error;
pub(crate) mod globals;
pub(crate) mod pickle;
pub(crate) mod state;
pub(crate) mod value;
pub(crate) mod zip;

use std::collections::HashMap;
use std::fs::File;

pub use self::error::PytorchError;
pub use self::value::{Storage, TensorSpec};
use self::zip::{ReadAt, ZipIndex};
use super::{DataRef, Dtype, Finding, Tensor};

/// Largest `data.pkl` read into memory: 64 MiB. A state dict pickle takes
/// about 130 bytes a tensor, so the largest real checkpoint (about 100,000
/// tensors) in one file would need ~13 MB.
pub const MAX_PICKLE: u64 = 64 << 20;
/// Largest `byteorder` / `version` entry read.
const MAX_SMALL_ENTRY: u64 = 64;

/// One tensor of a torch.save archive with its bytes located; the same as a
/// [`Tensor`] without the file index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorMeta {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<u64>,
    pub len: u64,
    pub data: DataRef,
    /// The storage key (`<archive>/data/<key>`); tensors with the same key
    /// share bytes.
    pub storage: String,
}

/// Reads the tensors of one torch.save file, opened by the caller (as a
/// regular file: see [`crate::format::read::open_regular`]). `file_index`
/// is stored in each tensor's `file` field.
pub fn read_file(
    handle: &File,
    file_index: usize,
) -> Result<(Vec<Tensor>, Vec<Finding>), PytorchError> {
    let len = handle
        .metadata()
        .map_err(|source| PytorchError::Io { source })?
        .len();
    let (metas, findings) = read_source(handle, len)?;
    let tensors = metas
        .into_iter()
        .map(|m| Tensor {
            name: m.name,
            dtype: m.dtype,
            shape: m.shape,
            len: m.len,
            file: file_index,
            data: m.data,
        })
        .collect();
    Ok((tensors, findings))
}

/// Everything [`read_file`] does, on a whole file held in memory: the entry
/// point for fuzzing the zip reader, the pickle machine and the placement
/// checks together. Offsets in the returned [`DataRef`]s index `bytes`.
pub fn read_bytes(bytes: &[u8]) -> Result<(Vec<TensorMeta>, Vec<Finding>), PytorchError> {
    read_source(bytes, bytes.len() as u64)
}

/// Runs the restricted pickle machine on a `data.pkl` and reads the result
/// as a state dict: name -> tensor arguments, in order. Nothing is checked
/// against an archive.
pub fn parse_pickle(bytes: &[u8]) -> Result<Vec<(String, TensorSpec)>, PytorchError> {
    let root = pickle::run(bytes)?;
    state::state_dict(&root)
}

fn read_source<R: ReadAt + ?Sized>(
    src: &R,
    len: u64,
) -> Result<(Vec<TensorMeta>, Vec<Finding>), PytorchError> {
    let mut magic = [0u8; 1];
    if len > 0 && src.read_exact_at(&mut magic, 0).is_ok() && magic[0] == 0x80 {
        // Legacy torch.save: a bare pickle stream (PROTO opcode) of magic
        // number, protocol version and sys info, then the objects.
        return Err(PytorchError::Legacy);
    }
    let index = ZipIndex::read(src, len)?;
    let archive = archive_name(&index)?;
    if let Some(entry) = index.get(&format!("{archive}/byteorder")) {
        let order = ZipIndex::read_entry(src, entry, MAX_SMALL_ENTRY)?;
        match &order[..] {
            b"little" => {}
            b"big" => return Err(PytorchError::BigEndian),
            other => {
                return Err(PytorchError::UnknownByteOrder {
                    entry: entry.name.clone(),
                    found: String::from_utf8_lossy(other).into_owned(),
                })
            }
        }
    }
    if index.get(&format!("{archive}/constants.pkl")).is_some() {
        return Err(PytorchError::TorchScript);
    }
    let pkl_entry = index
        .get(&format!("{archive}/data.pkl"))
        .ok_or(PytorchError::NoDataPkl)?;
    let pkl = ZipIndex::read_entry(src, pkl_entry, MAX_PICKLE)?;
    let specs = parse_pickle(&pkl)?;

    let mut metas = Vec::with_capacity(specs.len());
    let mut by_storage: HashMap<&str, Vec<&str>> = HashMap::new();
    let mut storage_order: Vec<&str> = Vec::new();
    for (name, spec) in &specs {
        let entry_name = format!("{archive}/data/{}", spec.storage.key);
        let entry = index
            .get(&entry_name)
            .ok_or_else(|| PytorchError::MissingStorage {
                tensor: name.clone(),
                key: spec.storage.key.clone(),
                entry: entry_name.clone(),
            })?;
        let placed = state::place(name, spec, entry)?;
        let sharing = by_storage.entry(&spec.storage.key).or_default();
        if sharing.is_empty() {
            storage_order.push(&spec.storage.key);
        }
        sharing.push(name);
        metas.push(TensorMeta {
            name: name.clone(),
            dtype: placed.dtype,
            shape: placed.shape,
            len: placed.len,
            data: placed.data,
            storage: spec.storage.key.clone(),
        });
    }
    let findings = storage_order
        .iter()
        .filter_map(|key| by_storage.get(key))
        .filter(|names| names.len() > 1)
        .map(|names| Finding::SharedStorage {
            tensors: names.iter().map(|n| n.to_string()).collect(),
        })
        .collect();
    Ok((metas, findings))
}

/// The archive's top folder: torch names it after the file (`archive`,
/// `pytorch_model`, ...); it is whatever precedes `/data.pkl`.
fn archive_name(index: &ZipIndex) -> Result<String, PytorchError> {
    let first = index.entries().first().ok_or(PytorchError::NoDataPkl)?;
    let (top, _) = first.name.split_once('/').ok_or(PytorchError::NoDataPkl)?;
    Ok(top.to_string())
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
