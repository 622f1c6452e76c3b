//! `convert --fit`: plan with `fit --for PROGRAM`, say what was chosen and
//! why, refuse a DST the chosen form cannot be, and the budgets
//! `--validate` then loads under. The choice itself is the library's
//! ([`reshard::convert::fit`]), which `batch --fit` runs too.

use std::fmt::Write as _;

use anyhow::Context;

use reshard::convert::fit::{placement, FitChoice, FitTarget};
use reshard::convert::{ConvertOptions, DstKind};
use reshard::fit::make::Placement;
use reshard::fit::HostBudgetKind;
use reshard::units::human;
use reshard::validate::{DeviceSpec, ValidateOptions};

use super::args::{Args, FitArgs};
use crate::cli::machine::MachineArgs;
use crate::cli::{printer, ExitStatus};

impl FitArgs {
    /// What `--fit` plans for: `machine` as fit resolves it.
    pub fn target(&self, machine: &MachineArgs) -> Option<FitTarget> {
        let name = self.for_program.as_deref().filter(|_| self.fit)?;
        Some(FitTarget {
            program: reshard::fit::program::program(name)?,
            machine: machine.machine(),
            options: machine.options(String::new(), None),
            reserve: self.reserve.map(|r| r.bytes()),
        })
    }
}

/// Plans `args.src` for `--for`; the options that run the chosen form
/// (`base` with its dtype, scheme, format and shard size), or the exit
/// status when nothing fits (fit's report printed, nothing written).
pub(super) fn choose(
    args: &Args,
    base: &ConvertOptions,
) -> anyhow::Result<Result<(FitChoice, ConvertOptions), ExitStatus>> {
    let target = args
        .fit
        .target(&args.machine)
        .context("--fit needs --for PROGRAM")?;
    let choice = reshard::convert::fit::choose(&args.src, &target).with_context(|| {
        format!(
            "cannot plan {} for {}",
            args.src.display(),
            target.program.name
        )
    })?;
    let Some(options) = choice.apply(base) else {
        if args.print.json {
            printer::json(&serde_json::json!({ "fit": choice }))?;
        } else if args.quiet {
            printer::text(&format!("{}\n", choice.nothing_fits()))?;
        } else {
            let path = args.src.display().to_string();
            printer::text(&crate::cli::fit_for::render(&path, &choice.plan))?;
        }
        return Ok(Err(ExitStatus::CheckFailed));
    };
    check_dst(args, &choice)?;
    if !(args.quiet || args.print.json) {
        printer::text(&render(args, &choice))?;
    }
    Ok(Ok((choice, options)))
}

/// Refuses a DST the chosen form cannot be written as (before anything is
/// written): the user named the output, so it is not renamed behind their
/// back; the message names the form and the DST to give.
fn check_dst(args: &Args, choice: &FitChoice) -> anyhow::Result<()> {
    let (Some(want), Some(c)) = (choice.dst_kind(), &choice.chosen) else {
        return Ok(());
    };
    if DstKind::of(&args.dst) == want {
        return Ok(());
    }
    let program = &choice.plan.program;
    let form = c.form.name();
    let shape = match want {
        DstKind::GgufFile => "a GGUF file: name DST NAME.gguf".to_string(),
        DstKind::SafetensorsFile => {
            format!("one file, which {program} loads: name DST NAME.safetensors")
        }
        DstKind::Folder => format!(
            "a model folder, which {program} loads: name a folder (not ending in .safetensors or .gguf)"
        ),
    };
    anyhow::bail!(
        "{}: the best form for {program}, {form}, is {shape}",
        args.dst.display()
    )
}

/// What was chosen, why, and the command it amounts to.
fn render(args: &Args, choice: &FitChoice) -> String {
    let mut o = String::new();
    let (Some(c), Some(conv)) = (&choice.chosen, choice.conversion) else {
        return o;
    };
    let p = &choice.plan;
    let shards = match conv.max_shard_size {
        Some(s) => format!("shards of at most {}", human(s)),
        None => "one file".into(),
    };
    let _ = writeln!(
        o,
        "fit for {}: {} ({}), {shards}",
        p.program,
        c.form.name(),
        placement(c)
    );
    if let Some(why) = &choice.reason {
        let _ = writeln!(o, "  why: {why}");
    }
    let vram = match p.vram_budget {
        Some(b) => format!(
            "weights {} on the GPU as {} holds them, VRAM for weights {}",
            human(c.vram_weights),
            p.program,
            human(b)
        ),
        None => "no GPU".into(),
    };
    let _ = writeln!(
        o,
        "  file {}, {:.2} bits per weight; {vram}; host {} of {}",
        human(c.file_bytes),
        c.bits_per_weight,
        human(c.host.host_needed),
        human(p.budget.host_bytes)
    );
    let _ = writeln!(
        o,
        "  runs: reshard convert {} {}{}",
        reshard::platform::shell_quote(&args.src.display().to_string()),
        reshard::platform::shell_quote(&args.dst.display().to_string()),
        conv.flags()
    );
    o
}

/// What a `--fit` conversion that stopped at values too large for the
/// chosen form says (the cause, naming the tensor, follows): the same
/// command with `--on-overflow saturate` added, which `--fit` takes.
pub(super) fn overflow_advice(args: &Args, choice: &FitChoice) -> String {
    let form = choice
        .chosen
        .as_ref()
        .map_or("its form".to_string(), |c| c.form.name());
    let mut argv: Vec<String> = std::env::args_os()
        .skip(1)
        .map(|a| reshard::platform::shell_quote(&a.to_string_lossy()))
        .collect();
    argv.insert(0, "reshard".into());
    format!(
        "cannot convert {} into {} as {form}, the best form for {}: values too large for it stop the conversion; add --on-overflow saturate to the same --fit command to clamp them to the largest value {form} holds (or --on-overflow inf to write infinities): {} --on-overflow saturate",
        args.src.display(),
        args.dst.display(),
        choice.plan.program,
        argv.join(" ")
    )
}

/// `--validate` under the plan's budgets: the machine's host limit as the
/// commit budget, and the program's VRAM for weights as the VRAM budget:
/// the whole model within it when the plan puts every weight on the GPU,
/// and for a plan that offloads, at least the leading blocks it puts there
/// (the rest stays on the host). Returns the options and the line that
/// says so.
pub(super) fn budgets(
    choice: &FitChoice,
    mut options: ValidateOptions,
) -> (ValidateOptions, String) {
    let p = &choice.plan;
    options.commit_budget = Some(p.budget.host_bytes);
    let limit = match p.budget.host_kind {
        HostBudgetKind::CommitLimit => "the machine's commit limit",
        HostBudgetKind::AvailableRam => "the machine's available RAM",
    };
    let mut line = format!(
        "validate under the plan's budgets: commit {} ({limit})",
        human(p.budget.host_bytes)
    );
    let placed = choice.chosen.as_ref().map(|c| &c.placement);
    match (placed, p.vram_budget) {
        (Some(Placement::Gpu), Some(v)) => {
            options.vram_budget = Some(v);
            let _ = write!(
                line,
                ", VRAM {} (what {} gives weights) on {}",
                human(v),
                p.program,
                options.device
            );
            if options.device == DeviceSpec::Cpu {
                line.push_str(", standing in for GPU 0");
            }
        }
        (
            Some(Placement::Offload {
                blocks_on_gpu,
                blocks,
                ..
            }),
            Some(v),
        ) => {
            // The budget must hold the leading blocks the plan puts
            // there; what follows them is offloaded, not a failure.
            options.vram_budget = Some(v);
            options.vram_leading_blocks = usize::try_from(*blocks_on_gpu).ok();
            let _ = write!(
                line,
                ", VRAM {} (what {} gives weights) holding the first {blocks_on_gpu} of {blocks} blocks, the rest offloaded, on {}",
                human(v),
                p.program,
                options.device
            );
            if options.device == DeviceSpec::Cpu {
                line.push_str(", standing in for GPU 0");
            }
        }
        _ => line.push_str("; no GPU: no VRAM budget"),
    }
    (options, line)
}

#[cfg(test)]
mod tests {
    use super::super::args::Args;
    use clap::Parser;

    #[derive(clap::Parser)]
    struct Wrap {
        #[command(flatten)]
        args: Args,
    }

    fn parse(extra: &[&str]) -> Result<Args, clap::Error> {
        Wrap::try_parse_from([&["convert", "src", "dst"], extra].concat()).map(|w| w.args)
    }

    #[test]
    fn fit_takes_for_and_the_machine_flags() {
        let a = parse(&[
            "--fit", "--for", "comfyui", "--vram", "12GiB", "--os", "windows",
        ])
        .unwrap();
        assert!(a.fit.fit);
        assert_eq!(a.fit.target(&a.machine).unwrap().program.name, "comfyui");
        assert!(parse(&["--fit"]).is_err(), "--fit without --for");
        // --on-overflow goes with --fit: for the form it chooses.
        let a = parse(&["--fit", "--for", "comfyui", "--on-overflow", "saturate"]).unwrap();
        assert!(a.options.check_on_overflow(a.fit.fit).is_ok());
        assert!(parse(&["--for", "comfyui"]).is_err(), "--for without --fit");
    }

    #[test]
    fn what_fit_decides_cannot_also_be_given() {
        for flag in [
            &["--dtype", "bf16"][..],
            &["--quantize", "fp8"],
            &["--max-shard-size", "1GB"],
            &["--single-file"],
            &["--commit-budget", "1GiB"],
            &["--vram-budget", "1GiB"],
        ] {
            let argv = [&["--fit", "--for", "comfyui"][..], flag].concat();
            assert!(parse(&argv).is_err(), "{flag:?}");
        }
    }

    #[test]
    fn machine_flags_need_fit() {
        for flag in [
            &["--vram", "12GiB"][..],
            &["--ram", "32GiB"],
            &["--os", "windows"],
            &["--baseline", "1GiB"],
            &["--reserve", "1GiB"],
        ] {
            assert!(parse(flag).is_err(), "{flag:?}");
        }
        // Its default does not count as given.
        assert!(parse(&[]).is_ok());
    }
}
