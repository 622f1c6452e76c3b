//! The quality report of a quantized output, as convert prints it after
//! writing and validate `--against` after recomputing it.

use std::fmt::Write;

use reshard::cast::quantize::{QualityReport, TensorQuality};
use reshard::names::escape;

/// `  error ...` lines: the figures over every quantized weight, then its
/// worst tensors.
pub fn render_quality(q: &QualityReport) -> String {
    let mut o = String::new();
    if q.tensors == 0 {
        return o;
    }
    let not_finite = match q.total.not_finite {
        0 => String::new(),
        n => format!(", {n} not finite"),
    };
    let _ = writeln!(
        o,
        "  error over {} quantized weight{} ({} values{not_finite}): {}",
        q.tensors,
        if q.tensors == 1 { "" } else { "s" },
        q.total.elements,
        // The count is in the parentheses already; it only replaces
        // "all zeros" when nothing was measured.
        figures(
            q.relative_rms(),
            q.snr_db(),
            q.total.max_abs_error,
            if q.relative_rms().is_none() {
                q.total.not_finite
            } else {
                0
            }
        )
    );
    for w in &q.worst {
        let TensorQuality {
            tensor,
            max_abs_error,
            relative_rms,
            snr_db,
            not_finite,
        } = w;
        let _ = writeln!(
            o,
            "    {}: {}",
            escape(tensor),
            figures(*relative_rms, *snr_db, *max_abs_error, *not_finite)
        );
    }
    o
}

/// One line's figures; `not_finite` values (NaN or infinite, never
/// measured) are counted, so a tensor of them is not called zeros.
fn figures(
    relative_rms: Option<f64>,
    snr_db: Option<f64>,
    max_abs: f64,
    not_finite: u64,
) -> String {
    let rms = match (relative_rms, not_finite) {
        (Some(r), 0) => format!("{:.3}%", r * 100.0),
        (Some(r), n) => format!("{:.3}% ({n} not finite)", r * 100.0),
        (None, 0) => "n/a (all zeros)".to_string(),
        (None, n) => format!("n/a ({n} not finite)"),
    };
    let snr = match (snr_db, relative_rms) {
        (Some(s), _) => format!("{s:.1} dB"),
        (None, Some(_)) => "exact".to_string(),
        (None, None) => "n/a".to_string(),
    };
    format!("relative RMS {rms}, SNR {snr}, max abs error {max_abs:.4e}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use reshard::cast::quantize::QuantQuality;

    #[test]
    fn names_the_worst_tensors_and_says_n_a_for_zeros() {
        let mut r = QualityReport::default();
        let mut q = QuantQuality::default();
        q.add(1.0, 0.99);
        r.add("a.weight", &q);
        r.add("zeros.weight", &QuantQuality::default());
        let text = render_quality(&r);
        assert!(
            text.contains("over 2 quantized weights (1 values)"),
            "{text}"
        );
        assert!(
            text.contains("a.weight: relative RMS 1.000%, SNR 40.0 dB"),
            "{text}"
        );
        assert!(
            text.contains("zeros.weight: relative RMS n/a (all zeros)"),
            "{text}"
        );
        assert!(render_quality(&QualityReport::default()).is_empty());
    }

    #[test]
    fn nan_and_infinite_values_are_counted_not_called_zeros() {
        let mut r = QualityReport::default();
        let mut q = QuantQuality::default();
        q.add(f64::NAN, f64::NAN);
        q.add(f64::INFINITY, 448.0);
        r.add("nan.weight", &q);
        let text = render_quality(&r);
        assert!(text.contains("(0 values, 2 not finite)"), "{text}");
        assert!(
            text.contains("nan.weight: relative RMS n/a (2 not finite)"),
            "{text}"
        );
        assert!(!text.contains("all zeros"), "{text}");
    }
}
