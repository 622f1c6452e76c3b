//! `reshard batch`: convert every model under a folder, N at a time, within
//! one memory window; a deterministic `--part I/N` (balanced by bytes or
//! split by name) for running it on many machines, and `--plan-parts N` to
//! show that split.

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::Context;

use reshard::batch::part::PartPlan;
use reshard::batch::{
    self, Balance, BatchOptions, BatchReport, Listing, Mode, ModelResult, Part, Selection,
};
use reshard::exec::WindowPool;
use reshard::names::escape;
use reshard::units::human;

use super::convert::{ConvertArgs, FitArgs};
use super::machine::MachineArgs;

use super::progress::MultiBar;
use super::validate::LoadArgs;
use super::ExitStatus;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The folder to search for models (recursively; Hugging Face cache
    /// folders included).
    root: PathBuf,
    /// The folder to write: each model goes to OUT/<its path under ROOT>
    /// (an HF cache repo to OUT/ORG--NAME).
    #[arg(long, short, value_name = "OUT")]
    out: PathBuf,
    /// Models converted at once; they share one --window budget and split
    /// --threads between them.
    #[arg(long, default_value = "1", value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    jobs: u32,
    /// Take only part I of N (0 <= I < N), so N machines can each run one
    /// part of the same folder; --balance says how the parts are made.
    #[arg(long, value_name = "I/N")]
    part: Option<Part>,
    /// How --part splits the models. `bytes`: largest model first to the part
    /// with the fewest bytes, so parts finish together; every machine must
    /// see the same folder. `name`: a fixed hash of each model's name, which
    /// does not move a model when others are added or removed.
    #[arg(long, value_enum, default_value = "bytes")]
    balance: BalanceArg,
    /// Print how --part would split the models into N parts (the models and
    /// bytes of each part) and write nothing.
    #[arg(long, value_name = "N", conflicts_with_all = ["part", "dry_run"],
          value_parser = clap::value_parser!(u64).range(1..=MAX_PLAN_PARTS))]
    plan_parts: Option<u64>,
    /// Check that every blob of a Hugging Face cache model still hashes to
    /// its sha256 name, alongside the job (a conversion is committed only
    /// once the check passed).
    #[arg(long)]
    verify_source: bool,
    /// What to do with each model.
    #[arg(long, value_enum, default_value = "convert")]
    mode: ModeArg,
    /// Also write the report as JSON to FILE (atomically). FILE may not be
    /// or lie inside a source model, and an existing FILE is replaced only if
    /// it is a report reshard wrote.
    #[arg(long, value_name = "FILE")]
    report: Option<PathBuf>,
    /// Start no new model after the first failure.
    #[arg(long)]
    fail_fast: bool,
    /// List the models (name, output, part) and write nothing.
    #[arg(long)]
    dry_run: bool,
    #[command(flatten)]
    pub print: crate::cli::printer::OutputArgs,
    /// Print only errors and failed models.
    #[arg(short, long)]
    quiet: bool,
    // The flattened groups come last: a group's heading holds for every
    // argument after it.
    #[command(flatten)]
    options: ConvertArgs,
    /// `--fit --for PROGRAM`: each model converted to its own best form.
    #[command(flatten)]
    fit: FitArgs,
    /// The machine `--mode fit` judges against and `--fit` plans for
    /// (default: this one).
    #[command(flatten, next_help_heading = "Machine (--mode fit, --fit)")]
    machine: MachineArgs,
    /// How `--mode validate` loads each output.
    #[command(flatten, next_help_heading = "Loading (--mode validate)")]
    load: LoadArgs,
}

/// The most parts `--plan-parts` lists.
const MAX_PLAN_PARTS: u64 = 100_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BalanceArg {
    /// About the same bytes in every part (the default).
    Bytes,
    /// A fixed hash of each model's name (the split before --balance).
    Name,
}

impl From<BalanceArg> for Balance {
    fn from(b: BalanceArg) -> Balance {
        match b {
            BalanceArg::Bytes => Balance::Bytes,
            BalanceArg::Name => Balance::Name,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ModeArg {
    /// Convert each model (the default).
    Convert,
    /// Judge whether each model, as converted with these options, fits the
    /// machine (see `reshard fit`); a model that does not fit fails.
    Fit,
    /// Load each model's output (see `reshard validate`) and compare every
    /// tensor with its source; run after --mode convert.
    Validate,
}

impl From<ModeArg> for Mode {
    fn from(m: ModeArg) -> Mode {
        match m {
            ModeArg::Convert => Mode::Convert,
            ModeArg::Fit => Mode::Fit,
            ModeArg::Validate => Mode::Validate,
        }
    }
}

pub fn run(args: Args) -> anyhow::Result<ExitStatus> {
    // OUT a file, or a path through one or through a dangling link: one
    // error for the run (exit 2), not one failure per model.
    if let Some(e) = reshard::write::made::blocked(&args.out) {
        return Err(
            anyhow::Error::new(e).context(format!("cannot use --out {}", args.out.display()))
        );
    }
    let part = args.part.unwrap_or(Part::ALL);
    let balance: Balance = args.balance.into();
    let selection = Selection::new(&args.root, &args.out, part, balance, args.dry_run)
        .with_context(|| format!("cannot search {}", args.root.display()))?;
    if let Some(count) = args.plan_parts {
        let planned = batch::plan_parts(
            &args.root,
            &args.out,
            &selection.found.models,
            count,
            balance,
        );
        args.print
            .printer()
            .result(&planned, || render_plan(&planned.plan))?;
        return Ok(ExitStatus::Ok);
    }
    if args.dry_run {
        let listing = selection.listing();
        args.print
            .printer()
            .result(&listing, || render_listing(&listing))?;
        return Ok(ExitStatus::Ok);
    }

    if args.machine.any_given() && !args.fit.fit && args.mode != ModeArg::Fit {
        anyhow::bail!(
            "the machine flags (--os, --ram, --pagefile, --commit-limit, --vram, --loader, --cuda-overhead, --pread-threads, --baseline) describe the machine of --mode fit or --fit; give one of them, or leave the flags out"
        );
    }
    args.options.check_on_overflow(args.fit.fit)?;
    if args.fit.fit && args.mode != ModeArg::Convert {
        anyhow::bail!(
            "--fit chooses each model's conversion: it takes --mode convert (the default)"
        );
    }
    if let Some(t) = args.fit.target(&args.machine) {
        // A usage error, said once, not a failure of every model.
        t.program.check_loaders(&t.options.loaders)?;
    }
    let cancel = super::cancel::on_ctrl_c();
    let mut convert = args.options.to_options();
    convert.within = Some(args.out.clone());
    let options = BatchOptions {
        convert,
        mode: args.mode.into(),
        jobs: args.jobs as usize,
        verify_source: args.verify_source,
        fail_fast: args.fail_fast,
        fit: (args.mode == ModeArg::Fit).then(|| batch::FitJob {
            machine: args.machine.machine(),
            options: args.machine.options(String::new(), None),
        }),
        convert_fit: args.fit.target(&args.machine),
        validate: (args.mode == ModeArg::Validate).then(|| args.load.options(None)),
    };
    let pool = WindowPool::new(options.convert.window);
    let bars = MultiBar::new(
        !(args.quiet || args.options.no_progress || args.print.json),
        selection.mine().len() as u64,
    );
    let report = batch::run(
        &selection,
        &options,
        args.report.as_deref(),
        &pool,
        &bars,
        cancel,
    );
    bars.finish();
    let report = report?;
    args.print
        .printer()
        .result(&report, || render_report(&report, args.quiet))?;
    Ok(if report.any_failed() {
        ExitStatus::CheckFailed
    } else {
        ExitStatus::Ok
    })
}

fn render_listing(l: &Listing) -> String {
    let mut o = String::new();
    let width = l
        .models
        .iter()
        .map(|m| escape(&m.model.name).chars().count())
        .max()
        .unwrap_or(0)
        .max(5);
    let _ = writeln!(
        o,
        "{:<width$}  {:>5}  {:>10}  OUTPUT",
        "MODEL", "PART", "BYTES"
    );
    for m in &l.models {
        let part = format!("{}/{}", m.part, l.part.count);
        let _ = writeln!(
            o,
            "{:<width$}  {part:>5}  {:>10}  {}",
            escape(&m.model.name),
            human(m.bytes),
            escape(&m.model.output.display().to_string())
        );
    }
    for s in &l.skipped {
        let _ = writeln!(o, "skipped {}: {}", escape(&s.name), escape(&s.reason));
    }
    let _ = writeln!(
        o,
        "{} models in part {} ({} skipped)",
        l.models.len(),
        l.part,
        l.skipped.len()
    );
    o
}

fn render_plan(p: &PartPlan) -> String {
    let mut o = String::new();
    let width = p
        .parts
        .iter()
        .flat_map(|part| {
            part.models
                .iter()
                .map(|m| escape(&m.name).chars().count() + 2)
        })
        .max()
        .unwrap_or(0)
        .max(6);
    let _ = writeln!(
        o,
        "{:<width$}  {:>6}  {:>10}  SHARE",
        "PART", "MODELS", "BYTES"
    );
    let share = |bytes: u64| {
        if p.total_bytes == 0 {
            0.0
        } else {
            100.0 * bytes as f64 / p.total_bytes as f64
        }
    };
    for part in &p.parts {
        let _ = writeln!(
            o,
            "{:<width$}  {:>6}  {:>10}  {:.1}%",
            part.part.to_string(),
            part.models.len(),
            human(part.bytes),
            share(part.bytes)
        );
        for m in &part.models {
            let _ = writeln!(
                o,
                "  {:<w$}  {:>6}  {:>10}",
                escape(&m.name),
                "",
                human(m.bytes),
                w = width - 2
            );
        }
    }
    let models: usize = p.parts.iter().map(|part| part.models.len()).sum();
    let ratio = if p.average_bytes == 0 {
        1.0
    } else {
        p.largest_part_bytes as f64 / p.average_bytes as f64
    };
    let _ = writeln!(
        o,
        "{models} models, {} in {} parts by {}: largest part {} ({ratio:.2}x the average {}), largest model {}",
        human(p.total_bytes),
        p.count,
        p.balance,
        human(p.largest_part_bytes),
        human(p.average_bytes),
        human(p.largest_model_bytes)
    );
    o
}

fn render_report(r: &BatchReport, quiet: bool) -> String {
    let mut o = String::new();
    let shown: Vec<&ModelResult> = r
        .models
        .iter()
        .filter(|m| !quiet || m.status == batch::Status::Failed)
        .collect();
    let width = shown
        .iter()
        .map(|m| escape(&m.name).chars().count())
        .max()
        .unwrap_or(0)
        .max(5);
    if !shown.is_empty() {
        let _ = writeln!(
            o,
            "{:<width$}  {:>10}  {:>8}  STATUS",
            "MODEL", "BYTES", "SECONDS"
        );
    }
    for m in shown {
        let status = match &m.reason {
            Some(reason) => format!("{}: {}", m.status, escape(reason)),
            None if m.resumed_shards > 0 => {
                format!("{} (resumed, kept {} shards)", m.status, m.resumed_shards)
            }
            None => m.status.to_string(),
        };
        let _ = writeln!(
            o,
            "{:<width$}  {:>10}  {:>8.2}  {status}",
            escape(&m.name),
            human(m.bytes),
            m.seconds
        );
        for note in &m.notes {
            let _ = writeln!(o, "  note: {}", escape(note));
        }
        if let Some(line) = verify_line(m) {
            let _ = writeln!(o, "  {line}");
        }
    }
    if quiet {
        return o;
    }
    let t = &r.totals;
    let mut counts = format!("{} converted, {} up to date", t.converted, t.up_to_date);
    if t.passed > 0 {
        let _ = write!(counts, ", {} passed", t.passed);
    }
    let _ = writeln!(
        o,
        "{counts}, {} failed, {} skipped; {} in {:.2} s; buffers peaked at {} of a {} window",
        t.failed,
        t.skipped,
        human(t.bytes),
        r.seconds,
        human(r.peak_buffer_bytes),
        human(r.window)
    );
    o
}

/// What `--verify-source` did for `m`, when it checked any file: how long
/// the hash took beside the job and how long the job waited for it.
fn verify_line(m: &ModelResult) -> Option<String> {
    let files = m.verified_files.filter(|&n| n > 0)?;
    Some(format!(
        "verified {files} source file{} by sha256 in {:.2} s alongside the job, which waited {:.2} s for it",
        if files == 1 { "" } else { "s" },
        m.verify_seconds.unwrap_or_default(),
        m.verify_waited_seconds.unwrap_or_default()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Wrap {
        #[command(flatten)]
        args: Args,
    }

    fn parse(extra: &[&str]) -> Result<Args, clap::Error> {
        let mut argv = vec!["batch", "root", "--out", "out"];
        argv.extend_from_slice(extra);
        Wrap::try_parse_from(argv).map(|w| w.args)
    }

    #[test]
    fn batch_flags_are_not_under_the_fit_or_validate_headings() {
        use clap::CommandFactory;
        let help = Wrap::command().render_help().to_string();
        let machine = help.find("Machine (--mode fit, --fit):").unwrap();
        let general = &help[..machine];
        for flag in [
            "--jobs",
            "--part",
            "--balance",
            "--plan-parts",
            "--verify-source",
            "--mode",
            "--report",
            "--fail-fast",
            "--dry-run",
            "--json",
            "--quiet",
        ] {
            assert!(
                general.contains(flag),
                "{flag} is not with the batch options:\n{help}"
            );
        }
    }

    #[test]
    fn defaults() {
        let a = parse(&[]).unwrap();
        assert_eq!((a.jobs, a.part, a.mode), (1, None, ModeArg::Convert));
        assert!(!a.dry_run && !a.fail_fast && !a.verify_source);
    }

    #[test]
    fn jobs_must_be_positive() {
        assert_eq!(parse(&["--jobs", "3"]).unwrap().jobs, 3);
        assert!(parse(&["--jobs", "0"]).is_err());
    }

    #[test]
    fn part_parses_i_of_n() {
        assert_eq!(
            parse(&["--part", "2/8"]).unwrap().part,
            Some(Part { index: 2, count: 8 })
        );
        assert!(parse(&["--part", "8/8"]).is_err());
        assert!(parse(&["--part", "x"]).is_err());
    }

    #[test]
    fn balance_defaults_to_bytes_and_plan_parts_stands_alone() {
        assert_eq!(parse(&[]).unwrap().balance, BalanceArg::Bytes);
        assert_eq!(
            Balance::from(parse(&["--balance", "name"]).unwrap().balance),
            Balance::Name
        );
        assert!(parse(&["--balance", "size"]).is_err());
        assert_eq!(parse(&["--plan-parts", "4"]).unwrap().plan_parts, Some(4));
        assert!(parse(&["--plan-parts", "0"]).is_err());
        assert!(parse(&["--plan-parts", "4", "--part", "0/4"]).is_err());
        assert!(parse(&["--plan-parts", "4", "--dry-run"]).is_err());
        assert!(parse(&["--plan-parts", "100001"]).is_err());
    }

    #[test]
    fn modes() {
        assert_eq!(parse(&["--mode", "fit"]).unwrap().mode, ModeArg::Fit);
        assert_eq!(
            Mode::from(parse(&["--mode", "validate"]).unwrap().mode),
            Mode::Validate
        );
        assert!(parse(&["--mode", "bake"]).is_err());
    }

    #[test]
    fn fit_takes_for_and_excludes_what_it_decides() {
        let a = parse(&["--fit", "--for", "transformers", "--vram", "8GiB"]).unwrap();
        assert_eq!(
            a.fit.target(&a.machine).unwrap().program.name,
            "transformers"
        );
        assert!(parse(&["--fit"]).is_err());
        assert!(parse(&["--fit", "--for", "vllm", "--dtype", "bf16"]).is_err());
        assert!(parse(&["--fit", "--for", "vllm", "--quantize", "fp8"]).is_err());
    }

    #[test]
    fn convert_options_are_shared() {
        let a = parse(&[
            "--window",
            "1MiB",
            "--max-shard-size",
            "50KB",
            "--dtype",
            "bf16",
        ])
        .unwrap();
        let o = a.options.to_options();
        assert_eq!((o.window, o.plan.max_shard_size), (1 << 20, 50_000));
    }
}
