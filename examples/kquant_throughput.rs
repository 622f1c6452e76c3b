//! Single-thread throughput of the Q8_0, Q4_K and Q6_K quantizers, in MB/s
//! of f32 input: `cargo run --release --example kquant_throughput`.
//!
//! The input is 16 MiB of weight-like values (normal-ish, a few outliers),
//! quantized row by row (4096 values a row) in one thread, best of 5 runs.
//! On Linux it also prints the rate per second of CPU time the thread got
//! (/proc/thread-self/schedstat), which holds on a loaded machine where
//! wall time does not.
//! Rows are independent, so a writer that quantizes rows on N threads
//! scales by about N.

use std::hint::black_box;
use std::time::Instant;

use reshard::cast::gguf::kquantize::{quantize_q4_k, quantize_q6_k, KQuantError, QK_K};
use reshard::cast::gguf::quantize::quantize_blocks;
use reshard::format::gguf::ggml::GgmlType;

const VALUES: usize = 4 << 20;
const ROW: usize = 4096;

fn weights() -> Vec<f32> {
    let mut s: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut uniform = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    };
    (0..VALUES)
        .map(|i| {
            let v = (uniform() + uniform() + uniform()) * 0.03;
            if i % 997 == 0 {
                v * 50.0
            } else {
                v
            }
        })
        .collect()
}

/// Nanoseconds this thread has run on a CPU, where Linux says.
fn cpu_ns() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    s.split_whitespace().next()?.parse().ok()
}

type Quantizer = fn(&[f32], &mut [u8]) -> Result<(), KQuantError>;

fn quantize_q8_0(x: &[f32], out: &mut [u8]) -> Result<(), KQuantError> {
    quantize_blocks(GgmlType::Q8_0, x, out).expect("whole Q8_0 blocks");
    Ok(())
}

fn main() -> Result<(), KQuantError> {
    let x = weights();
    for (name, quantize, bytes) in [
        // Q8_0 blocks are 32 values in 34 bytes: QK_K / 32 blocks per 256.
        ("Q8_0", quantize_q8_0 as Quantizer, QK_K / 32 * 34),
        ("Q4_K", quantize_q4_k as Quantizer, 144),
        ("Q6_K", quantize_q6_k as Quantizer, 210),
    ] {
        let mut out = vec![0u8; VALUES / QK_K * bytes];
        let per_row = ROW / QK_K * bytes;
        let (mut best, mut best_cpu) = (f64::INFINITY, f64::INFINITY);
        for _ in 0..5 {
            let (t, c) = (Instant::now(), cpu_ns());
            for (r, o) in x.chunks_exact(ROW).zip(out.chunks_exact_mut(per_row)) {
                quantize(black_box(r), o)?;
            }
            black_box(&out);
            best = best.min(t.elapsed().as_secs_f64());
            if let (Some(c0), Some(c1)) = (c, cpu_ns()) {
                best_cpu = best_cpu.min((c1 - c0) as f64 / 1e9);
            }
        }
        let mb = (VALUES * 4) as f64 / 1e6;
        let cpu = if best_cpu.is_finite() {
            format!(", {:.1} MB/s of CPU time", mb / best_cpu)
        } else {
            String::new()
        };
        println!(
            "{name}: {:.1} MB/s of f32 input ({mb:.1} MB in {best:.3} s, one thread){cpu}",
            mb / best
        );
    }
    Ok(())
}
