//! `reshard convert`: rewrite a checkpoint into small, layer-ordered shards.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;

use anyhow::Context;

use reshard::cast::OverflowPolicy;
use reshard::convert::split::ComponentPrefix;
use reshard::convert::{
    convert, convert_layout, convert_split, ComponentSummary, ConvertOptions, ConvertSummary,
};
use reshard::exec::WindowPool;
use reshard::format::layout::{self, ModelLayout};
use reshard::format::names::escape;
use reshard::format::{self, Dtype};
use reshard::plan::{Plan, PlanOptions};
use reshard::units::{human, ByteSize};

use reshard::validate::validate_with_budget;

use super::inspect::OrderArg;
use super::progress::Bar;
use super::validate::LoadArgs;
use super::{printer, ExitStatus};

/// Set by the Ctrl-C handler; the executor stops between chunks.
pub static CANCEL: AtomicBool = AtomicBool::new(false);

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
}

/// The options about the output's layout (one file, components).
#[derive(Debug, Clone, clap::Args)]
pub struct LayoutArgs {
    /// Write each weight set as one `<prefix>.safetensors` (no index), for
    /// UIs that load one file (ComfyUI, A1111/Forge, InvokeAI): streamed
    /// through the window like shards, layer-ordered, the source's
    /// `__metadata__` kept. Merges a sharded checkpoint into one file.
    #[arg(long, conflicts_with = "max_shard_size")]
    pub single_file: bool,
    /// Split an all-in-one UI checkpoint into one file per component,
    /// `DST/NAME/NAME.safetensors`, names without their prefix (see
    /// docs/layouts.md for the prefix table).
    #[arg(long, conflicts_with = "max_shard_size")]
    pub split_components: bool,
    /// With --split-components: tensors starting with PREFIX form component
    /// NAME (repeatable; wins over the built-in table).
    #[arg(long, value_name = "NAME=PREFIX", requires = "split_components")]
    pub component_prefix: Vec<ComponentPrefix>,
    /// With --dtype: keep these in their dtype (repeatable): `vae` (a
    /// pipeline's or a split's `vae`, and `first_stage_model.*` in one
    /// file), `norms` (every `*norm*` and `*ln_*` tensor).
    #[arg(long, value_enum, value_name = "PRESET")]
    pub keep_dtype_preset: Vec<KeepPreset>,
}

/// Common cases of `--keep-dtype` (docs/layouts.md says why).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum KeepPreset {
    /// The VAE: in f16 the SD and SDXL VAEs overflow to NaN (black images).
    Vae,
    /// Normalization weights: tiny, and the scales most hurt by rounding.
    Norms,
}

impl KeepPreset {
    /// The tensor-name globs the preset keeps.
    pub fn globs(self) -> &'static [&'static str] {
        match self {
            KeepPreset::Vae => &["first_stage_model.*"],
            KeepPreset::Norms => &["*norm*", "*ln_*"],
        }
    }

    /// The weight sets (layout folders, split components) kept whole.
    pub fn components(self) -> &'static [&'static str] {
        match self {
            KeepPreset::Vae => &["vae"],
            KeepPreset::Norms => &[],
        }
    }
}

impl LayoutArgs {
    /// The shard limit these options leave: none with `--single-file`.
    fn max_shard_size(&self, given: u64) -> u64 {
        if self.single_file {
            u64::MAX
        } else {
            given
        }
    }
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
            layout::detect(&args.src)
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
    let _ = ctrlc::set_handler(|| CANCEL.store(true, std::sync::atomic::Ordering::SeqCst));
    let bar = Bar::new(!(args.quiet || args.options.no_progress || args.json));
    let result = match (&layout, &ck) {
        (Some(l), _) => {
            let pool = WindowPool::new(options.window);
            convert_layout(l, &args.dst, &options, &pool, &bar, &CANCEL)
        }
        (None, Some(ck)) => convert(ck, &args.dst, &options, &bar, &CANCEL),
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
        let src = layout::join_rel(&args.src, rel);
        let dst = layout::join_rel(&args.dst, rel);
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

/// `convert --split-components`.
fn run_split(args: &Args, options: &ConvertOptions) -> anyhow::Result<ExitStatus> {
    let ck = format::open(&args.src)
        .with_context(|| format!("cannot convert {}", args.src.display()))?;
    let prefixes = &args.options.layout.component_prefix;
    if args.dry_run {
        let parts = reshard::convert::split::split(&ck, prefixes)
            .with_context(|| format!("cannot plan {}", args.src.display()))?;
        let mut plans = Vec::new();
        for (component, part) in &parts {
            let mut o = options.plan.clone();
            o.max_shard_size = u64::MAX;
            let plan = Plan::build(part, &o)
                .with_context(|| format!("cannot plan {}", args.src.display()))?;
            plans.push((component.clone(), plan));
        }
        if args.json {
            let list: Vec<_> = plans
                .iter()
                .map(|(c, p)| serde_json::json!({"component": c, "plan": p}))
                .collect();
            printer::json(&list)?;
        } else {
            for (c, plan) in &plans {
                printer::text(&format!("{} (prefix {:?}): ", c.name, c.prefix))?;
                printer::text(&render_plan(plan, options.window))?;
            }
        }
        return Ok(ExitStatus::Ok);
    }
    let _ = ctrlc::set_handler(|| CANCEL.store(true, std::sync::atomic::Ordering::SeqCst));
    let bar = Bar::new(!(args.quiet || args.options.no_progress || args.json));
    let pool = WindowPool::new(options.window);
    let components = convert_split(&ck, &args.dst, options, prefixes, &pool, &bar, &CANCEL)
        .with_context(|| {
            format!(
                "cannot split {} into {}",
                args.src.display(),
                args.dst.display()
            )
        })?;
    if args.json {
        printer::json(&serde_json::json!({ "components": components }))?;
    } else if !args.quiet {
        printer::text(&render_components(&components, args.verbose))?;
    }
    Ok(ExitStatus::Ok)
}

fn render_components(components: &[ComponentSummary], verbose: bool) -> String {
    components
        .iter()
        .map(|c| format!("{}: {}", c.path, render_summary(&c.summary, verbose)))
        .collect()
}

/// `convert --dry-run`: the plan of every weight set, written nowhere.
fn dry_run(
    args: &Args,
    ck: Option<&format::Checkpoint>,
    layout: Option<&ModelLayout>,
    options: &ConvertOptions,
) -> anyhow::Result<ExitStatus> {
    let plan_of = |ck: &format::Checkpoint, o: &ConvertOptions| {
        Plan::build(ck, &o.plan)
            .and_then(|plan| {
                reshard::plan::check_expanded(ck, &plan, o.allow_expanded)?;
                Ok(plan)
            })
            .with_context(|| format!("cannot plan {}", ck.dir.display()))
    };
    let mut plans = Vec::new();
    if let Some(ck) = ck {
        plans.push((String::new(), plan_of(ck, options)?));
    }
    for set in layout
        .iter()
        .flat_map(|l| &l.sets)
        .filter(|s| !s.rel.is_empty())
    {
        let dir = layout::join_rel(&args.src, &set.rel);
        let ck = format::open(&dir).with_context(|| format!("cannot plan {}", dir.display()))?;
        let mut o = options.clone();
        if set.one_file {
            o.plan.max_shard_size = u64::MAX;
        }
        plans.push((set.rel.clone(), plan_of(&ck, &o)?));
    }
    if args.json {
        match plans.as_slice() {
            [(rel, plan)] if rel.is_empty() => printer::json(plan)?,
            _ => printer::json(
                &plans
                    .iter()
                    .map(|(rel, plan)| serde_json::json!({"path": rel, "plan": plan}))
                    .collect::<Vec<_>>(),
            )?,
        }
    } else {
        for (rel, plan) in &plans {
            if !rel.is_empty() {
                printer::text(&format!("{rel}: "))?;
            }
            printer::text(&render_plan(plan, options.window))?;
        }
    }
    Ok(ExitStatus::Ok)
}

/// The files of one folder's job that were not copied, or copied as is.
fn print_notes(s: &ConvertSummary, folder: &str) {
    for skipped in &s.skipped_files {
        eprintln!(
            "note: not copied: {:?}: {}",
            format!("{folder}{}", skipped.name),
            skipped.reason
        );
    }
    for name in &s.copied_as_is {
        eprintln!("note: copied as is (a weight file outside any converted folder, not converted): {folder}{name}");
    }
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
    if s.up_to_date {
        let _ = writeln!(
            o,
            "{} is up to date ({} shards); nothing written",
            s.dst, s.shards
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
            let _ = writeln!(o, "  {}  {}  sha256 {}", sh.file, human(sh.size), sh.sha256);
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(clap::Parser)]
    struct Wrap {
        #[command(flatten)]
        args: ConvertArgs,
    }

    fn parse(extra: &[&str]) -> Result<ConvertArgs, clap::Error> {
        Wrap::try_parse_from([&["convert"], extra].concat()).map(|w| w.args)
    }

    #[test]
    fn single_file_lifts_the_shard_limit_and_excludes_max_shard_size() {
        let o = parse(&["--single-file"]).unwrap().to_options();
        assert_eq!(o.plan.max_shard_size, u64::MAX);
        let o = parse(&[]).unwrap().to_options();
        assert_eq!(o.plan.max_shard_size, 1 << 30);
        assert!(parse(&["--single-file", "--max-shard-size", "1GB"]).is_err());
    }

    #[test]
    fn keep_dtype_presets_add_globs_and_whole_components() {
        let o = parse(&[
            "--keep-dtype",
            "x.*",
            "--keep-dtype-preset",
            "vae",
            "--keep-dtype-preset",
            "norms",
        ])
        .unwrap()
        .to_options();
        assert_eq!(
            o.plan.keep_dtype,
            ["x.*", "first_stage_model.*", "*norm*", "*ln_*"]
        );
        assert_eq!(o.keep_components, ["vae"]);
        assert!(parse(&["--keep-dtype-preset", "unet"]).is_err());
    }
}
