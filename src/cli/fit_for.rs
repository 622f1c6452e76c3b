//! `reshard fit --for PROGRAM`: the forms that program loads, judged on the
//! machine and ranked best first, and the command that writes the best.
//! Renders a [`MakeFit`]; the planning lives in `reshard::fit::make`.

use std::fmt::Write as _;

use reshard::fit::make::{Candidate, MakeFit, Placement};
use reshard::units::human;

/// The names `--for` accepts (the programs of the crate's table).
fn program_names() -> Vec<&'static str> {
    reshard::fit::program::programs()
        .iter()
        .map(|p| p.name.as_str())
        .collect()
}

/// Parses `--for`.
pub fn parse_program(s: &str) -> Result<String, String> {
    match reshard::fit::program::program(s) {
        Some(p) => Ok(p.name.clone()),
        None => Err(format!(
            "unknown program; choose one of: {}",
            program_names().join(", ")
        )),
    }
}

pub fn render(path: &str, r: &MakeFit) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "{path} for {}:", r.program);
    match r.vram_budget {
        Some(v) => {
            let _ = writeln!(
                o,
                "  VRAM for weights: {} of {} ({} rule, activation reserve {})",
                human(v),
                human(r.budget.vram_bytes.unwrap_or(0)),
                reshard::fit::program::program(&r.program).map_or("plain".into(), |p| format!(
                    "{:?}",
                    p.vram
                )
                .to_lowercase()),
                human(r.reserve)
            );
        }
        None => {
            let _ = writeln!(o, "  no GPU given (--vram): weights stay in host memory");
        }
    }
    let _ = writeln!(o, "  host budget: {}", human(r.budget.host_bytes));
    let _ = writeln!(
        o,
        "  {:<19} {:>6} {:>11} {:>11} {:>11}  placement",
        "form", "bits", "file", "VRAM", "host"
    );
    for c in &r.candidates {
        let _ = writeln!(
            o,
            "  {} {:<17} {:>6.2} {:>11} {:>11} {:>11}  {}",
            if c.fits { "+" } else { "-" },
            c.form.name(),
            c.bits_per_weight,
            human(c.file_bytes),
            human(c.vram_weights),
            human(c.host.host_needed),
            placement(c)
        );
    }
    for f in &r.refused {
        let _ = writeln!(o, "  (not offered: {}: {})", f.form.name(), f.reason);
    }
    match r.best() {
        Some(best) => {
            let _ = writeln!(o, "best: {} ({})", best.form.name(), placement(best));
            match &best.command {
                Some(c) => {
                    let _ = writeln!(o, "  {c}");
                }
                None => {
                    let _ = writeln!(o, "  nothing to convert: load it as it is");
                }
            }
        }
        None => {
            let _ = writeln!(o, "nothing {} reads fits this machine", r.program);
            if let Some(m) = &r.smallest_machine {
                let _ = write!(
                    o,
                    "  the smallest form, {}, needs a host budget of {}",
                    m.form.name(),
                    human(m.host)
                );
                if let Some(v) = m.vram {
                    let _ = write!(o, " and {} of dedicated VRAM", human(v));
                }
                o.push('\n');
            }
        }
    }
    o
}

fn placement(c: &Candidate) -> String {
    let host_short = match c.host.host_shortfall {
        0 => String::new(),
        n => format!("; host short by {}", human(n)),
    };
    let p = match &c.placement {
        Placement::Gpu => "all on the GPU".to_string(),
        Placement::Host => "host only".to_string(),
        Placement::Offload {
            blocks_on_gpu,
            blocks,
            offloaded,
        } => format!(
            "first {blocks_on_gpu} of {blocks} blocks on the GPU, {} offloaded",
            human(*offloaded)
        ),
        Placement::TooBigForVram { short } => {
            format!("VRAM short by {} (no offload)", human(*short))
        }
    };
    format!("{p}{host_short}")
}
