//! Using reshard as a library: read a checkpoint, plan a conversion, run it,
//! and look at what was written.
//!
//! ```text
//! cargo run --example library -- examples/tiny-llama /tmp/tiny-llama-out
//! ```

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;

use reshard::convert::{convert, ConvertOptions};
use reshard::exec::NoReport;
use reshard::plan::PlanOptions;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args_os().skip(1).map(PathBuf::from);
    let src = args
        .next()
        .unwrap_or_else(|| PathBuf::from("examples/tiny-llama"));
    let dst = args
        .next()
        .unwrap_or_else(|| std::env::temp_dir().join("reshard-library-example"));

    // Stage 1: read headers only.
    let ck = reshard::format::open(&src)?;
    println!(
        "{}: {} tensors, {} bytes",
        src.display(),
        ck.tensors.len(),
        ck.total_bytes()
    );

    // Stage 2: a plan is plain data; `convert --dry-run` prints it
    // (`reshard::convert::plan_for` also refuses expanded views).
    let options = ConvertOptions {
        plan: PlanOptions {
            max_shard_size: 100_000,
            ..PlanOptions::default()
        },
        window: 16 << 20,
        ..ConvertOptions::default()
    };
    let plan = reshard::write::format::plan(&ck, &options.plan)?;
    for shard in &plan.shards {
        println!(
            "  {} {} bytes, {} tensors",
            shard.file,
            shard.data_len,
            shard.tensors.len()
        );
    }

    // Stages 3 and 4: stream, hash, write atomically, commit.
    let summary = convert(&ck, &dst, &options, &NoReport, &AtomicBool::new(false))?;
    println!(
        "wrote {} shards to {} (buffers peaked at {} bytes)",
        summary.shards, summary.dst, summary.peak_buffer_bytes
    );
    Ok(())
}
