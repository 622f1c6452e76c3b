//! Validating a folder made of several weight sets (a pipeline or a
//! sentence-transformers model, as `convert` writes it): each set on its
//! own, as its library loads it, against the same set of the source.

use std::path::Path;

use super::budget::validate_with_budget;
use super::error::ValidateError;
use super::options::ValidateOptions;
use super::report::ValidateReport;
use crate::format::discover::resolve_hf_cache;
use crate::format::layout::{self, ModelLayout};

/// One weight set's report.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SetReport {
    /// Its folder under the model root (`.` for the root).
    pub component: String,
    pub report: ValidateReport,
}

/// Validates every weight set of the folder at `path` when it is composite
/// ([`ModelLayout::is_composite`]), each compared with the same folder of
/// `options.against` when given (inside an HF cache repo, its snapshot's).
/// `None` for a plain model or a file, which [`validate_with_budget`]
/// validates as it is.
pub fn validate_sets(
    path: &Path,
    options: &ValidateOptions,
) -> Result<Option<(ModelLayout, Vec<SetReport>)>, ValidateError> {
    if !path.is_dir() {
        return Ok(None);
    }
    let layout = layout::detect(path)?;
    if !layout.is_composite() {
        return Ok(None);
    }
    let against = match &options.against {
        Some(a) if a.is_dir() => Some(resolve_hf_cache(a)?),
        other => other.clone(),
    };
    let mut reports = Vec::with_capacity(layout.sets.len());
    for set in &layout.sets {
        let mut o = options.clone();
        o.against = against.as_ref().map(|a| layout::join_rel(a, &set.rel));
        let report = validate_with_budget(&layout.dir_of(set), &o)?;
        reports.push(SetReport {
            component: set.label().to_string(),
            report,
        });
    }
    Ok(Some((layout, reports)))
}
