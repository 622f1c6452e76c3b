//! The quality report of a quantized output: the error figures over every
//! quantized tensor together, and the tensors that lost the most, as
//! `convert` prints them and `validate --against` recomputes them.

use serde::{Deserialize, Serialize};

use super::recipe::QuantQuality;

/// How many of the worst tensors a report names.
pub const WORST: usize = 5;

/// One tensor's figures, as printed and written to JSON.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TensorQuality {
    pub tensor: String,
    pub max_abs_error: f64,
    /// `None` for a tensor of zeros.
    pub relative_rms: Option<f64>,
    /// `None` for a tensor of zeros, or one quantized exactly.
    pub snr_db: Option<f64>,
    /// Elements not measured (NaN or infinite; see
    /// [`QuantQuality::not_finite`]).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub not_finite: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl TensorQuality {
    pub fn of(tensor: &str, q: &QuantQuality) -> TensorQuality {
        TensorQuality {
            tensor: tensor.to_string(),
            max_abs_error: q.max_abs_error,
            relative_rms: q.relative_rms(),
            snr_db: q.snr_db(),
            not_finite: q.not_finite,
        }
    }
}

/// The figures of every quantized tensor of an output.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct QualityReport {
    /// Quantized tensors measured.
    pub tensors: usize,
    /// Over all of them together (element-weighted).
    pub total: QuantQuality,
    /// The [`WORST`] tensors by relative RMS error, worst first.
    pub worst: Vec<TensorQuality>,
}

// No figure is NaN: non-finite elements are not measured.
impl Eq for QualityReport {}
impl Eq for TensorQuality {}

impl QualityReport {
    /// Adds one tensor's figures.
    pub fn add(&mut self, tensor: &str, q: &QuantQuality) {
        self.tensors += 1;
        self.total += *q;
        let rms = q.relative_rms().unwrap_or(0.0);
        let at = self
            .worst
            .iter()
            .position(|w| w.relative_rms.unwrap_or(0.0) < rms)
            .unwrap_or(self.worst.len());
        if at < WORST {
            self.worst.insert(at, TensorQuality::of(tensor, q));
            self.worst.truncate(WORST);
        }
    }

    /// Relative RMS error over every quantized element.
    pub fn relative_rms(&self) -> Option<f64> {
        self.total.relative_rms()
    }

    /// Signal-to-noise ratio over every quantized element, in dB.
    pub fn snr_db(&self) -> Option<f64> {
        self.total.snr_db()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quality(signal: f64, noise: f64) -> QuantQuality {
        let mut q = QuantQuality::default();
        q.add(signal, signal - noise);
        q
    }

    #[test]
    fn keeps_the_five_worst_worst_first_and_sums_every_tensor() {
        let mut r = QualityReport::default();
        for (i, noise) in [0.1, 0.5, 0.2, 0.9, 0.05, 0.3, 0.7].iter().enumerate() {
            r.add(&format!("t{i}"), &quality(1.0, *noise));
        }
        let names: Vec<&str> = r.worst.iter().map(|w| w.tensor.as_str()).collect();
        assert_eq!(names, ["t3", "t6", "t1", "t5", "t2"]);
        assert_eq!(r.tensors, 7);
        assert_eq!(r.total.elements, 7);
        assert!((r.total.max_abs_error - 0.9).abs() < 1e-12);
        let expected = (0.01 + 0.25 + 0.04 + 0.81 + 0.0025 + 0.09 + 0.49) / 7.0;
        assert!((r.relative_rms().unwrap() - f64::sqrt(expected)).abs() < 1e-12);
    }

    #[test]
    fn a_tensor_of_zeros_has_no_ratio() {
        let mut r = QualityReport::default();
        r.add("zeros", &quality(0.0, 0.0));
        assert_eq!(r.worst[0].relative_rms, None);
        assert_eq!(r.worst[0].snr_db, None);
        assert_eq!(r.snr_db(), None);
    }
}
