//! What `batch` does to each model ([`Mode`]).

use serde::Serialize;

/// What each model's job does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Convert,
    Fit,
    Validate,
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Mode::Convert => "convert",
            Mode::Fit => "fit",
            Mode::Validate => "validate",
        })
    }
}
