//! `reshard convert`: rewrite a checkpoint into small, layer-ordered shards.

use anyhow::Context;

use reshard::convert::ConvertSource;
use reshard::exec::WindowPool;
use reshard::format::layout as layouts;

use reshard::validate::validate_with_budget;

use super::progress::Bar;
use super::{printer, ExitStatus};

mod args;
mod layout;
mod render;

pub use self::args::{parse_block, Args, ConvertArgs, QuantizeArg};
use self::layout::{dry_run, print_notes, render_components, run_split};
use self::render::render_summary;

pub fn run(args: Args) -> anyhow::Result<ExitStatus> {
    let mut options = args.options.to_options();
    options.single_file = !args.src.is_dir();
    if args.options.layout.split_components {
        return run_split(&args, &options);
    }
    // A folder is read as a layout (its weight sets and the rest of its
    // tree); a file is one checkpoint. `batch` converts through the same.
    let source = ConvertSource::open(&args.src)
        .with_context(|| format!("cannot convert {}", args.src.display()))?;
    if args.dry_run {
        return dry_run(&args, &source, &options);
    }
    if !args.quiet {
        // What inspect would report: the output fixes some (format: pt,
        // alignment, index mismatches), the user should know about the rest.
        for finding in source.findings() {
            eprintln!("note: source: {finding}");
        }
        for note in source.notes() {
            eprintln!("note: {note}");
        }
    }
    let cancel = super::cancel::on_ctrl_c();
    let bar = Bar::new(!(args.quiet || args.options.no_progress || args.print.json));
    let pool = WindowPool::new(options.window);
    let result = source.convert(&args.dst, &options, &pool, &bar, cancel, &|| Ok(()));
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
    if args.print.json && !args.validate {
        printer::json(&summary)?;
    } else if !args.quiet && !args.print.json {
        printer::text(&render_summary(&summary, args.verbose))?;
        printer::text(&render_components(&summary.components, args.verbose))?;
    }
    if !args.validate {
        return Ok(ExitStatus::Ok);
    }
    // Each weight set is validated against its source folder.
    let mut reports = Vec::new();
    for rel in &source.weight_sets() {
        let src = source.set_dir(rel);
        let dst = layouts::join_rel(&args.dst, rel);
        let options = args.load.options(Some(src));
        let report = validate_with_budget(&dst, &options)
            .with_context(|| format!("cannot validate {}", dst.display()))?;
        if !args.print.json && (!args.quiet || !report.passed) {
            printer::text(&super::validate::render(&report))?;
        }
        reports.push(report);
    }
    let passed = reports.iter().all(|r| r.passed);
    if args.print.json {
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
