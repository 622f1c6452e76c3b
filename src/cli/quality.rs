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
    let _ = writeln!(
        o,
        "  error over {} quantized weight{} ({} values): {}",
        q.tensors,
        if q.tensors == 1 { "" } else { "s" },
        q.total.elements,
        figures(q.relative_rms(), q.snr_db(), q.total.max_abs_error)
    );
    for w in &q.worst {
        let TensorQuality {
            tensor,
            max_abs_error,
            relative_rms,
            snr_db,
        } = w;
        let _ = writeln!(
            o,
            "    {}: {}",
            escape(tensor),
            figures(*relative_rms, *snr_db, *max_abs_error)
        );
    }
    o
}

fn figures(relative_rms: Option<f64>, snr_db: Option<f64>, max_abs: f64) -> String {
    let rms = relative_rms.map_or("n/a (all zeros)".to_string(), |r| {
        format!("{:.3}%", r * 100.0)
    });
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
}
