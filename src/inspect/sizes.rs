//! A name and a byte size, as inspect reports the largest tensor and file.

use serde::Serialize;

#[derive(Debug, Clone, Serialize)]
pub struct NamedSize {
    pub name: String,
    pub bytes: u64,
}
