//! `reshard validate`: check a checkpoint's integrity and load it on a
//! device within a commit budget; exit 1 when a check fails.

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::Context;

use reshard::format::layout::LayoutKind;
use reshard::names::escape;
use reshard::units::{human, ByteSize, TimeSpan};
use reshard::validate::python::{self, PythonLoader, PythonOptions, PythonReport};
use reshard::validate::{
    self, DeviceSpec, Loader, Progress, SetReport, ValidateOptions, ValidateReport,
};

use super::printer::{self, paint, plural, Colour};
use super::progress::Bar;
use super::ExitStatus;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The checkpoint to validate (file, folder or Hugging Face cache folder).
    path: PathBuf,
    #[command(flatten)]
    load: LoadArgs,
    /// Compare every tensor with this source checkpoint.
    #[arg(long, value_name = "SRC")]
    against: Option<PathBuf>,
    /// Reproduce another loader's memory pattern (fit's model, term by
    /// term) instead of reshard's loader: transformers-v5-mmap,
    /// transformers-v5-pread, per-shard-mmap, full-read or diffusers (not
    /// the GGUF loaders, whose read-only mappings commit nothing). Host
    /// commit only: --device and --vram-budget do not apply.
    #[arg(long, value_name = "LOADER", conflicts_with = "loader", value_parser = parse_emulated)]
    emulate: Option<Loader>,
    /// Run a real loader in your own Python and measure it from outside:
    /// python:transformers, python:transformers-pread,
    /// python:transformers-disable-mmap, python:safetensors,
    /// python:diffusers or python:sentence-transformers. --commit-budget
    /// is enforced above the process's commit once its libraries are
    /// imported; the report shows fit's prediction beside the measurement.
    #[arg(long, value_name = "python:NAME", conflicts_with = "against")]
    loader: Option<PythonLoader>,
    /// The Python to run --loader in (default: $RESHARD_PYTHON, else
    /// `python` on PATH).
    #[arg(long, value_name = "PATH", requires = "loader")]
    python: Option<PathBuf>,
    /// Kill --loader (and every process it started) if it has not finished
    /// after DURATION (90s, 30m, 2h), imports included, and exit 2. The
    /// default, 2h, is far above a 70B model in transformers (140 GB of
    /// bf16 is about 25 minutes from a 100 MB/s disk), so only a hung
    /// loader meets it.
    #[arg(
        long,
        value_name = "DURATION",
        default_value = "2h",
        requires = "loader"
    )]
    loader_timeout: TimeSpan,
    #[command(flatten)]
    pub print: crate::cli::printer::OutputArgs,
    /// Print only the verdict (`passed`, or `FAILED` and each problem) and
    /// errors.
    #[arg(short, long)]
    quiet: bool,
    /// Hide the progress bar (it is drawn on stderr, only when stderr is a
    /// terminal; never with --json or -q, nor under --commit-budget, whose
    /// load runs in a child process).
    #[arg(long)]
    no_progress: bool,
}

/// How to load: shared by `validate`, `convert --validate` and
/// `batch --mode validate`.
#[derive(Debug, Clone, clap::Args)]
pub struct LoadArgs {
    /// Where to load: cpu (host memory standing in for a device), cuda or cuda:N.
    #[arg(long, default_value = "cpu", value_name = "DEVICE")]
    device: DeviceSpec,
    /// Enforce a commit budget: the load runs in a child process whose
    /// RLIMIT_DATA is its baseline plus SIZE; an allocation past it fails.
    #[arg(long, value_name = "SIZE")]
    commit_budget: Option<ByteSize>,
    /// Device bytes the model may hold in total; reports how many leading
    /// blocks fit.
    #[arg(long, value_name = "SIZE")]
    vram_budget: Option<ByteSize>,
    /// Size of the one staging buffer every byte passes through (capped at
    /// the largest tensor).
    #[arg(long, value_name = "SIZE", default_value = "64MiB")]
    staging: ByteSize,
}

impl LoadArgs {
    /// Options loading on this device under these budgets, compared with
    /// `against` when given.
    pub fn options(&self, against: Option<PathBuf>) -> ValidateOptions {
        ValidateOptions {
            device: self.device,
            staging: self.staging.bytes(),
            vram_budget: self.vram_budget.map(ByteSize::bytes),
            vram_leading_blocks: None,
            commit_budget: self.commit_budget.map(ByteSize::bytes),
            against,
            emulate: None,
            cancel: reshard::validate::Cancel::new(super::cancel::on_ctrl_c()),
            progress: Progress::default(),
        }
    }
}

impl Args {
    fn to_options(&self) -> ValidateOptions {
        ValidateOptions {
            emulate: self.emulate,
            ..self.load.options(self.against.clone())
        }
    }

    /// The bar the load draws, when one is drawn at all.
    fn progress(&self) -> Progress {
        let show = !(self.quiet || self.no_progress || self.print.json);
        Progress::new(std::sync::Arc::new(Bar::new(show)))
    }
}

pub fn run(args: Args) -> anyhow::Result<ExitStatus> {
    if let Some(loader) = args.loader {
        return run_python(&args, loader);
    }
    // One bar for whichever of the two runs: a weight set at a time, or
    // the plain model.
    let progress = args.progress();
    if let Some(status) = run_layout(&args, progress.clone())? {
        return Ok(status);
    }
    let options = ValidateOptions {
        progress,
        ..args.to_options()
    };
    let report = validate::validate_with_budget(&args.path, &options)
        .with_context(|| format!("cannot validate {}", args.path.display()))?;
    args.print.printer().result(&report, || {
        if args.quiet {
            render_verdict(&report)
        } else {
            render(&report)
        }
    })?;
    Ok(if report.passed {
        ExitStatus::Ok
    } else {
        ExitStatus::CheckFailed
    })
}

#[derive(serde::Serialize)]
struct LayoutReport {
    path: String,
    kind: LayoutKind,
    passed: bool,
    components: Vec<SetReport>,
}

/// A pipeline or sentence-transformers folder (as `convert` writes it):
/// each weight set validated on its own, as its library loads it, against
/// the same set of `--against` when given. `None` for a plain model.
fn run_layout(args: &Args, progress: Progress) -> anyhow::Result<Option<ExitStatus>> {
    let options = ValidateOptions {
        progress,
        ..args.to_options()
    };
    let Some((layout, components)) = validate::validate_sets(&args.path, &options)
        .with_context(|| format!("cannot validate {}", args.path.display()))?
    else {
        return Ok(None);
    };
    let passed = components.iter().all(|c| c.report.passed);
    if args.print.json {
        printer::json(&LayoutReport {
            path: args.path.display().to_string(),
            kind: layout.kind,
            passed,
            components,
        })?;
    } else {
        let mut o = if args.quiet {
            String::new()
        } else {
            format!(
                "{}: {}, {} weight sets, each validated on its own\n",
                escape(&args.path.display().to_string()),
                layout.kind.describe(),
                components.len()
            )
        };
        for c in components
            .iter()
            .filter(|c| !args.quiet || !c.report.passed)
        {
            let _ = writeln!(o, "\n[{}]", escape(&c.component));
            if args.quiet {
                o.push_str(&render_verdict(&c.report));
            } else {
                o.push_str(&render(&c.report));
            }
        }
        let failed: Vec<&str> = components
            .iter()
            .filter(|c| !c.report.passed)
            .map(|c| c.component.as_str())
            .collect();
        let gap = if o.is_empty() { "" } else { "\n" };
        if failed.is_empty() {
            let _ = writeln!(o, "{gap}all {} weight sets passed", components.len());
        } else {
            let _ = writeln!(o, "{gap}failed: {}", failed.join(", "));
        }
        printer::text(&o)?;
    }
    Ok(Some(if passed {
        ExitStatus::Ok
    } else {
        ExitStatus::CheckFailed
    }))
}

/// `--loader python:NAME`: the real loader, measured.
fn run_python(args: &Args, loader: PythonLoader) -> anyhow::Result<ExitStatus> {
    let python = args
        .python
        .clone()
        .or_else(|| std::env::var_os("RESHARD_PYTHON").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from("python"));
    let options = PythonOptions {
        loader,
        python,
        device: args.load.device,
        commit_budget: args.load.commit_budget.map(ByteSize::bytes),
        baseline: reshard::fit::DEFAULT_BASELINE,
        timeout: args.loader_timeout.0,
    };
    // The loader heads its own process group, out of the terminal's reach:
    // Ctrl-C is passed on by killing it.
    let cancel = super::cancel::on_ctrl_c();
    let report = python::run(&args.path, &options, cancel)
        .with_context(|| format!("cannot validate {}", args.path.display()))?;
    args.print.printer().result(&report, || {
        let text = render_python(&report);
        if args.quiet {
            // The verdict is the last line.
            let last = text.lines().last().unwrap_or_default();
            format!("{last}\n")
        } else {
            text
        }
    })?;
    Ok(if report.passed {
        ExitStatus::Ok
    } else {
        ExitStatus::CheckFailed
    })
}

pub fn render_python(r: &PythonReport) -> String {
    let mut o = String::new();
    let versions: Vec<String> = r.versions.iter().map(|(k, v)| format!("{k} {v}")).collect();
    let _ = writeln!(
        o,
        "{}: {} on {} in {} ({})",
        escape(&r.path),
        r.loader,
        r.device,
        r.python,
        versions.join(", ")
    );
    if let (Some(t), Some(b), Some(s)) = (r.tensors, r.bytes, r.load_seconds) {
        let _ = writeln!(o, "loaded {t} tensors, {} in {s:.1} s", human(b));
    }
    let budget = r
        .commit_budget
        .map(|b| format!(", budget {} (enforced)", human(b)))
        .unwrap_or_default();
    let _ = writeln!(
        o,
        "commit ({}): peak {} above a baseline of {} ({} absolute, {} samples){budget}",
        r.commit_source,
        human(r.peak_above_baseline),
        human(r.baseline),
        human(r.peak_commit),
        r.samples
    );
    let _ = writeln!(
        o,
        "rss: peak {} (baseline {})",
        human(r.peak_rss),
        human(r.baseline_rss)
    );
    let p = &r.prediction;
    // A ratio to a load that stopped early would mislead.
    let ratio = if r.peak_above_baseline > 0 && r.failure.is_none() {
        format!(
            " ({:.2} x measured)",
            p.peak_commit as f64 / r.peak_above_baseline as f64
        )
    } else {
        String::new()
    };
    let _ = writeln!(
        o,
        "fit predicts ({}): {} above a baseline of {}{ratio}",
        p.loader,
        human(p.peak_commit),
        human(p.baseline)
    );
    match &r.failure {
        None => {
            let _ = writeln!(o, "passed");
        }
        Some(f) => {
            let _ = writeln!(o, "FAILED: {f}");
        }
    }
    o
}

/// The hidden entry of the budget child process.
pub fn run_child() -> ExitStatus {
    let json = validate::budget::child_main();
    match printer::raw(&format!("{json}\n")) {
        Ok(()) => ExitStatus::Ok,
        Err(_) => ExitStatus::Error,
    }
}

/// `dedicated memory (cuMemGetInfo): 2.00 GiB free at the start; 5 of 8
/// blocks allocated in it, from model.layers.5 on past it (...)`.
fn render_placement(p: &reshard::validate::Placement) -> String {
    let blocks = p.groups.iter().filter(|g| g.block);
    let total = blocks.clone().count();
    let inside = blocks.filter(|g| g.dedicated).count();
    let mut line = format!(
        "dedicated memory (cuMemGetInfo): {} free at the start; {inside} of {total} blocks allocated in it",
        human(p.free_at_start)
    );
    match p.groups.iter().find(|g| !g.dedicated) {
        Some(g) => line.push_str(&format!(
            ", from {} on past it (in system memory where the driver falls back to it)",
            g.name
        )),
        None => line.push_str(", with every tensor outside them"),
    }
    line
}

pub fn render(r: &ValidateReport) -> String {
    let mut o = String::new();
    let gpu = r.device.device.starts_with("cuda");
    let checks = match (r.manifest, r.against.is_some(), gpu) {
        (false, false, _) if r.emulation.is_some() => "no reshard.json: headers checked and the shards loaded as the emulated loader loads them; nothing compared",
        (true, _, _) => "shard digests (as reshard.json records them: BLAKE3 or sha256) and xxh3 checked against reshard.json",
        (false, true, _) => "no reshard.json: headers and offsets checked and every byte read; values compared with --against below",
        (false, false, true) => "no reshard.json: headers and offsets checked, every byte read and read back from the GPU; nothing compared (no checksums to check; --against SRC compares with a source)",
        (false, false, false) => "no reshard.json: headers and offsets checked and every byte read; nothing compared (no checksums to check; --against SRC compares with a source)",
    };
    let _ = writeln!(
        o,
        "{}: {} tensors in {} {}, {checks}",
        escape(&r.path),
        r.tensors,
        r.files,
        plural(r.files, "file", "files")
    );
    if let Some(e) = &r.emulation {
        let _ = writeln!(
            o,
            "emulating {}: {} {}, sum(S) {}, max(S) {}, predicted peak {}",
            e.loader,
            e.shards,
            plural(e.shards, "shard", "shards"),
            human(e.sum_shards),
            human(e.max_shard),
            human(e.predicted_peak)
        );
    } else {
        let mem = r
            .device
            .total_memory
            .map(|m| format!(", {} dedicated", human(m)))
            .unwrap_or_default();
        let pinned = if r.device.pinned_staging {
            "pinned "
        } else {
            ""
        };
        let _ = writeln!(
            o,
            "device {} ({}{mem}), {pinned}staging buffer {}",
            r.device.device,
            r.device.name,
            human(r.staging)
        );
    }
    for s in &r.shards {
        let rate = s.bytes as f64 / s.seconds.max(1e-9) / 1e9;
        let _ = writeln!(
            o,
            "  {}  {:>10}  {:>4} {:<7}  {:.3} s  {rate:.2} GB/s",
            escape(&s.file),
            human(s.bytes),
            s.tensors,
            plural(s.tensors, "tensor", "tensors"),
            s.seconds
        );
    }
    let _ = writeln!(
        o,
        "loaded {} in {:.3} s ({:.2} GB/s)",
        human(r.bytes_loaded),
        r.load_seconds,
        r.throughput_gb_s
    );
    if r.emulation.is_none() {
        let _ = writeln!(
            o,
            "device memory: {} allocated in total (as a GPU holds it), at most {} held at once",
            human(r.device_bytes),
            human(r.device_peak_held)
        );
    }
    if let Some(v) = &r.vram {
        let offload = match v.blocks_required {
            Some(n) => format!(" (the plan holds {n} there and offloads the rest)"),
            None => String::new(),
        };
        let _ = writeln!(
            o,
            "vram budget {}: the model needs {}; {} of {} leading blocks fit{offload}",
            human(v.budget),
            human(v.needed),
            v.blocks_fit,
            v.blocks_total
        );
    }
    if let Some(p) = &r.placement {
        let _ = writeln!(o, "{}", render_placement(p));
    }
    if let Some(c) = &r.commit {
        let budget = r
            .commit_budget
            .map(|b| match r.commit_budget_enforced {
                Some(true) => format!(", budget {} (enforced)", human(b)),
                Some(false) => format!(
                    ", budget {} (not enforced: this system let the load commit past the limit, \
                     as Wine does; the budget is judged from the measured peak)",
                    human(b)
                ),
                None => format!(", budget {}", human(b)),
            })
            .unwrap_or_default();
        let _ = writeln!(
            o,
            "commit ({}): peak {} above a baseline of {} ({} absolute){budget}",
            c.source,
            human(c.peak_above_baseline),
            human(c.baseline),
            human(c.peak)
        );
    }
    if let Some(a) = &r.against {
        let _ = writeln!(
            o,
            "against {}: {} tensors compared ({} through a cast{})",
            escape(&a.source),
            a.tensors_compared,
            a.cast_compared,
            if a.dequantized_compared > 0 {
                format!(", {} through dequantization", a.dequantized_compared)
            } else {
                String::new()
            }
        );
        if let (false, Some(q)) = (a.gguf_types.is_empty(), &a.quality) {
            let _ = writeln!(
                o,
                "  {} of them compared with the source converted to GGUF again ({}: names, rows, blocks)",
                a.quantized_compared,
                a.gguf_types.join(", ")
            );
            if a.kept_as_float > 0 {
                let _ = writeln!(
                    o,
                    "  {} of them kept as a float type where converting the source gives a block type (--keep, --quantize-only or --keep-dtype)",
                    a.kept_as_float
                );
            }
            o.push_str(&crate::cli::quality::render_quality(q));
        }
        if let (Some(scheme), Some(q)) = (a.quantize_scheme, &a.quality) {
            let what = match scheme.recipe(reshard::plan::quantize::DEFAULT_BLOCK) {
                Some(_) => "codes, scales, companions",
                None => "codes, clamped and rounded, no scales",
            };
            let _ = writeln!(
                o,
                "  {} of them compared with the source quantized again ({}: {what})",
                a.quantized_compared,
                scheme.name()
            );
            o.push_str(&crate::cli::quality::render_quality(q));
        }
    }
    o.push_str(&render_verdict(r));
    o
}

/// `passed`, or `FAILED: N problems` and one line per problem: all that
/// `-q` prints.
pub fn render_verdict(r: &ValidateReport) -> String {
    let mut o = String::new();
    if r.passed {
        let _ = writeln!(o, "{}", paint("passed", Colour::Good));
    } else {
        let n = r.failures.len();
        let failed = paint("FAILED", Colour::Bad);
        let _ = writeln!(o, "{failed}: {n} {}", plural(n, "problem", "problems"));
        for f in &r.failures {
            // One failure, one line: a newline can only come from a name.
            let _ = writeln!(o, "  - {}", escape(&f.to_string()));
        }
    }
    o
}

/// `--emulate`: one of fit's loaders whose pattern validate reproduces
/// (the GGUF loaders map read-only and commit nothing to reproduce).
fn parse_emulated(s: &str) -> Result<Loader, String> {
    let l: Loader = s.parse()?;
    if l.emulated() {
        Ok(l)
    } else {
        Err(format!(
            "{l} maps every file read-only, which commits nothing to reproduce: use `reshard validate` (its own loader) or the real program"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use reshard::validate::DEFAULT_STAGING;

    #[derive(Debug, Parser)]
    struct Wrap {
        #[command(flatten)]
        args: Args,
    }

    #[test]
    fn help_names_every_python_loader() {
        use clap::CommandFactory;
        let help = Wrap::command().render_long_help().to_string();
        let flat = help.split_whitespace().collect::<Vec<_>>().join(" ");
        for l in PythonLoader::ALL {
            let name = format!("python:{}", l.name());
            let listed = flat
                .split([',', ' '])
                .any(|w| w.trim_end_matches('.') == name);
            assert!(listed, "{name} missing from validate --help");
        }
    }

    fn parse(argv: &[&str]) -> Result<ValidateOptions, clap::Error> {
        Wrap::try_parse_from(std::iter::once("validate").chain(argv.iter().copied()))
            .map(|w| w.args.to_options())
    }

    #[test]
    fn parses_flags_into_options() {
        let o = parse(&["m"]).unwrap();
        assert_eq!(o, ValidateOptions::default());
        assert_eq!(o.staging, DEFAULT_STAGING);
        let o = parse(&[
            "m",
            "--device",
            "cuda:1",
            "--commit-budget",
            "8GiB",
            "--vram-budget",
            "24GB",
            "--staging",
            "1MiB",
            "--emulate",
            "per-shard-mmap",
            "--against",
            "src",
        ])
        .unwrap();
        assert_eq!(o.device, DeviceSpec::Cuda(1));
        assert_eq!(o.commit_budget, Some(8 << 30));
        assert_eq!(o.vram_budget, Some(24_000_000_000));
        assert_eq!(o.staging, 1 << 20);
        assert_eq!(o.emulate, Some(Loader::PerShardMmap));
        assert_eq!(o.against.as_deref(), Some(std::path::Path::new("src")));
        for bad in [
            &["m", "--device", "gpu"][..],
            &["m", "--emulate", "vllm"],
            &["m", "--emulate", "llama.cpp"],
            &["m", "--emulate", "comfyui-gguf"],
            &["m", "--commit-budget", "lots"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }

    fn loader_timeout(argv: &[&str]) -> Result<std::time::Duration, clap::Error> {
        Wrap::try_parse_from(std::iter::once("validate").chain(argv.iter().copied()))
            .map(|w| w.args.loader_timeout.0)
    }

    #[test]
    fn parses_the_loader_timeout() {
        let l = ["m", "--loader", "python:transformers"];
        assert_eq!(
            loader_timeout(&l).unwrap(),
            reshard::validate::python::DEFAULT_TIMEOUT
        );
        let with = |t: &str| loader_timeout(&[&l[..], &["--loader-timeout", t]].concat());
        assert_eq!(with("90s").unwrap().as_secs(), 90);
        assert_eq!(with("30m").unwrap().as_secs(), 1800);
        for bad in ["0", "soon", "-5s"] {
            assert!(with(bad).is_err(), "{bad}");
        }
        // It only means something with --loader.
        assert!(loader_timeout(&["m", "--loader-timeout", "5s"]).is_err());
    }
}
