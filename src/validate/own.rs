//! reshard's own loader: shard by shard in layer order, every tensor goes
//! through one staging buffer of bounded size into a device allocation, is
//! read back and compared.
//!
//! Devices implement [`Device`]; the CPU stand-in and CUDA
//! ([`super::device`]) run the same code path. The staging buffer belongs to
//! the device (pinned host memory on CUDA) and is allocated once, after the
//! commit baseline, so it counts in the peak. Every allocation is fallible:
//! under a commit budget an allocation past it is a [`Failure::OverBudget`],
//! never an abort.

use std::fs::File;
use std::time::Instant;

use crate::write::digest::Xxh3;

use super::device::{staging_len, Device, DeviceError};
use super::integrity::{Expected, ShardCheck};
use super::ledger::CommitLedger;
use super::report::{Failure, ShardTiming, ValidateReport, VramFit};
use super::{ValidateError, ValidateOptions};
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
        Ok(()) => {}
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
    let fit = options.vram_budget.map(|b| vram_fit(ck, b));
    report.vram = fit.clone();
    let mut vram_refused = false;
    let mut cumulative = 0u64;
    for &file in order {
        let started = Instant::now();
        let name = ck.files[file].name();
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
                        report.fail(Failure::VramBudget {
                            shard: name.clone(),
                            tensor: t.name.clone(),
                            fit: fit.clone(),
                        });
                    }
                }
                if !vram_refused {
                    match device.alloc(t.len) {
                        Ok(h) => alloc = Some(h),
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
                            return Ok(());
                        }
                        Err(DeviceError::OutOfMemory { .. }) => {
                            vram_refused = true;
                            let total = report.device.total_memory.unwrap_or(cumulative);
                            let fit = fit.clone().unwrap_or_else(|| vram_fit(ck, total));
                            report.vram = Some(fit.clone());
                            report.fail(Failure::VramBudget {
                                shard: name.clone(),
                                tensor: t.name.clone(),
                                fit,
                            });
                        }
                        Err(e) => {
                            return Err(ValidateError::Cuda {
                                reason: format!("tensor {:?}: {e}", t.name),
                            })
                        }
                    }
                    ledger.sample();
                }
            }
            if alloc.is_some() {
                cumulative += t.len;
                report.device_bytes = cumulative;
                report.device_peak_held = report.device_peak_held.max(device.held());
            }
            let file_hash = stream_tensor(&reader, t, device, alloc, &mut check)?;
            expect.check_tensor(ck, i, file_hash, &mut report.failures);
            if let Some(h) = alloc {
                if device.readback_hash(h, t.len).map_err(device_err)? != file_hash {
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
    Ok(())
}

fn device_err(e: DeviceError) -> ValidateError {
    ValidateError::Cuda {
        reason: e.to_string(),
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

/// Streams a tensor's bytes through staging (and to the device when
/// `alloc` is given); returns the xxh3 of the file bytes.
///
/// Each fill of staging is at most [`Device::fill_len`]; the shard digest
/// and the xxh3 take it on two threads at once, beside the upload
/// ([`Device::upload_beside`]: on the CPU stand-in the copy is a third
/// task, and rayon spreads the three over the cores there are).
fn stream_tensor(
    reader: &SourceReader,
    t: &crate::format::Tensor,
    device: &mut dyn Device,
    alloc: Option<usize>,
    check: &mut ShardCheck<'_>,
) -> Result<u64, ValidateError> {
    let mut stream = reader.tensor_bytes(t);
    let mut hash = Xxh3::new();
    let mut done = 0u64;
    while done < t.len {
        let cap = device.staging().map_err(device_err)?.len();
        let fill = device.fill_len(cap).clamp(1, cap.max(1));
        let staging = device.staging().map_err(device_err)?;
        let n = usize::try_from(t.len - done)
            .unwrap_or(usize::MAX)
            .min(fill);
        reader.read_chunk(t, &mut stream, &mut staging[..n])?;
        let mut hashes = |bytes: &[u8]| {
            if check.active() && bytes.len() >= PARALLEL_MIN {
                rayon::join(|| check.update(bytes), || hash.update(bytes));
            } else {
                check.update(bytes);
                hash.update(bytes);
            }
        };
        device
            .upload_beside(alloc, done, n, &mut hashes)
            .map_err(device_err)?;
        done += n as u64;
    }
    Ok(hash.digest())
}

/// Fills smaller than this are hashed on one thread: handing them to
/// another costs more than it saves.
const PARALLEL_MIN: usize = super::device::PARALLEL_MIN;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{Dtype, Format, Layout, SourceFile, Tensor};
    use std::path::PathBuf;

    fn ck(tensors: &[(&str, u64, usize)]) -> Checkpoint {
        let files = (0..=tensors.iter().map(|t| t.2).max().unwrap_or(0))
            .map(|i| SourceFile {
                path: PathBuf::from(format!("f{i}")),
                size: 0,
                mtime_ns: 0,
            })
            .collect();
        Checkpoint {
            dir: PathBuf::from("."),
            format: Format::Safetensors,
            layout: Layout::Loose,
            prefix: "model".into(),
            files,
            tensors: tensors
                .iter()
                .map(|&(name, len, file)| Tensor {
                    name: name.into(),
                    dtype: Dtype::U8,
                    shape: vec![len],
                    len,
                    file,
                    data: DataRef::Contiguous { offset: 0 },
                })
                .collect(),
            metadata: Default::default(),
            findings: vec![],
        }
    }

    #[test]
    fn counts_leading_blocks_that_fit() {
        let c = ck(&[
            ("model.embed_tokens.weight", 10, 0),
            ("model.layers.0.a", 10, 0),
            ("model.layers.0.b", 10, 0),
            ("model.layers.1.a", 10, 1),
            ("model.layers.1.b", 10, 1),
            ("model.layers.2.a", 10, 1),
            ("lm_head.weight", 10, 1),
        ]);
        assert_eq!(vram_fit(&c, 5).blocks_fit, 0);
        assert_eq!(vram_fit(&c, 30).blocks_fit, 1);
        assert_eq!(vram_fit(&c, 40).blocks_fit, 1);
        assert_eq!(vram_fit(&c, 50).blocks_fit, 2);
        let all = vram_fit(&c, 1000);
        assert_eq!((all.blocks_fit, all.blocks_total, all.needed), (3, 3, 70));
    }

    #[test]
    fn orders_shards_by_their_first_layer() {
        let c = ck(&[
            ("model.layers.10.a", 1, 0),
            ("model.layers.2.a", 1, 1),
            ("model.embed_tokens.weight", 1, 2),
        ]);
        assert_eq!(shard_order(&c), vec![2, 1, 0]);
    }

    use crate::validate::device::cpu::CpuDevice;
    use crate::validate::report::DeviceInfo;
    use crate::write::digest::{DigestAlgo, ShardHasher};
    use crate::write::manifest::ShardRecord;

    /// The CPU device, except that after allocation `corrupt` of a shard is
    /// uploaded, its first byte in device memory is flipped.
    struct Corrupting {
        inner: CpuDevice,
        corrupt: Option<usize>,
    }

    impl Device for Corrupting {
        fn info(&self) -> DeviceInfo {
            self.inner.info()
        }
        fn prepare(&mut self) -> Result<(), DeviceError> {
            self.inner.prepare()
        }
        fn staging(&mut self) -> Result<&mut [u8], DeviceError> {
            self.inner.staging()
        }
        fn alloc(&mut self, len: u64) -> Result<usize, DeviceError> {
            self.inner.alloc(len)
        }
        fn upload(&mut self, alloc: usize, offset: u64, len: usize) -> Result<(), DeviceError> {
            self.inner.upload(alloc, offset, len)
        }
        fn upload_beside(
            &mut self,
            alloc: Option<usize>,
            offset: u64,
            len: usize,
            beside: &mut (dyn FnMut(&[u8]) + Send),
        ) -> Result<(), DeviceError> {
            self.inner.upload_beside(alloc, offset, len, beside)?;
            if let Some(h) = alloc.filter(|&h| Some(h) == self.corrupt && offset == 0) {
                // Staging still holds the byte just uploaded to offset 0.
                self.inner.staging()?[0] ^= 0xff;
                self.inner.upload(h, 0, 1)?;
            }
            Ok(())
        }
        fn download(&mut self, alloc: usize, offset: u64, len: usize) -> Result<(), DeviceError> {
            self.inner.download(alloc, offset, len)
        }
        fn readback_hash(&mut self, alloc: usize, len: u64) -> Result<u64, DeviceError> {
            self.inner.readback_hash(alloc, len)
        }
        fn fill_len(&self, staging_len: usize) -> usize {
            self.inner.fill_len(staging_len)
        }
        fn end_shard(&mut self) {
            self.inner.end_shard()
        }
        fn held(&self) -> u64 {
            self.inner.held()
        }
    }

    fn load_fixture(corrupt: Option<usize>) -> ValidateReport {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-llama");
        let c = crate::format::open(&path).unwrap();
        let options = ValidateOptions::default();
        let mut report = ValidateReport::new(&path, &options);
        let expect = Expected::new(&c, None, &mut report.failures);
        let mut device = Corrupting {
            inner: CpuDevice::new(staging_len(options.staging, &c)),
            corrupt,
        };
        report.device = device.info();
        let mut ledger = CommitLedger::start();
        let order = shard_order(&c);
        run(
            &c,
            &order,
            &mut device,
            &options,
            &expect,
            &mut ledger,
            &mut report,
        )
        .unwrap();
        report
    }

    #[test]
    fn a_corrupted_device_copy_fails_the_readback() {
        let sound = load_fixture(None);
        assert!(sound.failures.is_empty(), "{:?}", sound.failures);
        assert!(sound.bytes_loaded > 0);
        let report = load_fixture(Some(1));
        match &report.failures[..] {
            [Failure::Readback { file, device, .. }] => {
                assert_eq!(
                    (file.as_str(), device.as_str()),
                    ("model.safetensors", "cpu")
                )
            }
            other => panic!("{other:?}"),
        }
    }

    /// A safetensors file of one `U8` tensor per length, with the bytes
    /// `i * 31 % 253` throughout.
    fn write_safetensors(path: &std::path::Path, lens: &[u64]) {
        let mut header = serde_json::Map::new();
        let mut at = 0u64;
        for (i, &len) in lens.iter().enumerate() {
            header.insert(
                format!("t{i}"),
                serde_json::json!({"dtype": "U8", "shape": [len], "data_offsets": [at, at + len]}),
            );
            at += len;
        }
        let data: Vec<u8> = (0..at).map(|i| (i * 31 % 253) as u8).collect();
        let header = serde_json::Value::Object(header);
        crate::format::safetensors::write_test_file(path, &header, &[&data]);
    }

    #[test]
    fn hashing_beside_the_upload_gives_the_whole_file_digest() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("model.safetensors");
        // Several fills of a CPU device (1 MiB), one short of a fill, and
        // one below the size hashed on two threads.
        write_safetensors(&file, &[(3 << 20) + 5, 100 << 10, 7]);
        let c = crate::format::open(dir.path()).unwrap();
        let whole = std::fs::read(&file).unwrap();
        let reader = SourceReader::open(&c).unwrap();
        for algo in [DigestAlgo::Blake3, DigestAlgo::Sha256] {
            let mut h = ShardHasher::new(algo);
            h.update(&whole);
            let mut record = ShardRecord {
                file: "model.safetensors".into(),
                size: whole.len() as u64,
                digest: h.finish(),
                tensors: vec![],
            };
            for flip in [false, true] {
                if flip {
                    // A digest the bytes do not have must fail.
                    let mut h = ShardHasher::new(algo);
                    h.update(b"other bytes");
                    record.digest = h.finish();
                }
                let mut device = CpuDevice::new(staging_len(64 << 20, &c));
                device.prepare().unwrap();
                let raw = File::open(&file).unwrap();
                let mut check = ShardCheck::new(Some(&record));
                let mut tensors: Vec<usize> = (0..c.tensors.len()).collect();
                tensors.sort_by_key(|&i| c.tensors[i].offset());
                for i in tensors {
                    let t = &c.tensors[i];
                    hash_raw(&mut device, &raw, &file, &mut check, t.offset()).unwrap();
                    let alloc = device.alloc(t.len).unwrap();
                    let xxh =
                        stream_tensor(&reader, t, &mut device, Some(alloc), &mut check).unwrap();
                    let start = t.offset() as usize;
                    let want = crate::write::digest::xxh3_64(&whole[start..start + t.len as usize]);
                    assert_eq!(xxh, want, "{}", t.name);
                    assert_eq!(device.readback_hash(alloc, t.len).unwrap(), want);
                }
                hash_raw(&mut device, &raw, &file, &mut check, record.size).unwrap();
                let mut failures = vec![];
                check.finish(&mut failures);
                assert_eq!(failures.is_empty(), !flip, "{algo:?}: {failures:?}");
            }
        }
    }

    #[test]
    fn staging_is_capped_by_the_largest_tensor() {
        let c = ck(&[("a", 10_000, 0)]);
        assert_eq!(staging_len(64 << 20, &c), 12_288);
        assert_eq!(staging_len(100, &c), 4096);
    }
}
