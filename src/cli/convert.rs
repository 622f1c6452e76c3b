//! `reshard convert`: rewrite a checkpoint into small, layer-ordered shards.

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::Context;

use reshard::cast::OverflowPolicy;
use reshard::convert::{convert, convert_layout, ConvertOptions, ConvertSummary};
use reshard::exec::CopyPath;
use reshard::exec::WindowPool;
use reshard::format::layout as layouts;
use reshard::format::{self, Dtype};
use reshard::names::escape;
use reshard::plan::{Plan, PlanOptions};
use reshard::units::{human, ByteSize};
use reshard::write::digest::DigestAlgo;

use reshard::validate::validate_with_budget;

use super::inspect::OrderArg;
use super::progress::Bar;
use super::validate::LoadArgs;
use super::{printer, ExitStatus};

mod layout;

pub use self::layout::LayoutArgs;
use self::layout::{dry_run, print_notes, render_components, run_split};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The checkpoint to read (file, folder or Hugging Face cache folder).
    src: PathBuf,
    /// The folder to write (created if missing; never the source folder).
    dst: PathBuf,
    #[command(flatten)]
    pub options: ConvertArgs,
    /// Print the plan and write nothing.
    #[arg(long)]
    dry_run: bool,
    /// Print a JSON summary (or, with --dry-run, the plan) on stdout.
    #[arg(long)]
    json: bool,
    /// Print only errors.
    #[arg(short, long)]
    quiet: bool,
    /// Also list every shard written.
    #[arg(short, long)]
    verbose: bool,
    /// After converting, run `reshard validate DST --against SRC`: load the
    /// output through reshard's loader and compare every tensor with the
    /// source (exit 1 when a check fails).
    #[arg(long)]
    validate: bool,
    #[command(flatten, next_help_heading = "Validation (--validate)")]
    load: LoadArgs,
}

/// The options `convert` and `batch` share.
#[derive(Debug, Clone, clap::Args)]
pub struct ConvertArgs {
    /// Largest shard (tensor bytes). IEC units (KiB, MiB, GiB) are powers of
    /// 1024; SI units (KB, MB, GB) are powers of 1000, as Hugging Face uses.
    #[arg(long, default_value = "1GiB", value_name = "SIZE")]
    pub max_shard_size: ByteSize,
    #[command(flatten)]
    pub layout: LayoutArgs,
    /// Memory for buffers in flight, for the whole process.
    #[arg(long, default_value = "256MiB", value_name = "SIZE")]
    pub window: ByteSize,
    /// Tensor order in the output.
    #[arg(long, value_enum, default_value = "forward")]
    pub order: OrderArg,
    /// Worker threads (default: all cores).
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
    /// Replace a DST that holds another conversion or other files.
    #[arg(long)]
    pub overwrite: bool,
    /// Hide the progress bar.
    #[arg(long)]
    pub no_progress: bool,
    /// Cast floating-point tensors to this dtype (bf16, f16, f32, f64).
    #[arg(long, value_name = "DTYPE")]
    pub dtype: Option<Dtype>,
    /// Keep tensors whose names match this glob in their dtype (repeatable).
    #[arg(long, value_name = "GLOB")]
    pub keep_dtype: Vec<String>,
    /// What to do with values too large for --dtype.
    #[arg(long, value_enum, default_value = "error")]
    pub on_overflow: OverflowArg,
    /// Write only the first name of tensors that share one storage.
    #[arg(long)]
    pub dedupe_tied: bool,
    /// Write expanded (stride-0) views even when their output is more than
    /// 16 times the bytes they read (a tiny .bin can otherwise ask for
    /// petabytes).
    #[arg(long)]
    pub allow_expanded: bool,
    /// Write quantized (FP8, MXFP4) weights that have no scale as their
    /// plain codes instead of refusing them.
    #[arg(long)]
    pub allow_unscaled: bool,
    /// Record each shard's sha256 in reshard.json (what `sha256sum` prints
    /// and Hub LFS object ids are) instead of its BLAKE3, which costs a
    /// fraction of the CPU.
    #[arg(long)]
    pub sha256: bool,
    /// Read and write every byte through buffers instead of reading the
    /// source through read-only shared mappings (never copy-on-write).
    /// Mappings already fall back by themselves where a file system refuses
    /// them; this avoids the one risk they carry, a source truncated by
    /// another program mid-read (see docs/convert.md).
    #[arg(long, alias = "no-kernel-copy")]
    pub no_mmap: bool,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum OverflowArg {
    /// Fail, naming the tensor and the count.
    Error,
    /// Clamp to the largest finite value of the target.
    Saturate,
    /// Become +-inf, as torch does.
    Inf,
}

impl ConvertArgs {
    pub fn to_options(&self) -> ConvertOptions {
        ConvertOptions {
            plan: PlanOptions {
                max_shard_size: self.layout.max_shard_size(self.max_shard_size.bytes()),
                order: self.order.into(),
                dtype: self.dtype,
                keep_dtype: self
                    .keep_dtype
                    .iter()
                    .cloned()
                    .chain(
                        self.layout
                            .keep_dtype_preset
                            .iter()
                            .flat_map(|p| p.globs().iter().map(|g| g.to_string())),
                    )
                    .collect(),
                on_overflow: match self.on_overflow {
                    OverflowArg::Error => OverflowPolicy::Error,
                    OverflowArg::Saturate => OverflowPolicy::Saturate,
                    OverflowArg::Inf => OverflowPolicy::Inf,
                },
                dedupe_tied: self.dedupe_tied,
                allow_unscaled: self.allow_unscaled,
                format: Default::default(),
            },
            window: self.window.bytes(),
            threads: self
                .threads
                .unwrap_or_else(|| ConvertOptions::default().threads),
            overwrite: self.overwrite,
            copy_other_files: true,
            walk: reshard::convert::Walk::Flat,
            config_dtype: true,
            single_file: false,
            within: None,
            allow_expanded: self.allow_expanded,
            id_salt: None,
            keep_components: self
                .layout
                .keep_dtype_preset
                .iter()
                .flat_map(|p| p.components().iter().map(|c| c.to_string()))
                .collect(),
            digest: if self.sha256 {
                DigestAlgo::Sha256
            } else {
                DigestAlgo::Blake3
            },
            copy: if self.no_mmap {
                CopyPath::ReadWrite
            } else {
                CopyPath::Auto
            },
        }
    }
}

pub fn run(args: Args) -> anyhow::Result<ExitStatus> {
    let mut options = args.options.to_options();
    let src_is_dir = args.src.is_dir();
    options.copy_other_files = src_is_dir;
    options.single_file = !src_is_dir;
    if args.options.layout.split_components {
        return run_split(&args, &options);
    }
    // A folder is read as a layout (its weight sets and the rest of its
    // tree); a file is one checkpoint.
    let layout = if src_is_dir {
        Some(
            layouts::detect(&args.src)
                .with_context(|| format!("cannot convert {}", args.src.display()))?,
        )
    } else {
        None
    };
    let ck = match &layout {
        Some(l) if !l.sets.iter().any(|s| s.rel.is_empty()) => None,
        _ => Some(
            format::open(&args.src)
                .with_context(|| format!("cannot convert {}", args.src.display()))?,
        ),
    };
    if args.dry_run {
        return dry_run(&args, ck.as_ref(), layout.as_ref(), &options);
    }
    if !args.quiet {
        // What inspect would report: the output fixes some (format: pt,
        // alignment, index mismatches), the user should know about the rest.
        for finding in ck.iter().flat_map(|ck| &ck.findings) {
            eprintln!("note: source: {finding}");
        }
        for note in layout.iter().flat_map(|l| &l.notes) {
            eprintln!("note: {note}");
        }
    }
    let cancel = super::cancel::on_ctrl_c();
    let bar = Bar::new(!(args.quiet || args.options.no_progress || args.json));
    let result = match (&layout, &ck) {
        (Some(l), _) => {
            let pool = WindowPool::new(options.window);
            convert_layout(l, &args.dst, &options, &pool, &bar, cancel)
        }
        (None, Some(ck)) => convert(ck, &args.dst, &options, &bar, cancel),
        // A file source always has `ck`; never met.
        (None, None) => Err(format::FormatError::NoCheckpoint {
            path: args.src.clone(),
        }
        .into()),
    };
    let summary = result.with_context(|| {
        format!(
            "cannot convert {} into {}",
            args.src.display(),
            args.dst.display()
        )
    })?;
    if !args.quiet {
        print_notes(&summary, "");
        for c in &summary.components {
            for finding in &c.findings {
                eprintln!("note: source: {}: {finding}", c.path);
            }
            print_notes(&c.summary, &format!("{}/", c.path));
        }
    }
    if args.json && !args.validate {
        printer::json(&summary)?;
    } else if !args.quiet && !args.json {
        printer::text(&render_summary(&summary, args.verbose))?;
        printer::text(&render_components(&summary.components, args.verbose))?;
    }
    if !args.validate {
        return Ok(ExitStatus::Ok);
    }
    // Each weight set is validated against its source folder.
    let sets: Vec<String> = match &layout {
        Some(l) => l.sets.iter().map(|s| s.rel.clone()).collect(),
        None => vec![String::new()],
    };
    let mut reports = Vec::new();
    for rel in &sets {
        let src = layouts::join_rel(&args.src, rel);
        let dst = layouts::join_rel(&args.dst, rel);
        let options = args.load.options(Some(src));
        let report = validate_with_budget(&dst, &options)
            .with_context(|| format!("cannot validate {}", dst.display()))?;
        if !args.json && (!args.quiet || !report.passed) {
            printer::text(&super::validate::render(&report))?;
        }
        reports.push(report);
    }
    let passed = reports.iter().all(|r| r.passed);
    if args.json {
        let validate = match reports.as_slice() {
            [one] => serde_json::to_value(one)?,
            many => serde_json::to_value(many)?,
        };
        printer::json(&serde_json::json!({ "convert": summary, "validate": validate }))?;
    }
    Ok(if passed {
        ExitStatus::Ok
    } else {
        ExitStatus::CheckFailed
    })
}

pub fn render_plan(plan: &Plan, window: u64) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "plan: {} shards, {} of tensors, {} tensors",
        plan.shards.len(),
        human(plan.total_size),
        plan.layer_order.len()
    );
    for s in &plan.shards {
        let blocks = match (&s.first_block, &s.last_block) {
            (Some(a), Some(b)) if a == b => escape(a).into_owned(),
            (Some(a), Some(b)) => format!("{} .. {}", escape(a), escape(b)),
            _ => "-".into(),
        };
        let _ = writeln!(
            o,
            "  {}  {:>10}  {:>4} tensors  {blocks}",
            s.file,
            human(s.data_len),
            s.tensors.len()
        );
    }
    if let Some(index) = &plan.index_file {
        let _ = writeln!(o, "  {index}");
    }
    for c in &plan.casts {
        let _ = writeln!(
            o,
            "cast {} -> {}: {} tensors, {} -> {}",
            c.from,
            c.to,
            c.tensors,
            human(c.bytes_before),
            human(c.bytes_after)
        );
    }
    for t in &plan.oversized {
        let _ = writeln!(o, "oversized: {} is {}, larger than --max-shard-size; it gets {} alone and sets the floor of every loader's peak", escape(&t.tensor), human(t.bytes), t.file);
    }
    for d in &plan.dropped {
        let _ = writeln!(
            o,
            "dropped tied name {} (same bytes as {})",
            escape(&d.tensor),
            escape(&d.same_as)
        );
    }
    let _ = writeln!(
        o,
        "peak memory: at most {} of buffers (--window) plus a small fixed overhead",
        human(window)
    );
    o
}

fn render_summary(s: &ConvertSummary, verbose: bool) -> String {
    let mut o = String::new();
    if s.up_to_date && s.refreshed_files.is_empty() {
        let _ = writeln!(
            o,
            "{} is up to date ({} shards); nothing written",
            s.dst, s.shards
        );
        return o;
    }
    if s.up_to_date {
        let names: Vec<_> = s.refreshed_files.iter().map(|n| escape(n)).collect();
        let _ = writeln!(
            o,
            "{} is up to date ({} shards); refreshed {} file{} changed in the source: {}",
            s.dst,
            s.shards,
            names.len(),
            if names.len() == 1 { "" } else { "s" },
            names.join(", ")
        );
        return o;
    }
    if s.shards == 0 {
        let _ = writeln!(
            o,
            "copied {} files to {} (no weights in this folder)",
            s.manifest.copied_files.len(),
            s.dst
        );
        return o;
    }
    let rate = human((s.bytes_read as f64 / s.seconds.max(1e-9)) as u64);
    let _ = writeln!(
        o,
        "wrote {} shard{} ({}) to {} in {:.2} s ({rate}/s), buffers peaked at {} of a {} window",
        s.shards,
        if s.shards == 1 { "" } else { "s" },
        human(s.bytes_written),
        s.dst,
        s.seconds,
        human(s.peak_buffer_bytes),
        human(s.window)
    );
    if s.resumed_shards > 0 {
        let _ = writeln!(
            o,
            "resumed: kept {} shards an earlier run had finished",
            s.resumed_shards
        );
    }
    for sh in &s.manifest.shards {
        if verbose {
            let _ = writeln!(o, "  {}  {}  {}", sh.file, human(sh.size), sh.digest);
        }
        for t in &sh.tensors {
            if let Some(c) = &t.cast {
                let st = &c.stats;
                if st.overflow + st.underflow + st.nan > 0 {
                    let _ = writeln!(
                        o,
                        "  {}: {} -> {}: {} overflowed, {} underflowed to zero, {} NaN",
                        escape(&t.name),
                        c.from,
                        c.to,
                        st.overflow,
                        st.underflow,
                        st.nan
                    );
                }
            }
        }
    }
    for t in &s.manifest.oversized {
        let _ = writeln!(
            o,
            "note: {} ({}) is larger than --max-shard-size and sits alone in {}",
            escape(&t.tensor),
            human(t.bytes),
            t.file
        );
    }
    o
}
