//! `reshard convert`: rewrite a checkpoint into small, layer-ordered shards.

use anyhow::Context;

use reshard::convert::{convert, convert_layout};
use reshard::exec::WindowPool;
use reshard::format::layout as layouts;
use reshard::format::{self};

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
    let bar = Bar::new(!(args.quiet || args.options.no_progress || args.print.json));
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
