//! The command line: flag parsing (clap) and one file per subcommand. This is
//! the only layer that prints.

mod batch;
mod batch_report;
mod cancel;
mod convert;
pub(crate) mod exit;
mod fit;
mod fit_for;
mod inspect;
mod machine;
mod printer;
mod progress;
mod quality;
mod validate;

use clap::{CommandFactory, Parser, Subcommand};

pub use self::exit::ExitStatus;

/// reshard: rewrite model checkpoints into small, layer-ordered safetensors
/// shards that load within a memory budget, and prove that they do.
#[derive(Debug, Parser)]
#[command(name = "reshard", version, about, max_term_width = 100)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Report what a checkpoint holds and what is wrong with it.
    Inspect(inspect::Args),
    /// Rewrite a checkpoint into small, layer-ordered shards.
    Convert(convert::Args),
    /// Predict whether a checkpoint loads on a machine, per loader, and what conversion makes it.
    Fit(fit::Args),
    /// Convert every model under a folder, N at a time, within one window.
    // Boxed: its arguments (convert's, plus the batch options) are the largest.
    Batch(Box<batch::Args>),
    /// Work with `batch --report` files: merge the reports of a run's parts.
    #[command(name = "batch-report")]
    BatchReport(batch_report::Args),
    /// Check a checkpoint's bytes and load it within a memory budget.
    Validate(validate::Args),
    /// Print a shell completion script (`reshard completions bash >
    /// ~/.local/share/bash-completion/completions/reshard`).
    Completions(CompletionsArgs),
    /// The budget child of `validate` (internal).
    #[command(name = "__validate-child", hide = true)]
    ValidateChild,
}

/// Parses the command line, runs the subcommand and reports errors.
pub fn run() -> ExitStatus {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let status = if e.use_stderr() {
                ExitStatus::Error
            } else {
                ExitStatus::Ok
            };
            let _ = e.print();
            return status;
        }
    };
    let json = cli.command.json();
    let result = match cli.command {
        Command::Inspect(args) => inspect::run(args),
        Command::Convert(args) => convert::run(args),
        Command::Fit(args) => fit::run(args),
        Command::Batch(args) => batch::run(*args),
        Command::BatchReport(args) => batch_report::run(args),
        Command::Validate(args) => validate::run(args),
        Command::ValidateChild => Ok(validate::run_child()),
        Command::Completions(args) => completions(args),
    };
    match result {
        Ok(status) => status,
        Err(err) if json => exit::report_json(&err),
        Err(err) => exit::report(&err),
    }
}

#[derive(Debug, clap::Args)]
struct CompletionsArgs {
    /// The shell to complete in.
    #[arg(value_enum)]
    shell: clap_complete::Shell,
}

/// The script is built in memory first: clap_complete panics on a write
/// error, and `reshard completions bash | head` must not.
fn completions(args: CompletionsArgs) -> anyhow::Result<ExitStatus> {
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut Cli::command(), "reshard", &mut script);
    printer::text(&String::from_utf8_lossy(&script))?;
    Ok(ExitStatus::Ok)
}

impl Command {
    /// Whether the command was asked for `--json`: its errors are then JSON
    /// on stdout too.
    fn json(&self) -> bool {
        match self {
            Command::Inspect(a) => a.print.json,
            Command::Convert(a) => a.print.json,
            Command::Fit(a) => a.print.json,
            Command::Batch(a) => a.print.json,
            Command::BatchReport(a) => a.json(),
            Command::Validate(a) => a.print.json,
            Command::ValidateChild | Command::Completions(_) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// clap's own checks of the whole command line (a short flag used
    /// twice, a `requires` naming no argument), which otherwise fire only
    /// when that subcommand is parsed.
    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn json_is_known_before_the_command_runs() {
        let cli = Cli::try_parse_from(["reshard", "inspect", "x", "--json"]).unwrap();
        assert!(cli.command.json());
        let cli = Cli::try_parse_from(["reshard", "fit", "x", "-q"]).unwrap();
        assert!(!cli.command.json());
    }
}
