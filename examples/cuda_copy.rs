//! The physical limit of `reshard validate --device cuda`: the same bytes
//! copied from one pinned staging buffer to the device and read back
//! (`cuMemcpyHtoD` then `cuMemcpyDtoH`, each waited for, as validate does
//! every fill), with no file reads and no hashing.
//!
//! ```text
//! cargo run --release --example cuda_copy -- BYTES [STAGING_BYTES] [ORDINAL]
//! ```
//!
//! Prints one line of JSON: `{"bytes":B,"staging":S,"seconds":T,"gb_s":G}`,
//! where `gb_s` is B / T / 10^9, counted as validate's `throughput_gb_s`
//! counts (bytes loaded, each both uploaded and read back).
//! scripts/gpu-check.sh puts the two side by side. The device memory for
//! all B bytes is allocated (in staging-sized pieces, as validate keeps
//! every tensor) before the clock starts.

use std::time::Instant;

use cudarc::driver::CudaContext;

fn main() {
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(2);
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: cuda_copy BYTES [STAGING_BYTES] [ORDINAL]";
    let bytes: usize = args.first().ok_or(usage)?.parse()?;
    let staging: usize = match args.get(1) {
        Some(s) => s.parse()?,
        None => 64 << 20,
    };
    let ordinal: usize = match args.get(2) {
        Some(s) => s.parse()?,
        None => 0,
    };
    if staging == 0 || bytes == 0 {
        return Err(usage.into());
    }
    let ctx = CudaContext::new(ordinal)?;
    let stream = ctx.default_stream();
    // SAFETY: the buffer is uninitialized until the fill just below, and
    // nothing reads it before then.
    let mut pinned = unsafe { ctx.alloc_pinned_with_flags::<u8>(staging, 0) }?;
    pinned.as_mut_slice()?.fill(0x5a);
    let pieces = bytes.div_ceil(staging);
    let mut device = Vec::with_capacity(pieces);
    for _ in 0..pieces {
        device.push(stream.alloc_zeros::<u8>(staging)?);
    }
    stream.synchronize()?;
    let started = Instant::now();
    for d in &mut device {
        stream.memcpy_htod(&pinned, d)?;
        stream.synchronize()?;
        stream.memcpy_dtoh(d, &mut pinned)?;
        stream.synchronize()?;
    }
    let seconds = started.elapsed().as_secs_f64();
    let moved = pieces * staging;
    println!(
        "{{\"bytes\":{moved},\"staging\":{staging},\"seconds\":{seconds:.6},\"gb_s\":{:.3}}}",
        moved as f64 / seconds.max(1e-9) / 1e9
    );
    Ok(())
}
