//! Throughput of the cast kernels against memcpy of the same input bytes.
//!
//! `cargo bench --bench cast` (release build, no RUSTFLAGS). For each pair it
//! prints GB/s of input and the ratio to `copy_from_slice` of the same number
//! of input bytes, measured in the same run, best of `RUNS` runs, for
//! `cast_slice` (one thread) and `cast_parallel` (rayon).

use std::hint::black_box;
use std::time::Instant;

use reshard::cast::{cast_parallel, cast_slice, OverflowPolicy};
use reshard::format::Dtype;

/// Elements per input: 64 Mi, so the f32 input is 256 MiB. Set
/// `CAST_BENCH_ELEMS` to a small number (16384) to see the kernels' speed
/// from cache instead of memory; each run then repeats to cover 64 Mi.
const ELEMS: usize = 64 << 20;
const RUNS: usize = 5;

/// Best time of `RUNS` runs of `reps` calls of `f`, in seconds per call.
fn best(reps: usize, mut f: impl FnMut()) -> f64 {
    (0..RUNS)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..reps {
                f();
            }
            t.elapsed().as_secs_f64() / reps as f64
        })
        .fold(f64::INFINITY, f64::min)
}

/// Weight-like f32 values: small, signed, with a few large ones.
fn random_f32(n: usize) -> Vec<u8> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut out = Vec::with_capacity(n * 4);
    for _ in 0..n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let u = (x >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
        let v = if x.is_multiple_of(1000) {
            u * 1e5
        } else {
            u * 0.1
        };
        out.extend_from_slice(&v.to_le_bytes());
    }
    out
}

fn main() {
    let elems = std::env::var("CAST_BENCH_ELEMS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(ELEMS);
    let reps = (ELEMS / elems).max(1);
    let f32_in = random_f32(elems);
    let mut bf16_in = vec![0u8; elems * 2];
    let mut f16_in = vec![0u8; elems * 2];
    cast_parallel(
        Dtype::F32,
        Dtype::BF16,
        &f32_in,
        &mut bf16_in,
        OverflowPolicy::Inf,
    );
    cast_parallel(
        Dtype::F32,
        Dtype::F16,
        &f32_in,
        &mut f16_in,
        OverflowPolicy::Inf,
    );

    // memcpy of the same input bytes is measured right before each pair, so
    // the ratio holds even when other processes share the machine.
    let mut copy_dst = vec![0u8; f32_in.len()];
    let gbs = |bytes: usize, secs: f64| bytes as f64 / secs / 1e9;
    println!(
        "threads: {}; input {} KiB f32, {} KiB bf16/f16; best of {RUNS} x {reps}",
        rayon::current_num_threads(),
        f32_in.len() >> 10,
        bf16_in.len() >> 10
    );
    println!(
        "{:<14} {:>10} {:>10} {:>10} {:>12} {:>10}",
        "pair", "memcpy", "1T GB/s", "1T x mcp", "par GB/s", "par x mcp"
    );

    let cases: [(Dtype, Dtype, &[u8], OverflowPolicy); 14] = [
        (Dtype::F32, Dtype::BF16, &f32_in, OverflowPolicy::Error),
        (Dtype::F32, Dtype::BF16, &f32_in, OverflowPolicy::Saturate),
        (Dtype::F32, Dtype::F16, &f32_in, OverflowPolicy::Error),
        (Dtype::F32, Dtype::F16, &f32_in, OverflowPolicy::Saturate),
        (Dtype::BF16, Dtype::F16, &bf16_in, OverflowPolicy::Error),
        (Dtype::F16, Dtype::BF16, &f16_in, OverflowPolicy::Error),
        (Dtype::BF16, Dtype::F32, &bf16_in, OverflowPolicy::Error),
        (Dtype::F16, Dtype::F32, &f16_in, OverflowPolicy::Error),
        // Plain FP8 (`--quantize fp8`, `fp8-e5m2`): the policy is ignored.
        (Dtype::F32, Dtype::F8_E4M3, &f32_in, OverflowPolicy::Error),
        (Dtype::F32, Dtype::F8_E5M2, &f32_in, OverflowPolicy::Error),
        (Dtype::BF16, Dtype::F8_E4M3, &bf16_in, OverflowPolicy::Error),
        (Dtype::BF16, Dtype::F8_E5M2, &bf16_in, OverflowPolicy::Error),
        (Dtype::F16, Dtype::F8_E4M3, &f16_in, OverflowPolicy::Error),
        (Dtype::F16, Dtype::F8_E5M2, &f16_in, OverflowPolicy::Error),
    ];
    for (from, to, input, policy) in cases {
        let n = input.len() / (from.bits() / 8) as usize;
        let mut out = vec![0u8; n * (to.bits() / 8) as usize];
        let memcpy = best(reps, || {
            copy_dst[..input.len()].copy_from_slice(black_box(input));
            black_box(&mut copy_dst);
        });
        let one = best(reps, || {
            black_box(cast_slice(from, to, black_box(input), &mut out, policy));
            black_box(&mut out);
        });
        let par = best(reps, || {
            black_box(cast_parallel(from, to, black_box(input), &mut out, policy));
            black_box(&mut out);
        });
        let label = format!(
            "{}->{}{}",
            from.name().to_lowercase(),
            to.name().to_lowercase(),
            if policy == OverflowPolicy::Saturate {
                " sat"
            } else {
                ""
            }
        );
        println!(
            "{:<14} {:>10.2} {:>10.2} {:>10.2} {:>12.2} {:>10.2}",
            label,
            gbs(input.len(), memcpy),
            gbs(input.len(), one),
            memcpy / one,
            gbs(input.len(), par),
            memcpy / par
        );
    }
}
