//! `convert`'s layout options and the runs they lead to: `--single-file`,
//! `--split-components` with `--component-prefix`, `--keep-dtype-preset`,
//! the dry run of every weight set, and the notes about what was copied.

use anyhow::Context;

use reshard::convert::fit::FitChoice;
use reshard::convert::{
    convert_split, ComponentSummary, ConvertOptions, ConvertSource, ConvertSummary,
};
use reshard::exec::WindowPool;
use reshard::format;

use super::args::Args;
use super::render::{render_plan, render_summary};
use crate::cli::progress::Bar;
use crate::cli::{printer, ExitStatus};

/// `convert --split-components`.
pub(super) fn run_split(args: &Args, options: &ConvertOptions) -> anyhow::Result<ExitStatus> {
    let ck = format::open(&args.src)
        .with_context(|| format!("cannot convert {}", args.src.display()))?;
    let prefixes = &args.options.layout.component_prefix;
    if args.dry_run {
        let plans = reshard::convert::plan_split(&ck, options, prefixes)
            .with_context(|| format!("cannot plan {}", args.src.display()))?;
        if args.print.json {
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
    let cancel = crate::cli::cancel::on_ctrl_c();
    let bar = Bar::new(!(args.quiet || args.options.no_progress || args.print.json));
    let pool = WindowPool::new(options.window);
    let components = convert_split(&ck, &args.dst, options, prefixes, &pool, &bar, cancel)
        .with_context(|| {
            format!(
                "cannot split {} into {}",
                args.src.display(),
                args.dst.display()
            )
        })?;
    if args.print.json {
        printer::json(&serde_json::json!({ "components": components }))?;
    } else if !args.quiet {
        printer::text(&render_components(&components, args.verbose))?;
    }
    Ok(ExitStatus::Ok)
}

pub(super) fn render_components(components: &[ComponentSummary], verbose: bool) -> String {
    components
        .iter()
        .map(|c| format!("{}: {}", c.path, render_summary(&c.summary, verbose)))
        .collect()
}

/// `convert --dry-run`: the plan of every weight set, written nowhere.
pub(super) fn dry_run(
    args: &Args,
    source: &ConvertSource,
    options: &ConvertOptions,
    fit: Option<&FitChoice>,
) -> anyhow::Result<ExitStatus> {
    // The plans convert executes, from the library's per-set options.
    let mut plans = source
        .plans(options)
        .with_context(|| format!("cannot plan {}", args.src.display()))?;
    // A file DST's shards are staged under the plan's names and land at
    // DST (a gguf-split set beside it): show where they land.
    let kind = reshard::convert::DstKind::of(&args.dst);
    if let ([(rel, plan)], true) = (
        plans.as_mut_slice(),
        kind != reshard::convert::DstKind::Folder,
    ) {
        let count = plan.shards.len();
        let split =
            kind == reshard::convert::DstKind::GgufFile && args.options.max_shard_size.is_some();
        for (n, s) in plan.shards.iter_mut().enumerate() {
            let at = match split {
                true => reshard::convert::split_name(&args.dst, n, count),
                false => args.dst.clone(),
            };
            if rel.is_empty() {
                s.file = at.display().to_string();
            }
        }
    }
    if args.print.json {
        let json = match plans.as_slice() {
            [(rel, plan)] if rel.is_empty() => serde_json::to_value(plan)?,
            _ => serde_json::to_value(
                plans
                    .iter()
                    .map(|(rel, plan)| serde_json::json!({"path": rel, "plan": plan}))
                    .collect::<Vec<_>>(),
            )?,
        };
        match fit {
            Some(c) => printer::json(&serde_json::json!({"fit": c, "plan": json}))?,
            None => printer::json(&json)?,
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
pub(super) fn print_notes(s: &ConvertSummary, folder: &str) {
    for skipped in &s.skipped_files {
        eprintln!(
            "note: not copied: {:?}: {}",
            format!("{folder}{}", skipped.name),
            skipped.reason
        );
    }
    for (name, to) in &s.set_aside {
        eprintln!(
            "note: moved aside: {:?} to {:?}: a manifest found in the output claimed it, but its bytes are not what that manifest recorded reshard writing",
            format!("{folder}{}", reshard::names::escape(name)),
            reshard::names::escape(to)
        );
    }
    if let Some(warning) = s
        .manifest
        .quantized
        .as_ref()
        .and_then(|q| super::render::nothing_quantized(q.scheme, q.tensors))
    {
        eprintln!("{warning}");
    }
    for name in &s.copied_as_is {
        let name = reshard::names::escape(&format!("{folder}{name}")).into_owned();
        eprintln!("note: copied as is (a weight file outside any converted folder, not converted): {name}");
    }
}

#[cfg(test)]
mod tests {
    use super::super::args::ConvertArgs;
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
            "--dtype",
            "bf16",
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
        assert!(parse(&["--dtype", "bf16", "--keep-dtype-preset", "unet"]).is_err());
        // What only --dtype reads is refused without it, not ignored.
        for flag in [&["--keep-dtype", "x"][..], &["--keep-dtype-preset", "vae"]] {
            assert!(parse(flag).is_err(), "{flag:?}");
        }
        // --on-overflow also goes with --fit, which this parser lacks:
        // checked after parsing.
        let alone = parse(&["--on-overflow", "inf"]).unwrap();
        assert!(alone.check_on_overflow(false).is_err());
        assert!(alone.check_on_overflow(true).is_ok());
        let cast = parse(&["--dtype", "f16", "--on-overflow", "inf"]).unwrap();
        assert!(cast.check_on_overflow(false).is_ok());
    }
}
