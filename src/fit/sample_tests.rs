//! The sample: zeros have no estimate, every kind is visited within the
//! bound, whole units are read, and the figure follows the data.

use std::path::Path;

use super::*;
use crate::fit::sized_plan;
use crate::plan::quantize::QuantizeScheme;
use crate::plan::{OutputFormat, PlanOptions};

/// One tensor to write: name, shape, the value of element i.
type Spec<'a> = (&'a str, Vec<u64>, &'a dyn Fn(u64) -> f32);

/// A BF16 safetensors file of `tensors`.
fn write(path: &Path, tensors: &[Spec]) {
    let mut header = serde_json::Map::new();
    let mut data = Vec::new();
    for (name, shape, value) in tensors {
        let n: u64 = shape.iter().product();
        let start = data.len();
        for i in 0..n {
            let bits = value(i).to_bits();
            data.extend_from_slice(&((bits >> 16) as u16).to_le_bytes());
        }
        header.insert(
            name.to_string(),
            serde_json::json!({"dtype": "BF16", "shape": shape, "data_offsets": [start, data.len()]}),
        );
    }
    let mut json = serde_json::to_vec(&header).unwrap();
    while !json.len().is_multiple_of(8) {
        json.push(b' ');
    }
    let mut bytes = (json.len() as u64).to_le_bytes().to_vec();
    bytes.extend(json);
    bytes.extend(data);
    std::fs::write(path, bytes).unwrap();
}

fn options(quantize: Option<QuantizeScheme>) -> PlanOptions {
    PlanOptions {
        max_shard_size: u64::MAX,
        quantize,
        format: match quantize.and_then(|q| q.ggml()) {
            Some(_) => OutputFormat::Gguf,
            None => OutputFormat::Safetensors,
        },
        ..PlanOptions::default()
    }
}

fn estimate(ck: &Checkpoint, quantize: Option<QuantizeScheme>) -> Estimate {
    let plan = sized_plan(ck, &options(quantize)).unwrap();
    Sampler::new(ck).estimate(&plan).unwrap()
}

/// A pseudo-random value in (-1, 1) for element `i` of stream `seed`.
fn noise(seed: u64, i: u64) -> f32 {
    let mut s = (seed << 32 | i).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    s ^= s >> 29;
    s = s.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    s ^= s >> 32;
    (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
}

#[test]
fn an_all_zero_sample_has_no_estimate() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("zeros.safetensors");
    let zero = |_| 0.0f32;
    write(
        &path,
        &[
            ("blocks.0.attn.q.weight", vec![64, 256], &zero),
            ("blocks.1.attn.q.weight", vec![64, 256], &zero),
        ],
    );
    let ck = crate::format::open(&path).unwrap();
    for scheme in [QuantizeScheme::Fp8Scaled, QuantizeScheme::Fp8Channel] {
        let e = estimate(&ck, Some(scheme));
        assert_eq!(e.relative_rms, None, "{scheme:?}");
        assert!(e.sampled > 0 && e.changed == 2 * 64 * 256, "{e:?}");
    }
    // Nothing changed is exact, and reads nothing.
    assert_eq!(estimate(&ck, None), Estimate::EXACT);
}

#[test]
fn the_estimate_follows_the_data_and_the_form() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("noise.safetensors");
    let small = |i| 0.02 * noise(1, i);
    let large = |i| 3.0 * noise(2, i);
    write(
        &path,
        &[
            ("blocks.0.attn.q.weight", vec![128, 256], &small),
            ("blocks.1.attn.q.weight", vec![128, 256], &small),
            ("blocks.0.mlp.up.weight", vec![256, 256], &large),
            ("blocks.1.mlp.up.weight", vec![256, 256], &large),
        ],
    );
    let ck = crate::format::open(&path).unwrap();
    let scaled = estimate(&ck, Some(QuantizeScheme::Fp8Scaled));
    let plain = estimate(&ck, Some(QuantizeScheme::Fp8));
    let rms = |e: Estimate| e.relative_rms.unwrap();
    // E4M3's 3 mantissa bits: about 2-3% on uniform values, scaled or not
    // when the values lie in its normal range (these do: 0.02 and 3.0 are
    // above 2^-6 mostly), and the same sample gives the same figure.
    assert!(rms(scaled) > 0.01 && rms(scaled) < 0.05, "{scaled:?}");
    assert!(rms(plain) > 0.01 && rms(plain) < 0.1, "{plain:?}");
    assert_eq!(estimate(&ck, Some(QuantizeScheme::Fp8Scaled)), scaled);
    // The sample stays under the bound, and is not the whole model.
    assert!(scaled.fraction() > 0.0 && scaled.fraction() <= MAX_FRACTION);
    assert_eq!(scaled.changed, 2 * 128 * 256 + 2 * 256 * 256);
}

#[test]
fn plain_fp8_loses_what_falls_below_its_normal_range() {
    // Values of 1e-3 are E4M3 subnormals without a scale (its smallest
    // normal is 2^-6): plain fp8 loses far more than scaled fp8.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.safetensors");
    let tiny = |i| 1e-3 * noise(3, i);
    write(
        &path,
        &[
            ("blocks.0.ff.weight", vec![128, 512], &tiny),
            ("blocks.1.ff.weight", vec![128, 512], &tiny),
        ],
    );
    let ck = crate::format::open(&path).unwrap();
    let scaled = estimate(&ck, Some(QuantizeScheme::Fp8Scaled)).relative_rms;
    let plain = estimate(&ck, Some(QuantizeScheme::Fp8)).relative_rms;
    assert!(
        plain.unwrap() > 4.0 * scaled.unwrap(),
        "{plain:?} {scaled:?}"
    );
}

#[test]
fn every_kind_gets_units_and_the_bound_holds() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kinds.safetensors");
    let v = |i| noise(4, i);
    write(
        &path,
        &[
            // 8 rows: 5% of them rounds to none; it still gets one.
            ("blocks.0.small.weight", vec![8, 256], &v),
            ("blocks.0.big.weight", vec![512, 256], &v),
            ("blocks.1.big.weight", vec![512, 256], &v),
            ("blocks.2.big.weight", vec![512, 256], &v),
        ],
    );
    let ck = crate::format::open(&path).unwrap();
    let plan = sized_plan(&ck, &options(Some(QuantizeScheme::Fp8Channel))).unwrap();
    let targets = targets(&ck, &plan);
    let mut groups = group(&ck, &targets);
    assert_eq!(groups.len(), 2);
    let picks = pick(&targets, &mut groups);
    assert!(groups.iter().all(|g| g.picked > 0));
    // The big kind's units are spread over its three blocks.
    let big = groups.iter().find(|g| g.targets.len() == 3).unwrap();
    assert!(big.targets.iter().all(|&t| !picks[t].is_empty()));
    let sampled: u64 = targets
        .iter()
        .zip(&picks)
        .map(|(t, p)| p.iter().map(|&u| t.unit_len(u)).sum::<u64>())
        .sum();
    let total: u64 = groups.iter().map(|g| g.elements).sum();
    assert!(sampled as f64 <= total as f64 * MAX_FRACTION, "{sampled}");
    // A per-channel unit is one whole row.
    assert!(targets
        .iter()
        .all(|t| t.unit_cols == 256 && t.unit_rows == 1));
}

#[test]
fn units_are_whole_quantization_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("blocks.safetensors");
    let v = |i| noise(5, i);
    write(&path, &[("blocks.0.w.weight", vec![300, 8192], &v)]);
    let ck = crate::format::open(&path).unwrap();
    let t = |op| Target::new(&ck, 0, op);
    let block = t(Op::Fp8 {
        recipe: Recipe::Block {
            rows: 128,
            cols: 128,
        },
        work: Dtype::BF16,
    });
    assert_eq!((block.unit_rows, block.unit_cols), (128, 128));
    // The last block row holds the 44 rows left.
    assert_eq!(block.unit(block.units() - 1), (256, 44, 8064, 128));
    let q4k = t(Op::Ggml(GgmlType::Q4_K));
    assert_eq!((q4k.unit_rows, q4k.unit_cols), (1, SEGMENT));
    assert_eq!(q4k.units(), 300 * 2);
}

#[test]
fn kind_drops_block_and_expert_numbers() {
    assert_eq!(
        kind("model.layers.12.mlp.experts.3.w1.weight"),
        "model.layers.#.mlp.experts.#.w1.weight"
    );
    assert_eq!(kind("img_in.weight"), "img_in.weight");
    assert_eq!(
        kind("down_blocks.1.resnets.0.conv1.weight")
            .matches('#')
            .count(),
        2
    );
}

/// NaN and infinite weights are left out of the estimate and counted; a
/// finite block the form writes as infinity (1e6 cast to f16 by a plan
/// that writes infinities) is counted as overflow, not taken for a sample
/// of zeros (it once read "n/a").
#[test]
fn values_that_are_not_finite_are_counted_not_taken_for_zeros() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("odd.safetensors");
    let huge = |_| 1.0e6f32;
    let nan = |i| {
        if i % 2 == 0 {
            f32::NAN
        } else {
            0.5 * noise(3, i)
        }
    };
    write(
        &path,
        &[
            ("blocks.0.attn.q.weight", vec![64, 256], &huge),
            ("blocks.1.attn.q.weight", vec![64, 256], &huge),
        ],
    );
    let ck = crate::format::open(&path).unwrap();
    let cast = |policy| {
        let o = PlanOptions {
            dtype: Some(Dtype::F16),
            on_overflow: policy,
            ..options(None)
        };
        Sampler::new(&ck)
            .estimate(&sized_plan(&ck, &o).unwrap())
            .unwrap()
    };
    let inf = cast(OverflowPolicy::Inf);
    assert_eq!(inf.relative_rms, None, "{inf:?}");
    assert!(inf.sampled > 0, "{inf:?}");
    assert_eq!((inf.overflow, inf.not_finite), (inf.sampled, 0), "{inf:?}");
    // Measured at the largest finite f16 when the plan saturates (or
    // stops: the sample then shows what saturating would give).
    let saturated = cast(OverflowPolicy::Error);
    assert_eq!(saturated.overflow, 0, "{saturated:?}");
    assert!(saturated.relative_rms.unwrap() > 0.9, "{saturated:?}");

    let path = dir.path().join("nan.safetensors");
    write(
        &path,
        &[
            ("blocks.0.attn.q.weight", vec![64, 256], &nan),
            ("blocks.1.attn.q.weight", vec![64, 256], &nan),
        ],
    );
    let ck = crate::format::open(&path).unwrap();
    for scheme in [QuantizeScheme::Fp8Channel, QuantizeScheme::Fp8Scaled] {
        let e = estimate(&ck, Some(scheme));
        // Half the sampled values are NaN: counted, and the estimate is
        // that of the other half.
        assert_eq!(e.not_finite * 2, e.sampled, "{scheme:?}: {e:?}");
        assert_eq!(e.overflow, 0, "{scheme:?}: {e:?}");
        let rms = e.relative_rms.unwrap();
        assert!(rms > 0.0 && rms < 0.05, "{scheme:?}: {e:?}");
    }
}
