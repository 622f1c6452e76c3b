//! Tests of [`super`]: layer order, the VRAM fit, and both paths a tensor
//! takes into the device (through staging, and in place).

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
use crate::write::digest::{xxh3_64, DigestAlgo, ShardHasher};
use crate::write::manifest::{Manifest, ShardRecord, MANIFEST};
use std::path::Path;

/// The CPU device without its host memory ([`Device::host_memory`] is the
/// default, `None`), so every tensor takes the staging path; and after
/// allocation `corrupt` of a shard is uploaded, its first byte in device
/// memory is flipped.
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

/// Which path the tensors of a test load take.
#[derive(Clone, Copy, Debug)]
enum Via {
    /// The CPU device as it is: read into its memory in place.
    InPlace,
    /// Through staging ([`Corrupting`]), corrupting that allocation.
    Staging(Option<usize>),
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// The own loader's report on the checkpoint at `path`, against its
/// reshard.json if it has one, with the shard timings zeroed so that two
/// reports compare.
fn load(path: &Path, via: Via, options: &ValidateOptions) -> ValidateReport {
    let c = crate::format::open(path).unwrap();
    let mut report = try_load(&c, via, options).unwrap();
    for shard in &mut report.shards {
        shard.seconds = 0.0;
    }
    report
}

fn try_load(
    c: &Checkpoint,
    via: Via,
    options: &ValidateOptions,
) -> Result<ValidateReport, ValidateError> {
    let manifest = Manifest::read(&c.dir.join(MANIFEST)).unwrap();
    let mut report = ValidateReport::new(&c.dir, options);
    let expect = Expected::new(c, manifest.as_ref(), &mut report.failures);
    let cpu = CpuDevice::new(staging_len(options.staging, c));
    let mut device: Box<dyn Device> = match via {
        Via::InPlace => Box::new(cpu),
        Via::Staging(corrupt) => Box::new(Corrupting {
            inner: cpu,
            corrupt,
        }),
    };
    report.device = device.info();
    let mut ledger = CommitLedger::start();
    let order = shard_order(c);
    run(
        c,
        &order,
        device.as_mut(),
        options,
        &expect,
        &mut ledger,
        &mut report,
    )?;
    Ok(report)
}

/// Converts fixture `name` into `dst` in shards of at most 200 KiB.
fn converted(name: &str, dst: &Path) {
    let c = crate::format::open(&fixture(name)).unwrap();
    let mut options = crate::convert::ConvertOptions::default();
    options.plan.max_shard_size = 200 << 10;
    options.copy_other_files = false;
    let cancel = std::sync::atomic::AtomicBool::new(false);
    crate::convert::convert(&c, dst, &options, &crate::exec::NoReport, &cancel).unwrap();
}

#[test]
fn a_corrupted_device_copy_fails_the_readback() {
    let path = fixture("tiny-llama");
    let options = ValidateOptions::default();
    let sound = load(&path, Via::Staging(None), &options);
    assert!(sound.failures.is_empty(), "{:?}", sound.failures);
    assert!(sound.bytes_loaded > 0);
    let report = load(&path, Via::Staging(Some(1)), &options);
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

#[test]
fn reading_in_place_gives_the_report_staging_gives() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    converted("tiny-llama-f32-sharded", &out);
    let options = ValidateOptions::default();
    // A raw checkpoint (no manifest: the shard digests are not taken) and
    // a converted one in several shards (digests, and the CPU device's
    // reuse of released allocations from one shard to the next).
    for path in [fixture("tiny-llama"), out.clone()] {
        let in_place = load(&path, Via::InPlace, &options);
        assert!(in_place.failures.is_empty(), "{:?}", in_place.failures);
        assert!(in_place.bytes_loaded > 0 && in_place.device_peak_held > 0);
        assert_eq!(in_place, load(&path, Via::Staging(None), &options));
    }
    assert!(load(&out, Via::InPlace, &options).shards.len() > 2);

    // Every tensor's xxh3, as each path takes it: a manifest that gets
    // them all wrong makes both name every actual one.
    let manifest_path = out.join(MANIFEST);
    let mut manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&manifest_path).unwrap()).unwrap();
    let mut listed = 0;
    for shard in manifest["shards"].as_array_mut().unwrap() {
        for t in shard["tensors"].as_array_mut().unwrap() {
            t["xxh3"] = "0000000000000000".into();
            listed += 1;
        }
    }
    std::fs::write(&manifest_path, serde_json::to_vec(&manifest).unwrap()).unwrap();
    let in_place = load(&out, Via::InPlace, &options);
    let checksums = in_place
        .failures
        .iter()
        .filter(|f| matches!(f, Failure::TensorChecksum { .. }))
        .count();
    assert_eq!((checksums, in_place.failures.len()), (listed, listed));
    assert_eq!(in_place, load(&out, Via::Staging(None), &options));
}

#[test]
fn tensors_past_the_vram_budget_take_staging_and_report_the_same() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    converted("tiny-llama-f32-sharded", &out);
    let total: u64 = crate::format::open(&out)
        .unwrap()
        .tensors
        .iter()
        .map(|t| t.len)
        .sum();
    let options = ValidateOptions {
        vram_budget: Some(total / 2),
        ..ValidateOptions::default()
    };
    let in_place = load(&out, Via::InPlace, &options);
    // The refused tensors are still read and checked against the
    // manifest (their shard digests pass), but not held.
    match &in_place.failures[..] {
        [Failure::VramBudget { .. }] => {}
        other => panic!("{other:?}"),
    }
    assert!(in_place.device_bytes <= total / 2);
    assert_eq!(in_place.bytes_loaded, total);
    assert_eq!(in_place, load(&out, Via::Staging(None), &options));
}

#[test]
fn a_shard_unlike_its_manifest_fails_naming_the_tensor_in_place() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    converted("tiny-llama", &out);
    let c = crate::format::open(&out).unwrap();
    let victim = c
        .tensors
        .iter()
        .find(|t| t.name == "model.layers.0.self_attn.q_proj.weight")
        .unwrap();
    let file = c.files[victim.file].name();
    let manifest = Manifest::read(&out.join(MANIFEST)).unwrap().unwrap();
    let expected = manifest
        .shards
        .iter()
        .flat_map(|s| &s.tensors)
        .find(|t| t.name == victim.name)
        .unwrap()
        .xxh3
        .clone();
    let path = out.join(&file);
    let mut bytes = std::fs::read(&path).unwrap();
    let start = victim.offset() as usize;
    bytes[start + 5] ^= 0x40;
    std::fs::write(&path, &bytes).unwrap();
    let actual = format!(
        "{:016x}",
        xxh3_64(&bytes[start..start + victim.len as usize])
    );
    assert_ne!(actual, expected);

    let options = ValidateOptions::default();
    let report = load(&out, Via::InPlace, &options);
    match &report.failures[..] {
        [Failure::TensorChecksum {
            file: f,
            tensor,
            expected: e,
            actual: a,
        }, Failure::ShardChecksum { file: g, .. }] => {
            assert_eq!((f, tensor, e, a), (&file, &victim.name, &expected, &actual));
            assert_eq!(g, &file);
        }
        other => panic!("{other:?}"),
    }
    // Through staging the device copy matches the file, so the failures
    // are the same ones, with no readback failure.
    assert_eq!(report, load(&out, Via::Staging(None), &options));
}

#[test]
fn a_file_that_ends_inside_a_tensor_is_an_error_naming_it_and_the_tensor() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    converted("tiny-llama", &out);
    let mut c = crate::format::open(&out).unwrap();
    let last = c.tensors.iter().max_by_key(|t| t.offset()).unwrap().clone();
    let path = c.files[last.file].path.clone();
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.set_len(last.offset() + last.len / 2).unwrap();
    // As if it had been cut after the header was read, and stood still
    // since: the load itself must meet the short read.
    c.files[last.file] = crate::format::SourceFile::stat(&path).unwrap();
    for via in [Via::InPlace, Via::Staging(None)] {
        let err = try_load(&c, via, &ValidateOptions::default()).unwrap_err();
        let text = err.to_string();
        assert!(
            matches!(&err, ValidateError::Format(FormatError::BadData { tensor, .. }) if *tensor == last.name),
            "{via:?}: {text}"
        );
        assert!(text.contains(&c.files[last.file].name()), "{via:?}: {text}");
    }
}

/// A safetensors file of one `U8` tensor per length, with the bytes
/// `i * 31 % 253` throughout.
fn write_safetensors(path: &Path, lens: &[u64]) {
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
fn hashing_each_fill_gives_the_whole_file_digest_on_both_paths() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("model.safetensors");
    // Several fills of a CPU device, one short of a fill, and one below
    // the size hashed on two threads.
    let fill = CpuDevice::new(0).fill_len(usize::MAX) as u64;
    write_safetensors(&file, &[3 * fill + 5, 100 << 10, 7]);
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
            for via in [Via::InPlace, Via::Staging(None)] {
                let cpu = CpuDevice::new(staging_len(64 << 20, &c));
                let mut device: Box<dyn Device> = match via {
                    Via::InPlace => Box::new(cpu),
                    Via::Staging(corrupt) => Box::new(Corrupting {
                        inner: cpu,
                        corrupt,
                    }),
                };
                device.prepare().unwrap();
                let raw = File::open(&file).unwrap();
                let mut check = ShardCheck::new(Some(&record));
                let mut tensors: Vec<usize> = (0..c.tensors.len()).collect();
                tensors.sort_by_key(|&i| c.tensors[i].offset());
                for i in tensors {
                    let t = &c.tensors[i];
                    hash_raw(device.as_mut(), &raw, &file, &mut check, t.offset()).unwrap();
                    let alloc = device.alloc(t.len).unwrap();
                    let streamed = stream_tensor(
                        &reader,
                        t,
                        device.as_mut(),
                        Some(alloc),
                        &mut check,
                        &Progress::default(),
                        Cancel::default(),
                    )
                    .unwrap();
                    let start = t.offset() as usize;
                    let want = xxh3_64(&whole[start..start + t.len as usize]);
                    let in_place = matches!(via, Via::InPlace);
                    let got = Streamed {
                        xxh3: want,
                        in_place,
                    };
                    assert_eq!(streamed, got, "{via:?} {}", t.name);
                    // The digest took the tensor as it streamed (else the
                    // next `hash_raw` would read it a second time).
                    assert_eq!(check.pos, t.offset() + t.len, "{via:?} {}", t.name);
                    // Either way the device copy holds the file's bytes.
                    assert_eq!(device.readback_hash(alloc, t.len).unwrap(), want);
                }
                hash_raw(device.as_mut(), &raw, &file, &mut check, record.size).unwrap();
                let mut failures = vec![];
                check.finish(&mut failures);
                assert_eq!(failures.is_empty(), !flip, "{algo:?} {via:?}: {failures:?}");
            }
        }
    }
}

#[test]
fn a_tensor_without_an_allocation_is_hashed_through_staging() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("model.safetensors");
    let fill = CpuDevice::new(0).fill_len(usize::MAX) as u64;
    write_safetensors(&file, &[2 * fill + 3]);
    let c = crate::format::open(dir.path()).unwrap();
    let whole = std::fs::read(&file).unwrap();
    let reader = SourceReader::open(&c).unwrap();
    let t = &c.tensors[0];
    let mut device = CpuDevice::new(staging_len(64 << 20, &c));
    device.prepare().unwrap();
    let mut check = ShardCheck::new(None);
    let streamed = stream_tensor(
        &reader,
        t,
        &mut device,
        None,
        &mut check,
        &Progress::default(),
        Cancel::default(),
    )
    .unwrap();
    let start = t.offset() as usize;
    assert_eq!(
        streamed,
        Streamed {
            xxh3: xxh3_64(&whole[start..start + t.len as usize]),
            in_place: false,
        }
    );
    assert_eq!(device.held(), 0);
}

/// Ctrl-C was looked at between tensors only, so one tensor of many GB
/// was read to its end first: it is looked at before every fill, on both
/// paths.
#[test]
fn ctrl_c_stops_a_tensor_between_fills() {
    static PRESSED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("model.safetensors");
    let fill = CpuDevice::new(0).fill_len(usize::MAX) as u64;
    write_safetensors(&file, &[2 * fill + 3]);
    let c = crate::format::open(dir.path()).unwrap();
    let reader = SourceReader::open(&c).unwrap();
    let t = &c.tensors[0];
    for in_place in [false, true] {
        let mut device = CpuDevice::new(staging_len(64 << 20, &c));
        device.prepare().unwrap();
        let alloc = in_place.then(|| device.alloc(t.len).unwrap());
        let mut check = ShardCheck::new(None);
        let cancel = Cancel::new(&PRESSED);
        let got = stream_tensor(
            &reader,
            t,
            &mut device,
            alloc,
            &mut check,
            &Progress::default(),
            cancel,
        );
        assert!(
            matches!(got, Err(ValidateError::Interrupted { ref path }) if path == &file),
            "in place {in_place}: {got:?}"
        );
    }
}

#[test]
fn staging_is_capped_by_the_largest_tensor() {
    let c = ck(&[("a", 10_000, 0)]);
    assert_eq!(staging_len(64 << 20, &c), 12_288);
    assert_eq!(staging_len(100, &c), 4096);
}

/// Records what a [`crate::exec::Reporter`] is told.
#[derive(Default)]
struct Counting {
    total: std::sync::atomic::AtomicU64,
    advanced: std::sync::atomic::AtomicU64,
    advances: std::sync::atomic::AtomicU64,
    finished: std::sync::atomic::AtomicBool,
}

impl crate::exec::Reporter for Counting {
    fn start(&self, bytes: u64) {
        self.total.store(bytes, std::sync::atomic::Ordering::SeqCst);
    }
    fn advance(&self, bytes: u64) {
        self.advanced
            .fetch_add(bytes, std::sync::atomic::Ordering::SeqCst);
        self.advances
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
    fn finish(&self) {
        self.finished
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

#[test]
fn progress_counts_every_byte_read_on_each_path() {
    use std::sync::atomic::Ordering::SeqCst;
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    converted("tiny-llama", &out);
    let against = fixture("tiny-llama");
    for (against, passes) in [(None, 1), (Some(against), 2)] {
        let full_read = Some(crate::validate::Loader::FullRead);
        for (staging, emulate) in [(64 << 20, None), (4096, None), (64 << 20, full_read)] {
            let counting = std::sync::Arc::new(Counting::default());
            let options = ValidateOptions {
                staging,
                emulate,
                against: against.clone(),
                progress: crate::validate::Progress::new(counting.clone()),
                ..ValidateOptions::default()
            };
            let report = crate::validate::validate(&out, &options).unwrap();
            assert!(report.passed, "{:?}", report.failures);
            assert!(report.bytes_loaded > 0);
            let total = counting.total.load(SeqCst);
            assert_eq!(total, passes * report.bytes_loaded, "staging {staging}");
            assert_eq!(counting.advanced.load(SeqCst), total, "staging {staging}");
            // A bar that moves: more than one report per pass.
            assert!(counting.advances.load(SeqCst) > passes);
            assert!(counting.finished.load(SeqCst));
        }
    }
}

/// An offloading load (`convert --fit --validate` of a plan that keeps
/// the leading blocks on the GPU): what follows the budget stays on the
/// host instead of failing, and the load fails only when the budget holds
/// fewer leading blocks than the plan put there.
#[test]
fn an_offloading_load_fails_only_when_the_budget_holds_too_few_leading_blocks() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    converted("tiny-llama-f32-sharded", &out);
    let c = crate::format::open(&out).unwrap();
    let total: u64 = c.tensors.iter().map(|t| t.len).sum();
    let fit = vram_fit(&c, total * 2 / 3);
    assert_eq!((fit.blocks_fit, fit.blocks_total), (1, 2), "{fit:?}");
    let options = |blocks| ValidateOptions {
        vram_budget: Some(total * 2 / 3),
        vram_leading_blocks: Some(blocks),
        ..ValidateOptions::default()
    };
    let held = load(&out, Via::Staging(None), &options(1));
    assert!(held.failures.is_empty(), "{:?}", held.failures);
    assert_eq!(held.vram.as_ref().unwrap().blocks_required, Some(1));
    assert!(held.device_bytes <= total * 2 / 3);
    assert_eq!(held.bytes_loaded, total);
    let short = load(&out, Via::Staging(None), &options(2));
    match &short.failures[..] {
        [Failure::VramBlocks { fit }] => assert_eq!(fit.blocks_fit, 1),
        other => panic!("{other:?}"),
    }
}
