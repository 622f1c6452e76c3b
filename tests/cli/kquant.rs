//! reshard's Q4_K and Q6_K quantizers against libggml's, byte for byte:
//! kquant_oracle.py quantizes a few hundred rows (normal, heavy-tailed,
//! outliers, zeros, constants, tiny, subnormal, huge, exact ties) with
//! `ggml_quantize_chunk` from llama-cpp-python's libggml-base, and every
//! block must match ours.
//!
//! Needs `RESHARD_GGML_PYTHON`: a Python with llama-cpp-python and numpy
//! (scripts/lib/ggml-venv.sh builds one from tests/requirements-ggml.txt
//! and prints its path). Without it the test skips.

use std::path::Path;

use reshard::cast::gguf::kquantize::{quantize_q4_k, quantize_q6_k, KQuantError, QK_K};

use crate::common::*;

type Quantizer = fn(&[f32], &mut [u8]) -> Result<(), KQuantError>;

/// Quantizes `rows` with `quantize` and compares with ggml's `theirs`,
/// naming the first differing row, block and byte. Returns the blocks
/// compared.
fn compare(
    name: &str,
    quantize: Quantizer,
    bytes: usize,
    rows: &[f32],
    row: usize,
    theirs: &[u8],
) -> usize {
    let per_row = row / QK_K * bytes;
    assert_eq!(
        theirs.len(),
        rows.len() / row * per_row,
        "{name}: oracle size"
    );
    let mut ours = vec![0u8; per_row];
    let mut mismatched = Vec::new();
    for (r, (x, t)) in rows
        .chunks_exact(row)
        .zip(theirs.chunks_exact(per_row))
        .enumerate()
    {
        quantize(x, &mut ours).unwrap();
        for (b, (o, t)) in ours
            .chunks_exact(bytes)
            .zip(t.chunks_exact(bytes))
            .enumerate()
        {
            if let Some(i) = o.iter().zip(t).position(|(a, b)| a != b) {
                mismatched.push(format!(
                    "row {r} block {b} byte {i}: ours {:#04x} ggml {:#04x}",
                    o[i], t[i]
                ));
            }
        }
    }
    assert!(
        mismatched.is_empty(),
        "{name}: {} blocks differ from ggml, first: {:?}",
        mismatched.len(),
        &mismatched[..mismatched.len().min(5)]
    );
    theirs.len() / bytes
}

fn read_f32s(path: &Path) -> Vec<f32> {
    let bytes = std::fs::read(path).unwrap();
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

#[test]
fn q4_k_and_q6_k_match_ggml_byte_for_byte() {
    let Some(python) = ggml_python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cli/kquant_oracle.py");
    let out = run_python(&python, Program::Script(&script), &[dir.path()]);
    let info: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let row = info["row"].as_u64().unwrap() as usize;
    let rows = read_f32s(&dir.path().join("rows.f32"));
    assert_eq!(rows.len(), info["rows"].as_u64().unwrap() as usize * row);
    assert!(
        rows.iter().all(|v| v.is_finite()),
        "the oracle's rows are finite"
    );
    for (name, quantize, bytes) in [
        ("q4_k", quantize_q4_k as Quantizer, 144),
        ("q6_k", quantize_q6_k as Quantizer, 210),
    ] {
        let theirs = std::fs::read(dir.path().join(format!("{name}.bin"))).unwrap();
        let blocks = compare(name, quantize, bytes, &rows, row, &theirs);
        eprintln!(
            "{name}: {blocks} blocks ({} values) identical to ggml",
            blocks * QK_K
        );
    }
}
