//! reshard's own loader: shard by shard in layer order, every tensor is
//! read into a device allocation and its bytes are checked on the way.
//!
//! Devices implement [`Device`]; the CPU stand-in and CUDA
//! ([`super::device`]) run the same code. A tensor takes one of two paths
//! into its allocation (see [`stream_tensor`]):
//!
//! - through staging (CUDA, and any device without host-visible memory):
//!   each fill is read into the staging buffer, hashed there (the shard
//!   digest and the tensor's xxh3, on two threads) while it is uploaded;
//!   then the allocation is hashed back and compared with the file bytes
//!   ([`Failure::Readback`]), which proves the copy across the bus;
//! - in place (the CPU stand-in, whose device memory is host memory,
//!   [`Device::host_memory`]): each fill is read straight into the
//!   allocation and both hashes are taken there. A GPU's upload is a DMA
//!   that costs the CPU nothing, so the stand-in does not make a copy that
//!   would charge it one; and with one copy the xxh3 of the file bytes is
//!   the xxh3 of the device copy, so there is no readback to take and a
//!   mismatch is a tensor checksum failure against reshard.json (a tensor
//!   it does not list is checked by its shard's digest alone).
//!
//! Tensors with no allocation (refused by the VRAM budget, or empty) go
//! through staging, hashed only. Either way the tensor's xxh3 is compared
//! with reshard.json's, and the shard digest takes every byte of the file
//! in order (the bytes outside tensors through staging, [`hash_raw`]).
//!
//! The staging buffer belongs to the device (pinned host memory on CUDA)
//! and is allocated once, after the commit baseline, so it counts in the
//! peak whichever path the tensors take. Every allocation is fallible:
//! under a commit budget an allocation past it is a [`Failure::OverBudget`],
//! never an abort.

use std::fs::File;
use std::time::Instant;

use crate::write::digest::Xxh3;

use super::device::{staging_len, Device, DeviceError};
use super::integrity::{Expected, ShardCheck};
use super::ledger::CommitLedger;
use super::report::{BlockPlacement, Failure, Placement, ShardTiming, ValidateReport, VramFit};
use super::{Cancel, Progress, ValidateError, ValidateOptions};
use crate::format::read::SourceReader;
use crate::format::{Checkpoint, DataRef, FormatError};
use crate::plan::order::{block_of, sort_indices, Order};

/// File indices of `ck` in layer order: by the layer-order rank of the
/// first tensor each holds.
pub fn shard_order(ck: &Checkpoint) -> Vec<usize> {
    let names: Vec<&str> = ck.tensors.iter().map(|t| t.name.as_str()).collect();
    let mut rank_of_file = vec![usize::MAX; ck.files.len()];
    for (rank, i) in sort_indices(&names, Order::Forward).into_iter().enumerate() {
        let f = ck.tensors[i].file;
        rank_of_file[f] = rank_of_file[f].min(rank);
    }
    let mut files: Vec<usize> = (0..ck.files.len()).collect();
    files.sort_by_key(|&f| (rank_of_file[f], f));
    files
}

/// How many leading blocks (layer order) fit in `budget` device bytes.
pub fn vram_fit(ck: &Checkpoint, budget: u64) -> VramFit {
    let names: Vec<&str> = ck.tensors.iter().map(|t| t.name.as_str()).collect();
    let order = sort_indices(&names, Order::Forward);
    let needed: u64 = ck.tensors.iter().map(|t| t.len).sum();
    // The tensors that fit: the longest prefix in layer order within budget.
    let mut used = 0u64;
    let mut cut = order.len();
    for (k, &i) in order.iter().enumerate() {
        used = used.saturating_add(ck.tensors[i].len);
        if used > budget {
            cut = k;
            break;
        }
    }
    // Blocks in order of first appearance, and the position of each one's
    // last tensor.
    let mut blocks: Vec<(crate::plan::order::Block, usize)> = Vec::new();
    for (k, &i) in order.iter().enumerate() {
        if let Some(b) = block_of(&ck.tensors[i].name) {
            match blocks.iter_mut().find(|(x, _)| *x == b) {
                Some(entry) => entry.1 = k,
                None => blocks.push((b, k)),
            }
        }
    }
    let blocks_fit = blocks.iter().take_while(|(_, last)| *last < cut).count();
    VramFit {
        budget,
        needed,
        blocks_fit,
        blocks_total: blocks.len(),
        blocks_required: None,
    }
}

/// Loads every shard of `ck` in `order` into `device`, checking bytes as
/// they pass, and records timings and failures in `report`.
pub fn run(
    ck: &Checkpoint,
    order: &[usize],
    device: &mut dyn Device,
    options: &ValidateOptions,
    expect: &Expected<'_>,
    ledger: &mut CommitLedger,
    report: &mut ValidateReport,
) -> Result<(), ValidateError> {
    let reader = SourceReader::open(ck)?;
    let first_shard = order
        .first()
        .map(|&f| ck.files[f].name())
        .unwrap_or_default();
    let staging_len = staging_len(options.staging, ck) as u64;
    report.staging = staging_len;
    match device.prepare() {
        // Whether the staging buffer could be pinned is known only now.
        Ok(()) => report.device = device.info(),
        Err(DeviceError::OutOfMemory { .. }) => {
            let committed = ledger.sample();
            report.fail(Failure::OverBudget {
                shard: first_shard,
                tensor: None,
                needed: staging_len,
                committed,
                budget: options.commit_budget,
            });
            return Ok(());
        }
        Err(e) => {
            return Err(ValidateError::Cuda {
                reason: format!("cannot allocate the staging buffer: {e}"),
            })
        }
    }
    ledger.sample();
    let mut fit = options.vram_budget.map(|b| vram_fit(ck, b));
    // An offloading load: past the budget is the host's, and the budget
    // must hold the leading blocks promised.
    let offload = options.vram_leading_blocks.filter(|_| fit.is_some());
    if let (Some(f), Some(n)) = (fit.as_mut(), offload) {
        f.blocks_required = Some(n);
        if f.blocks_fit < n {
            report.fail(Failure::VramBlocks { fit: f.clone() });
        }
    }
    report.vram = fit.clone();
    let mut vram_refused = false;
    let mut cumulative = 0u64;
    let mut placement = PlacementLog::default();
    for &file in order {
        let started = Instant::now();
        let name = ck.files[file].name();
        options.progress.shard_started(&name);
        let mut tensors: Vec<usize> = (0..ck.tensors.len())
            .filter(|&i| ck.tensors[i].file == file)
            .collect();
        tensors.sort_by_key(|&i| (ck.tensors[i].offset(), i));
        let all_contiguous = tensors
            .iter()
            .all(|&i| matches!(ck.tensors[i].data, DataRef::Contiguous { .. }));
        let mut check = ShardCheck::new(expect.shard(file).filter(|_| all_contiguous));
        let raw = if check.active() {
            Some(
                File::open(&ck.files[file].path)
                    .map_err(|e| FormatError::io(&ck.files[file].path, e))?,
            )
        } else {
            None
        };
        let mut bytes = 0u64;
        for &i in &tensors {
            crate::write::failpoint::named("validate");
            if options.cancel.is_set() {
                return Err(ValidateError::Interrupted {
                    path: ck.dir.clone(),
                });
            }
            let t = &ck.tensors[i];
            if let Some(raw) = &raw {
                hash_raw(device, raw, &ck.files[file].path, &mut check, t.offset())?;
            }
            // Allocate on the device, unless a VRAM limit already stopped us.
            let mut alloc = None;
            if t.len > 0 && !vram_refused {
                if let (Some(b), Some(fit)) = (options.vram_budget, &fit) {
                    if cumulative.saturating_add(t.len) > b {
                        vram_refused = true;
                        if offload.is_none() {
                            report.fail(Failure::VramBudget {
                                shard: name.clone(),
                                tensor: t.name.clone(),
                                fit: fit.clone(),
                            });
                        }
                    }
                }
                if !vram_refused {
                    let free = device.free_dedicated().map_err(at(&name, &t.name))?;
                    match device.alloc(t.len) {
                        Ok(h) => {
                            alloc = Some(h);
                            if let Some(free) = free {
                                placement.place(&t.name, t.len, free);
                            }
                        }
                        Err(DeviceError::OutOfMemory { needed, host: true }) => {
                            let committed = ledger.sample();
                            report.fail(Failure::OverBudget {
                                shard: name.clone(),
                                tensor: Some(t.name.clone()),
                                needed,
                                committed,
                                budget: options.commit_budget,
                            });
                            device.end_shard();
                            report.placement = placement.report();
                            return Ok(());
                        }
                        Err(DeviceError::OutOfMemory { needed, .. }) => {
                            vram_refused = true;
                            let total = report.device.total_memory.unwrap_or(cumulative);
                            if report.vram.is_none() {
                                report.vram = Some(vram_fit(ck, total));
                            }
                            report.fail(Failure::DeviceOutOfMemory {
                                shard: name.clone(),
                                tensor: t.name.clone(),
                                needed,
                                held: device.held(),
                                device: report.device.device.clone(),
                            });
                        }
                        Err(e) => return Err(at(&name, &t.name)(e)),
                    }
                    ledger.sample();
                }
            }
            if alloc.is_some() {
                cumulative += t.len;
                report.device_bytes = cumulative;
                report.device_peak_held = report.device_peak_held.max(device.held());
            }
            let streamed = stream_tensor(
                &reader,
                t,
                device,
                alloc,
                &mut check,
                &options.progress,
                options.cancel,
            )
            .map_err(|e| match e {
                ValidateError::Cuda { reason } => ValidateError::Cuda {
                    reason: format!("shard {name}, tensor {:?}: {reason}", t.name),
                },
                e => e,
            })?;
            expect.check_tensor(ck, i, streamed.xxh3, &mut report.failures);
            if let Some(h) = alloc.filter(|_| !streamed.in_place) {
                let readback = device.readback_hash(h, t.len);
                if readback.map_err(at(&name, &t.name))? != streamed.xxh3 {
                    report.fail(Failure::Readback {
                        file: name.clone(),
                        tensor: t.name.clone(),
                        device: report.device.device.clone(),
                    });
                }
            }
            bytes += t.len;
        }
        if let Some(raw) = &raw {
            hash_raw(
                device,
                raw,
                &ck.files[file].path,
                &mut check,
                ck.files[file].size,
            )?;
        }
        check.finish(&mut report.failures);
        ledger.sample();
        device.end_shard();
        report.bytes_loaded += bytes;
        report.shards.push(ShardTiming {
            file: name,
            bytes,
            tensors: tensors.len(),
            seconds: started.elapsed().as_secs_f64(),
        });
    }
    report.placement = placement.report();
    Ok(())
}

fn device_err(e: DeviceError) -> ValidateError {
    ValidateError::Cuda {
        reason: e.to_string(),
    }
}

/// A device error at one tensor, naming the shard and the tensor.
fn at<'a>(shard: &'a str, tensor: &'a str) -> impl Fn(DeviceError) -> ValidateError + 'a {
    move |e| ValidateError::Cuda {
        reason: format!("shard {shard}, tensor {tensor:?}: {e}"),
    }
}

/// Where each allocation went, grouped (in the order of their first
/// allocation) by the numbered block a tensor belongs to, or by the tensor
/// itself outside blocks. An allocation is in dedicated memory when the
/// driver reported at least its size free just before it; a group is when
/// all of its allocations are.
#[derive(Default)]
struct PlacementLog {
    free_at_start: Option<u64>,
    groups: Vec<BlockPlacement>,
}

impl PlacementLog {
    fn place(&mut self, tensor: &str, len: u64, free: u64) {
        self.free_at_start.get_or_insert(free);
        let name = block_of(tensor).map_or_else(|| tensor.to_string(), |b| b.name());
        let dedicated = len <= free;
        // A block split across shards is one group.
        match self.groups.iter_mut().find(|g| g.name == name) {
            Some(g) => {
                g.bytes += len;
                g.dedicated &= dedicated;
            }
            None => self.groups.push(BlockPlacement {
                name,
                block: block_of(tensor).is_some(),
                bytes: len,
                dedicated,
            }),
        }
    }

    fn report(&self) -> Option<Placement> {
        Some(Placement {
            free_at_start: self.free_at_start?,
            groups: self.groups.clone(),
        })
    }
}

/// Feeds the shard check the file's bytes from its position up to `end`
/// (the header before the first tensor, any gap, the tail), via staging.
fn hash_raw(
    device: &mut dyn Device,
    raw: &File,
    path: &std::path::Path,
    check: &mut ShardCheck<'_>,
    end: u64,
) -> Result<(), ValidateError> {
    let staging = device.staging().map_err(device_err)?;
    while check.pos < end {
        let n = usize::try_from(end - check.pos)
            .unwrap_or(usize::MAX)
            .min(staging.len());
        crate::platform::read_exact_at(raw, &mut staging[..n], check.pos)
            .map_err(|e| FormatError::io(path, e))?;
        check.update(&staging[..n]);
    }
    Ok(())
}

/// What [`stream_tensor`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Streamed {
    /// The xxh3 of the tensor's bytes as read from the file.
    xxh3: u64,
    /// The bytes were read into the allocation itself and hashed there:
    /// `xxh3` is the device copy's, and no readback is needed.
    in_place: bool,
}

/// Streams a tensor's bytes into `alloc` when it is given (in place where
/// the device offers it as host memory, else through staging) or only
/// through staging, feeding the shard digest; returns the xxh3 of the file
/// bytes (see the module doc for the two paths).
///
/// Each fill is at most [`Device::fill_len`]; the shard digest and the
/// xxh3 take it on two threads at once ([`hash_fill`]), beside the upload
/// on the staging path ([`Device::upload_beside`]: on the CPU stand-in the
/// copy is a third task, and rayon spreads the three over the cores there
/// are).
fn stream_tensor(
    reader: &SourceReader,
    t: &crate::format::Tensor,
    device: &mut dyn Device,
    alloc: Option<usize>,
    check: &mut ShardCheck<'_>,
    progress: &Progress,
    cancel: Cancel,
) -> Result<Streamed, ValidateError> {
    // Polled before every fill: one tensor can be many GB.
    let poll = || {
        if cancel.is_set() {
            return Err(ValidateError::Interrupted {
                path: reader.file(t.file).1.to_path_buf(),
            });
        }
        Ok(())
    };
    let cap = device.staging().map_err(device_err)?.len();
    let fill = device.fill_len(cap).clamp(1, cap.max(1));
    let mut stream = reader.tensor_bytes(t);
    let mut hash = Xxh3::new();
    if let Some(memory) = alloc.and_then(|h| device.host_memory(h)) {
        let memory = usize::try_from(t.len)
            .ok()
            .and_then(|len| memory.get_mut(..len))
            .ok_or_else(|| {
                device_err(DeviceError::Driver(format!(
                    "tensor {:?}: the allocation is shorter than its {} bytes",
                    t.name, t.len
                )))
            })?;
        let mut done = 0u64;
        for piece in memory.chunks_mut(fill) {
            poll()?;
            // Ask for this fill and the next as one request, so a cold
            // file streams from the disk while this one is hashed.
            if let crate::format::DataRef::Contiguous { offset } = t.data {
                let ahead = (2 * piece.len() as u64).min(t.len - done);
                crate::platform::will_need(reader.file(t.file).0, offset + done, ahead);
            }
            reader.read_chunk(t, &mut stream, piece)?;
            hash_fill(check, &mut hash, piece);
            progress.advance(piece.len() as u64);
            done += piece.len() as u64;
        }
        return Ok(Streamed {
            xxh3: hash.digest(),
            in_place: true,
        });
    }
    let mut done = 0u64;
    while done < t.len {
        poll()?;
        let staging = device.staging().map_err(device_err)?;
        let n = usize::try_from(t.len - done)
            .unwrap_or(usize::MAX)
            .min(fill);
        reader.read_chunk(t, &mut stream, &mut staging[..n])?;
        device
            .upload_beside(alloc, done, n, &mut |bytes| {
                hash_fill(check, &mut hash, bytes)
            })
            .map_err(device_err)?;
        progress.advance(n as u64);
        done += n as u64;
    }
    Ok(Streamed {
        xxh3: hash.digest(),
        in_place: false,
    })
}

/// Feeds one fill to the shard digest and to the tensor's xxh3: on two
/// threads at once when there is a digest and the fill is large enough.
fn hash_fill(check: &mut ShardCheck<'_>, hash: &mut Xxh3, bytes: &[u8]) {
    if check.active() && bytes.len() >= PARALLEL_MIN {
        rayon::join(|| check.update(bytes), || hash.update(bytes));
    } else {
        check.update(bytes);
        hash.update(bytes);
    }
}

/// Fills smaller than this are hashed on one thread: handing them to
/// another costs more than it saves.
const PARALLEL_MIN: usize = super::device::PARALLEL_MIN;

#[cfg(test)]
#[path = "own_tests.rs"]
mod tests;
