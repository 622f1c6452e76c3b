//! `reshard batch-report merge A.json B.json ... [-o OUT]`: joins the
//! `--report` files of the parts of one `batch --part I/N` run into one
//! report (every model once, per-part totals, missing parts named).

use std::fmt::Write as _;
use std::path::PathBuf;

use reshard::batch::{merge, BatchReport, MergedReport, Status};
use reshard::units::human;

use super::ExitStatus;

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Join the --report files of the parts of one `batch --part I/N` run.
    ///
    /// The reports must come from the same ROOT, OUT, --mode, --balance and
    /// N, one per part. Exits 1 when a model failed or a part is missing.
    Merge(MergeArgs),
}

#[derive(Debug, clap::Args)]
struct MergeArgs {
    /// The reports, one per part (the files `batch --report` wrote).
    #[arg(required = true, value_name = "REPORT")]
    reports: Vec<PathBuf>,
    /// Also write the merged report as JSON to FILE (atomically).
    #[arg(short, long, value_name = "FILE")]
    output: Option<PathBuf>,
    #[command(flatten)]
    pub print: crate::cli::printer::OutputArgs,
    /// Print only failed models and missing parts.
    #[arg(short, long)]
    quiet: bool,
}

impl Args {
    /// Whether `--json` was given.
    pub fn json(&self) -> bool {
        match &self.command {
            Command::Merge(m) => m.print.json,
        }
    }
}

pub fn run(args: Args) -> anyhow::Result<ExitStatus> {
    match args.command {
        Command::Merge(args) => run_merge(args),
    }
}

fn run_merge(args: MergeArgs) -> anyhow::Result<ExitStatus> {
    let mut reports = Vec::with_capacity(args.reports.len());
    for path in args.reports {
        let report = BatchReport::read(&path)?;
        reports.push((path, report));
    }
    let merged = merge(reports)?;
    if let Some(path) = &args.output {
        merged.write(path)?;
    }
    args.print
        .printer()
        .result(&merged, || render(&merged, args.quiet))?;
    Ok(if merged.incomplete() {
        ExitStatus::CheckFailed
    } else {
        ExitStatus::Ok
    })
}

fn render(m: &MergedReport, quiet: bool) -> String {
    let mut o = String::new();
    if !quiet {
        let _ = writeln!(
            o,
            "{:<9}  {:>6}  {:>9}  {:>10}  {:>6}  {:>7}  {:>10}  {:>8}",
            "PART", "MODELS", "CONVERTED", "UP TO DATE", "FAILED", "SKIPPED", "BYTES", "SECONDS"
        );
        for p in &m.parts {
            let t = &p.totals;
            let models = t.converted + t.up_to_date + t.passed + t.failed + t.skipped;
            let _ = writeln!(
                o,
                "{:<9}  {models:>6}  {:>9}  {:>10}  {:>6}  {:>7}  {:>10}  {:>8.2}",
                p.part.to_string(),
                t.converted,
                t.up_to_date,
                t.failed,
                t.skipped,
                human(t.bytes),
                p.seconds
            );
        }
    }
    for r in m.models.iter().filter(|r| r.status == Status::Failed) {
        let _ = writeln!(
            o,
            "failed {} (part {}): {}",
            r.name,
            r.part,
            r.reason.as_deref().unwrap_or("")
        );
    }
    if m.missing_count > 0 {
        let listed: Vec<String> = m
            .missing_parts
            .iter()
            .map(|i| format!("{i}/{}", m.count))
            .collect();
        let more = m.missing_count.saturating_sub(listed.len() as u64);
        let tail = if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        };
        let _ = writeln!(
            o,
            "missing {} of {} parts: {}{tail}",
            m.missing_count,
            m.count,
            listed.join(", ")
        );
    }
    if quiet {
        return o;
    }
    let t = &m.totals;
    let mut counts = format!("{} converted, {} up to date", t.converted, t.up_to_date);
    if t.passed > 0 {
        let _ = write!(counts, ", {} passed", t.passed);
    }
    let _ = writeln!(
        o,
        "{} models in {} of {} parts: {counts}, {} failed, {} skipped; {}; longest part {:.2} s",
        m.models.len(),
        m.parts.len(),
        m.count,
        t.failed,
        t.skipped,
        human(t.bytes),
        m.seconds
    );
    o
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

    fn parse(argv: &[&str]) -> Result<MergeArgs, clap::Error> {
        let w = Wrap::try_parse_from([&["batch-report"], argv].concat())?;
        match w.args.command {
            Command::Merge(m) => Ok(m),
        }
    }

    #[test]
    fn merge_takes_reports_and_an_output() {
        let m = parse(&["merge", "a.json", "b.json", "-o", "all.json"]).unwrap();
        assert_eq!(
            m.reports,
            [PathBuf::from("a.json"), PathBuf::from("b.json")]
        );
        assert_eq!(m.output, Some(PathBuf::from("all.json")));
        assert!(!m.print.json && !m.quiet);
        assert!(parse(&["merge"]).is_err(), "at least one report");
        assert!(parse(&["join", "a.json"]).is_err());
    }
}
