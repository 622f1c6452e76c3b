//! Fuzzing entry points, shared by the cargo-fuzz targets in fuzz/ and by the
//! test that replays the saved corpus (tests/cli/fuzz_corpus.rs), so CI
//! exercises the same code without a fuzzer.
//!
//! Each function feeds arbitrary bytes to one parser or planner and panics
//! only when an invariant breaks: a parser may refuse input, never crash, and
//! whatever it accepts must be self-consistent.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};

use crate::format::{self, Checkpoint, DataRef, Dtype, Format, Layout, SourceFile, Tensor};
use crate::plan::order::Order;
use crate::plan::PlanOptions;

/// The safetensors header parser: accepted headers tile their data exactly.
pub fn safetensors_header(data: &[u8]) {
    let Ok(header) = format::safetensors::parse_header(Path::new("fuzz.safetensors"), data) else {
        return;
    };
    let mut cursor = 0;
    let mut names = HashSet::new();
    for t in &header.tensors {
        assert_eq!(t.begin, cursor, "accepted a hole or overlap at {}", t.name);
        assert_length_matches_shape(&t.name, t.dtype, &t.shape, t.end - t.begin);
        assert!(names.insert(&t.name), "accepted a duplicate {}", t.name);
        cursor = t.end;
    }
    assert_eq!(cursor, header.data_len);
}

/// The GGUF header parser: accepted tensors are aligned, in info order
/// without overlap, inside the bytes, with lengths that match their shapes
/// and types; names and keys are unique and every key can be looked up.
pub fn gguf_header(data: &[u8]) {
    let Ok(file) = format::gguf::parse_bytes(data) else {
        return;
    };
    assert!(file.alignment.is_power_of_two());
    assert_eq!(file.data_start % file.alignment, 0);
    let mut names = HashSet::new();
    let mut end = file.data_start;
    for t in &file.tensors {
        assert!(names.insert(&t.name), "accepted a duplicate {}", t.name);
        assert!(t.offset >= end, "accepted an overlap at {}", t.name);
        assert_eq!(
            (t.offset - file.data_start) % file.alignment,
            0,
            "{}",
            t.name
        );
        let numel = t
            .shape
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d))
            .expect("accepted an overflowing shape");
        if let Some(layout) = t.ggml_type.layout() {
            assert_eq!(layout.byte_len(numel), t.len, "wrong length for {}", t.name);
        }
        end = t.offset + t.len.unwrap_or(0);
        assert!(end <= data.len() as u64, "{} points past the end", t.name);
    }
    for (key, value) in file.metadata.iter() {
        assert!(
            std::ptr::eq(file.metadata.get(key).unwrap(), value),
            "lookup of {key}"
        );
    }
}

/// What every reader promises: the byte length is exactly shape x dtype,
/// computed without overflow.
fn assert_length_matches_shape(name: &str, dtype: Dtype, shape: &[u64], len: u64) {
    let numel = shape
        .iter()
        .try_fold(1u64, |a, &d| a.checked_mul(d))
        .expect("accepted an overflowing shape");
    assert_eq!(
        dtype.byte_len(numel),
        Some(len),
        "accepted a wrong length for {name}"
    );
}

/// The index parser: accepted weight maps name plain files only.
pub fn index_json(data: &[u8]) {
    let Ok(index) = format::index::parse_index(Path::new("fuzz.index.json"), data) else {
        return;
    };
    for (_, file) in &index.weight_map {
        assert!(
            !file.contains('/') && file != ".." && !file.is_empty(),
            "accepted {file:?}"
        );
    }
}

/// The PyTorch zip reader and restricted pickle machine: accepted tensors
/// point inside the file, with lengths that match their shapes.
pub fn pytorch(data: &[u8]) {
    let Ok((tensors, _)) = format::pytorch::read_bytes(data) else {
        return;
    };
    for t in &tensors {
        assert_length_matches_shape(&t.name, t.dtype, &t.shape, t.len);
        if let DataRef::Contiguous { offset } = t.data {
            let end = offset.checked_add(t.len).expect("offset overflow accepted");
            assert!(end <= data.len() as u64, "{} points past the end", t.name);
        }
    }
}

/// The restricted pickle machine alone, under a small budget (1 MiB, 1,000
/// stack values and memo entries) so that fuzzing reaches the budget's
/// edges, and under the budget `data.pkl` of this length would get: any
/// bytes end in a value or an error, never a panic or an abort, and the
/// bytes charged never pass the budget.
pub fn pickle(data: &[u8]) {
    use format::pytorch::pickle::{run_counted, Limits};
    let small = Limits {
        stack: 1_000,
        memo: 1_000,
        bytes: 1 << 20,
    };
    for limits in [small, Limits::for_len(data.len())] {
        let (result, held) = run_counted(data, limits);
        assert!(held <= limits.bytes, "charged {held} of {}", limits.bytes);
        if let Ok(root) = result {
            let _ = format::pytorch::state::state_dict(&root);
        }
    }
}

/// The planner: every tensor exactly once, limits respected, offsets aligned
/// and contiguous, for any tensor list, limit and order.
pub fn planner(data: &[u8]) {
    if data.len() < 3 {
        return;
    }
    let limit = u64::from(u16::from_le_bytes([data[0], data[1]])) + 1;
    let order = match data[2] % 3 {
        0 => Order::Forward,
        1 => Order::Natural,
        _ => Order::Source,
    };
    let ck = synthetic_checkpoint(&data[3..]);
    let options = PlanOptions {
        max_shard_size: limit,
        order,
        dtype: (data[2] & 4 != 0).then_some(Dtype::BF16),
        ..PlanOptions::default()
    };
    let plan = crate::write::format::plan(&ck, &options).expect("a plan for valid tensors");
    let mut seen = HashSet::new();
    for shard in &plan.shards {
        let mut offset = 0;
        for t in &shard.tensors {
            assert!(
                seen.insert(t.input.primary()),
                "tensor {} planned twice",
                t.name
            );
            assert_eq!(t.offset, offset, "hole in {}", shard.file);
            assert_eq!(t.offset % t.dtype.alignment(), 0, "{} misaligned", t.name);
            offset += t.len;
        }
        assert_eq!(offset, shard.data_len);
        assert!(
            shard.data_len <= limit || shard.tensors.len() == 1,
            "{} over the limit",
            shard.file
        );
    }
    assert_eq!(seen.len(), ck.tensors.len(), "tensors dropped");
    assert_eq!(plan.layer_order.len(), ck.tensors.len());
}

/// Tensors with Llama-like names decoded from bytes, three bytes a tensor.
fn synthetic_checkpoint(data: &[u8]) -> Checkpoint {
    const DTYPES: [Dtype; 6] = [
        Dtype::F32,
        Dtype::BF16,
        Dtype::F16,
        Dtype::I64,
        Dtype::U8,
        Dtype::F64,
    ];
    let mut tensors = Vec::new();
    let mut names = HashSet::new();
    for (i, c) in data.chunks_exact(3).enumerate() {
        let name = match c[0] % 5 {
            0 => format!("model.embed_tokens.w{i}"),
            1 => format!("lm_head.w{i}"),
            2 => format!("model.norm.w{i}"),
            _ => format!(
                "model.layers.{}.mlp.experts.{}.w{i}",
                c[0] / 5 % 12,
                c[1] % 4
            ),
        };
        if !names.insert(name.clone()) {
            continue;
        }
        let dtype = DTYPES[usize::from(c[1] / 4) % DTYPES.len()];
        let shape = vec![u64::from(c[2]), 3];
        let len = dtype.byte_len(shape.iter().product()).unwrap_or(0);
        tensors.push(Tensor {
            name,
            dtype,
            shape,
            len,
            file: 0,
            data: DataRef::Contiguous { offset: 0 },
        });
    }
    Checkpoint {
        dir: PathBuf::from("fuzz"),
        format: Format::Safetensors,
        layout: Layout::Single,
        prefix: "model".into(),
        files: vec![SourceFile {
            path: PathBuf::from("fuzz.safetensors"),
            size: 0,
            mtime_ns: 0,
        }],
        tensors,
        metadata: BTreeMap::new(),
        findings: Vec::new(),
    }
}

/// The manifest and report readers: a manifest that parses has every list
/// within its cap and reads back as itself from what reshard would write;
/// the report probe never panics.
pub fn manifests(data: &[u8]) {
    let _ = crate::write::scope::is_report_bytes(data);
    let Ok(manifest) = crate::write::manifest::Manifest::parse(data) else {
        return;
    };
    use crate::write::capped::MAX_FILES;
    assert!(manifest.copied_files.len() <= MAX_FILES);
    assert!(manifest.files.len() <= MAX_FILES);
    assert!(manifest.copied_sources.len() <= MAX_FILES);
    assert!(manifest.shards.len() <= format::MAX_TENSORS);
    for s in &manifest.shards {
        assert!(s.tensors.len() <= format::MAX_TENSORS);
    }
    let again = crate::write::manifest::Manifest::parse(&manifest.to_json())
        .expect("a manifest reshard writes reads back");
    assert_eq!(again, manifest);
}
