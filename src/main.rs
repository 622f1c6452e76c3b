//! The `reshard` binary: parse, run, print the error chain, map the exit status.

mod cli;

fn main() {
    let code = cli::run();
    std::process::exit(code.code());
}
