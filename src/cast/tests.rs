//! Tests of the cast stage as a whole: torch's casts as an oracle (the
//! 16-bit casts and the plain FP8 encoding), property tests, alignment, F8
//! decoding against an independent formula, the `supports` and `target_for`
//! tables and the error messages.

use proptest::prelude::*;

use super::*;
use generic::elem_size;
use slice::PARALLEL_CHUNK;

const ORACLE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/cast-reference/cast-reference.safetensors"
);

fn cast(from: Dtype, to: Dtype, input: &[u8], policy: OverflowPolicy) -> (Vec<u8>, CastStats) {
    let n = input.len() / elem_size(from);
    let mut out = vec![0u8; n * elem_size(to)];
    let stats = cast_slice(from, to, input, &mut out, policy);
    (out, stats)
}

/// Element `i` of a little-endian buffer of `d`, as f64 (exact for every
/// dtype compared here) and raw bits.
fn elem(d: Dtype, bytes: &[u8], i: usize) -> (f64, u64) {
    let s = elem_size(d);
    let b = &bytes[i * s..(i + 1) * s];
    match d {
        Dtype::F16 => {
            let v = u16::from_le_bytes([b[0], b[1]]);
            (half::f16::from_bits(v).to_f64(), v.into())
        }
        Dtype::BF16 => {
            let v = u16::from_le_bytes([b[0], b[1]]);
            (half::bf16::from_bits(v).to_f64(), v.into())
        }
        Dtype::F32 => {
            let v = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            (f32::from_bits(v).into(), v.into())
        }
        Dtype::F64 => {
            let v = u64::from_le_bytes(b.try_into().unwrap());
            (f64::from_bits(v), v)
        }
        _ => panic!("no element reader for {d}"),
    }
}

/// Asserts two buffers of `d` are equal bit for bit, NaN equal to NaN.
fn assert_same(d: Dtype, ours: &[u8], want: &[u8], what: &str) {
    assert_eq!(ours.len(), want.len(), "{what}: length");
    let n = ours.len() / elem_size(d);
    let mut bad = Vec::new();
    for i in 0..n {
        let (a, abits) = elem(d, ours, i);
        let (b, bbits) = elem(d, want, i);
        if !(a.is_nan() && b.is_nan()) && abits != bbits {
            bad.push(format!("#{i}: ours {abits:#x} torch {bbits:#x}"));
        }
    }
    assert!(
        bad.is_empty(),
        "{what}: {} mismatches, first: {:?}",
        bad.len(),
        &bad[..bad.len().min(8)]
    );
}

#[test]
fn matches_torch_on_every_pair_in_the_oracle() {
    let bytes = std::fs::read(ORACLE).expect("the torch oracle file is missing");
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    // (input tensor, torch's output tensor, from, to)
    let pairs = [
        ("f32_in", "f32_to_bf16", Dtype::F32, Dtype::BF16),
        ("f32_in", "f32_to_f16", Dtype::F32, Dtype::F16),
        ("bf16_all", "bf16_all_to_f32", Dtype::BF16, Dtype::F32),
        ("bf16_all", "bf16_all_to_f16", Dtype::BF16, Dtype::F16),
        ("f16_all", "f16_all_to_f32", Dtype::F16, Dtype::F32),
        ("f16_all", "f16_all_to_bf16", Dtype::F16, Dtype::BF16),
    ];
    // Every tensor of the file must be covered, so a new pair is not missed.
    for name in st.names() {
        assert!(
            pairs.iter().any(|p| p.0 == name || p.1 == name),
            "oracle tensor {name:?} is not checked by this test"
        );
    }
    for (input, output, from, to) in pairs {
        let i = st
            .tensor(input)
            .unwrap_or_else(|e| panic!("oracle lacks {input}: {e}"));
        let o = st
            .tensor(output)
            .unwrap_or_else(|e| panic!("oracle lacks {output}: {e}"));
        assert_eq!(i.dtype(), from.to_safetensors(), "{input}");
        assert_eq!(o.dtype(), to.to_safetensors(), "{output}");
        for policy in [OverflowPolicy::Inf, OverflowPolicy::Error] {
            let (ours, _) = cast(from, to, i.data(), policy);
            assert_same(
                to,
                &ours,
                o.data(),
                &format!("{input} -> {output} ({policy:?})"),
            );
        }
        let mut par = vec![0u8; o.data().len()];
        cast_parallel(from, to, i.data(), &mut par, OverflowPolicy::Inf);
        assert_same(
            to,
            &par,
            o.data(),
            &format!("{input} -> {output} (parallel)"),
        );
    }
}

const FP8_ORACLE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/fp8-reference/fp8-reference.safetensors"
);

/// True for the bytes that are NaN in F8 format `d`.
fn f8_is_nan(d: Dtype, b: u8) -> bool {
    match d {
        Dtype::F8_E4M3 => b & 0x7f == 0x7f,
        _ => b & 0x7f > 0x7c,
    }
}

#[test]
fn fp8_matches_torch_clamp_then_cast_on_every_input() {
    let bytes = std::fs::read(FP8_ORACLE).expect("the torch fp8 oracle file is missing");
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let inputs = [
        ("bf16_all", Dtype::BF16),
        ("f16_all", Dtype::F16),
        ("f32_in", Dtype::F32),
        ("f64_in", Dtype::F64),
    ];
    let targets = [
        ("e4m3", Dtype::F8_E4M3, 448.0),
        ("e5m2", Dtype::F8_E5M2, 57344.0),
    ];
    assert_eq!(
        st.len(),
        inputs.len() * (1 + targets.len()),
        "unchecked tensors"
    );
    for (input, from) in inputs {
        let x = st.tensor(input).unwrap();
        assert_eq!(x.dtype(), from.to_safetensors(), "{input}");
        let n = x.data().len() / elem_size(from);
        for (suffix, to, max) in targets {
            let name = format!("{input}_to_{suffix}");
            let want = st.tensor(&name).unwrap();
            assert_eq!(want.dtype(), to.to_safetensors(), "{name}");
            let want = want.data();
            let (ours, stats) = cast(from, to, x.data(), OverflowPolicy::Error);
            let mut bad = Vec::new();
            let mut expect = CastStats::default();
            for i in 0..n {
                let (v, bits) = elem(from, x.data(), i);
                let (o, t) = (ours[i], want[i]);
                if v.is_nan() {
                    // Our NaN is S.1111.111 with the input's sign, which is
                    // what torch's conversion writes; torch's bf16 clamp
                    // (vectorized, 32 at a time) rewrites NaN as 0xffff,
                    // so its code there depends on the element's position.
                    expect.nan += 1;
                    let sign = if v.is_sign_negative() { 0x80 } else { 0 };
                    let ok =
                        o == (0x7f | sign) && f8_is_nan(to, t) && (from == Dtype::BF16 || o == t);
                    if !ok {
                        bad.push(format!("#{i} {bits:#x}: ours {o:#04x} torch {t:#04x}"));
                    }
                    continue;
                }
                expect.overflow += u64::from(v.abs() > max);
                expect.underflow += u64::from(v != 0.0 && o & 0x7f == 0);
                if o != t {
                    bad.push(format!(
                        "#{i} {bits:#x} ({v:e}): ours {o:#04x} torch {t:#04x}"
                    ));
                }
            }
            assert!(
                bad.is_empty(),
                "{name}: {} of {n} differ, first: {:?}",
                bad.len(),
                &bad[..bad.len().min(8)]
            );
            assert_eq!(stats, expect, "{name}: counts");
            assert!(
                stats.overflow > 0 && stats.underflow > 0,
                "{name}: {stats:?}"
            );
            for policy in [OverflowPolicy::Inf, OverflowPolicy::Saturate] {
                let (other, other_stats) = cast(from, to, x.data(), policy);
                assert!(other == ours && other_stats == stats, "{name} {policy:?}");
            }
            let mut par = vec![0u8; n];
            let par_stats = cast_parallel(from, to, x.data(), &mut par, OverflowPolicy::Error);
            assert!(par == ours && par_stats == stats, "{name} parallel");
        }
    }
}

#[test]
fn supports_exactly_the_pairs_with_a_kernel() {
    use Dtype::*;
    let dense = [F64, F32, F16, BF16];
    let fp8 = [F8_E4M3, F8_E5M2];
    for from in Dtype::ALL {
        for to in Dtype::ALL {
            let want = (dense.contains(&from) || fp8.contains(&from)) && dense.contains(&to)
                || dense.contains(&from) && fp8.contains(&to);
            assert_eq!(supports(from, to), want, "{from} -> {to}");
        }
    }
}

/// Every supported pair, for loops over pairs.
fn all_pairs() -> Vec<(Dtype, Dtype)> {
    let mut v = Vec::new();
    for from in [
        Dtype::F64,
        Dtype::F32,
        Dtype::F16,
        Dtype::BF16,
        Dtype::F8_E4M3,
        Dtype::F8_E5M2,
    ] {
        for to in TARGETS {
            v.push((from, to));
        }
    }
    for from in TARGETS {
        v.push((from, Dtype::F8_E4M3));
        v.push((from, Dtype::F8_E5M2));
    }
    v
}

fn pseudo_random_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

#[test]
fn unaligned_slices_give_the_aligned_result() {
    for (from, to) in all_pairs() {
        let n = 1000;
        let (isz, osz) = (elem_size(from), elem_size(to));
        let buf = pseudo_random_bytes(n * isz + 1, 7);
        for policy in [OverflowPolicy::Inf, OverflowPolicy::Saturate] {
            let aligned_in = buf[1..].to_vec();
            let (want, want_stats) = cast(from, to, &aligned_in, policy);
            let mut out = vec![0u8; n * osz + 1];
            let stats = cast_slice(from, to, &buf[1..], &mut out[1..], policy);
            assert_eq!(&out[1..], &want[..], "{from} -> {to}");
            assert_eq!(stats, want_stats, "{from} -> {to}");
        }
    }
}

#[test]
fn every_vector_build_gives_the_same_bits_and_counts() {
    // Lengths that leave a tail after the vector loop, from an odd offset.
    for (from, to) in all_pairs() {
        let n = 4099;
        let raw = pseudo_random_bytes(n * elem_size(from) + 1, 7);
        let input = &raw[1..];
        for sat in [false, true] {
            let builds = if sat {
                simd::builds::<true>()
            } else {
                simd::builds::<false>()
            };
            let mut want: Option<(Vec<u8>, CastStats)> = None;
            for (name, build) in builds {
                let mut out = vec![0u8; n * elem_size(to) + 1];
                let stats = build(from, to, input, &mut out[1..]);
                let got = (out, stats);
                match &want {
                    None => want = Some(got),
                    Some(w) => assert!(
                        *w == got,
                        "{from}->{to} sat={sat}: {name} differs from the baseline"
                    ),
                }
            }
        }
    }
}

#[test]
fn parallel_equals_serial_across_chunk_edges() {
    for (from, to) in [
        (Dtype::F32, Dtype::F16),
        (Dtype::BF16, Dtype::F16),
        (Dtype::F64, Dtype::BF16),
    ] {
        let isz = elem_size(from);
        let n = (3 * PARALLEL_CHUNK + 12345) / isz;
        let input = pseudo_random_bytes(n * isz, 11);
        let (want, want_stats) = cast(from, to, &input, OverflowPolicy::Error);
        let mut out = vec![0u8; want.len()];
        let stats = cast_parallel(from, to, &input, &mut out, OverflowPolicy::Error);
        assert!(out == want, "{from} -> {to}");
        assert_eq!(stats, want_stats);
        assert!(
            stats.overflow > 0 && stats.nan > 0,
            "random bits hit every case: {stats:?}"
        );
    }
}

#[test]
fn sixteen_bit_round_trips_through_wider_types_exhaustively() {
    let all: Vec<u8> = (0..=u16::MAX).flat_map(|v| v.to_le_bytes()).collect();
    for (narrow, wide) in [
        (Dtype::BF16, Dtype::F32),
        (Dtype::BF16, Dtype::F64),
        (Dtype::F16, Dtype::F32),
        (Dtype::F16, Dtype::F64),
    ] {
        let (w, _) = cast(narrow, wide, &all, OverflowPolicy::Error);
        let (back, stats) = cast(wide, narrow, &w, OverflowPolicy::Error);
        assert_eq!((stats.overflow, stats.underflow), (0, 0));
        assert_same(
            narrow,
            &back,
            &all,
            &format!("{narrow} -> {wide} -> {narrow}"),
        );
    }
    // f16 -> bf16 -> f16 is not exact (bf16 has fewer bits), but f16 values
    // that bf16 holds exactly come back unchanged.
}

#[test]
fn f8_upcasts_match_an_independent_formula() {
    fn e4m3(b: u8) -> f64 {
        let s = if b & 0x80 != 0 { -1.0 } else { 1.0 };
        let (e, m) = (i32::from((b >> 3) & 0xf), f64::from(b & 7));
        match (e, m as u8) {
            (15, 7) => f64::NAN,
            (0, _) => s * m / 8.0 * 2f64.powi(-6),
            _ => s * (1.0 + m / 8.0) * 2f64.powi(e - 7),
        }
    }
    fn e5m2(b: u8) -> f64 {
        let s = if b & 0x80 != 0 { -1.0 } else { 1.0 };
        let (e, m) = (i32::from((b >> 2) & 0x1f), f64::from(b & 3));
        match (e, m as u8) {
            (31, 0) => s * f64::INFINITY,
            (31, _) => f64::NAN,
            (0, _) => s * m / 4.0 * 2f64.powi(-14),
            _ => s * (1.0 + m / 4.0) * 2f64.powi(e - 15),
        }
    }
    let all: Vec<u8> = (0..=255).collect();
    for (from, reference) in [
        (Dtype::F8_E4M3, e4m3 as fn(u8) -> f64),
        (Dtype::F8_E5M2, e5m2),
    ] {
        let nans = all.iter().filter(|b| reference(**b).is_nan()).count() as u64;
        for to in TARGETS {
            let (out, stats) = cast(from, to, &all, OverflowPolicy::Error);
            assert_eq!(
                stats,
                CastStats {
                    nan: nans,
                    ..CastStats::default()
                },
                "{from} -> {to}"
            );
            for b in 0..=255u8 {
                let want = reference(b);
                let (got, bits) = elem(to, &out, usize::from(b));
                if want.is_nan() {
                    assert!(got.is_nan(), "{from} {b:#04x} -> {to}");
                } else {
                    assert_eq!(
                        got.to_bits(),
                        want.to_bits(),
                        "{from} {b:#04x} -> {to} ({bits:#x})"
                    );
                }
            }
        }
    }
}

#[test]
fn target_for_table() {
    use Dtype::*;
    for to in Dtype::ALL {
        for from in Dtype::ALL {
            let got = target_for(from, to);
            if !TARGETS.contains(&to) {
                assert!(
                    matches!(got, Err(CastError::UnsupportedTarget { .. })),
                    "{from} {to}"
                );
                continue;
            }
            let castable = matches!(from, F64 | F32 | F16 | BF16 | F8_E4M3 | F8_E5M2);
            let want = (castable && from != to).then_some(to);
            assert_eq!(got.unwrap(), want, "{from} -> {to}");
            if want.is_some() {
                assert!(supports(from, to));
            }
        }
    }
    assert_eq!(target_for(F8_E8M0, BF16).unwrap(), None);
    assert_eq!(target_for(I64, F16).unwrap(), None);
    assert_eq!(target_for(F4, F16).unwrap(), None);
}

#[test]
fn error_messages() {
    let e = target_for(Dtype::F32, Dtype::F8_E4M3).unwrap_err();
    assert_eq!(
        e.to_string(),
        "casting to F8_E4M3 needs scales and is not supported; choose bf16, f16, f32 or f64"
    );
    let e = target_for(Dtype::F32, Dtype::I32).unwrap_err();
    assert_eq!(
        e.to_string(),
        "casting to I32 is not supported; choose bf16, f16, f32 or f64"
    );
    let e = CastError::Overflow {
        tensor: "x".into(),
        from: Dtype::F32,
        to: Dtype::F16,
        count: 3,
    };
    assert_eq!(
        e.to_string(),
        "tensor \"x\": 3 F32 values overflow F16 (largest finite F16 is 65504); use --on-overflow saturate or inf"
    );
    let e = CastError::Overflow {
        tensor: "y".into(),
        from: Dtype::BF16,
        to: Dtype::F16,
        count: 1,
    };
    assert!(
        e.to_string().contains(": 1 BF16 value overflows F16"),
        "{e}"
    );
}

#[test]
fn stats_add_up() {
    let mut a = CastStats {
        overflow: 1,
        underflow: 2,
        nan: 3,
    };
    a += CastStats {
        overflow: 10,
        underflow: 20,
        nan: 30,
    };
    assert_eq!(
        a,
        CastStats {
            overflow: 11,
            underflow: 22,
            nan: 33
        }
    );
}

#[test]
fn policies_parse_lowercase() {
    let p: OverflowPolicy = serde_json::from_str("\"saturate\"").unwrap();
    assert_eq!(p, OverflowPolicy::Saturate);
    assert_eq!(OverflowPolicy::default(), OverflowPolicy::Error);
}

/// The narrowing pairs, where overflow and underflow can happen.
const NARROWING: [(Dtype, Dtype); 7] = [
    (Dtype::F32, Dtype::BF16),
    (Dtype::F32, Dtype::F16),
    (Dtype::BF16, Dtype::F16),
    (Dtype::F16, Dtype::BF16),
    (Dtype::F64, Dtype::F32),
    (Dtype::F64, Dtype::F16),
    (Dtype::F64, Dtype::BF16),
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn f32_round_trips_through_f64(bits in any::<u32>()) {
        let input = bits.to_le_bytes();
        let (wide, _) = cast(Dtype::F32, Dtype::F64, &input, OverflowPolicy::Error);
        let (back, stats) = cast(Dtype::F64, Dtype::F32, &wide, OverflowPolicy::Error);
        prop_assert_eq!((stats.overflow, stats.underflow), (0, 0));
        assert_same(Dtype::F32, &back, &input, "f32 -> f64 -> f32");
    }

    #[test]
    fn counts_and_saturation_agree_with_the_output(
        pair in 0..NARROWING.len(),
        words in proptest::collection::vec(any::<u64>(), 1..64),
        scale in -3i32..=3,
    ) {
        let (from, to) = NARROWING[pair];
        // Random bits, with some values pushed near the target's range.
        let values: Vec<u64> = words.iter().enumerate().map(|(i, w)| {
            if i % 2 == 0 { *w } else { (f64::from(*w as u32) * 2f64.powi(scale * 40)).to_bits() }
        }).collect();
        let mut input = Vec::new();
        for v in &values {
            match elem_size(from) {
                2 => input.extend_from_slice(&(*v as u16).to_le_bytes()),
                4 => {
                    let f = f64::from_bits(*v) as f32;
                    let b = if *v >> 63 == 0 && (*v as u32).is_multiple_of(3) { *v as u32 } else { f.to_bits() };
                    input.extend_from_slice(&b.to_le_bytes());
                }
                _ => input.extend_from_slice(&v.to_le_bytes()),
            }
        }
        let (inf_out, inf_stats) = cast(from, to, &input, OverflowPolicy::Inf);
        let (err_out, err_stats) = cast(from, to, &input, OverflowPolicy::Error);
        let (sat_out, sat_stats) = cast(from, to, &input, OverflowPolicy::Saturate);
        prop_assert_eq!(&inf_out, &err_out);
        prop_assert_eq!(inf_stats, err_stats);
        prop_assert_eq!(inf_stats, sat_stats);
        let n = input.len() / elem_size(from);
        let (mut overflow, mut underflow, mut nan) = (0, 0, 0);
        for i in 0..n {
            let (x, _) = elem(from, &input, i);
            let (y, _) = elem(to, &inf_out, i);
            let (s, _) = elem(to, &sat_out, i);
            nan += u64::from(x.is_nan());
            if x.is_finite() {
                prop_assert!(s.is_finite(), "saturate gave {} for {}", s, x);
                if y.is_infinite() {
                    overflow += 1;
                    prop_assert_eq!(s.abs(), elem(to, &max_finite(to), 0).0);
                    prop_assert_eq!(s.is_sign_negative(), x.is_sign_negative());
                } else {
                    prop_assert_eq!(s.to_bits(), y.to_bits());
                }
                underflow += u64::from(x != 0.0 && y == 0.0);
            }
        }
        prop_assert_eq!(inf_stats, CastStats { overflow, underflow, nan });
    }
}

fn max_finite(d: Dtype) -> Vec<u8> {
    match d {
        Dtype::F16 => 0x7bffu16.to_le_bytes().to_vec(),
        Dtype::BF16 => 0x7f7fu16.to_le_bytes().to_vec(),
        Dtype::F32 => f32::MAX.to_le_bytes().to_vec(),
        _ => f64::MAX.to_le_bytes().to_vec(),
    }
}
