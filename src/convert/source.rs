//! What a conversion reads ([`ConvertSource`]): a folder read as its layout
//! (a plain model, a sentence-transformers model, a diffusers pipeline),
//! or one file. `convert` and `batch` both open their SRC here and run
//! [`ConvertSource::convert`], so a model is written the same way whichever
//! command converts it.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

use super::error::ConvertError;
use super::layout::{convert_layout, plan_layout};
use super::options::{BeforeCommit, ConvertOptions, ConvertSummary};
use super::run::{convert_gated, plan_for};
use crate::exec::{Reporter, WindowPool};
use crate::format::layout::{self, ModelLayout};
use crate::format::{self, Checkpoint, Finding, FormatError};
use crate::plan::Plan;

/// A source opened for conversion.
#[derive(Debug)]
pub struct ConvertSource {
    /// SRC as given (a folder, an HF cache repo or a file).
    pub path: PathBuf,
    /// A folder's weight sets and the rest of its tree; `None` for a file.
    pub layout: Option<ModelLayout>,
    /// The file, or the folder's root weight set when it has one (a
    /// pipeline's root holds none).
    pub root: Option<Checkpoint>,
}

impl ConvertSource {
    /// Opens `path`: a folder by its layout, a file as one checkpoint.
    pub fn open(path: &Path) -> Result<ConvertSource, FormatError> {
        let layout = if path.is_dir() {
            Some(layout::detect(path)?)
        } else {
            None
        };
        let root = match &layout {
            Some(l) if !l.sets.iter().any(|s| s.rel.is_empty()) => None,
            _ => Some(format::open(path)?),
        };
        Ok(ConvertSource {
            path: path.to_path_buf(),
            layout,
            root,
        })
    }

    /// What inspect would report about the root weight set (or the file).
    pub fn findings(&self) -> &[Finding] {
        self.root.as_ref().map_or(&[], |ck| &ck.findings)
    }

    /// Entries of modules.json or model_index.json left out, and why.
    pub fn notes(&self) -> &[String] {
        self.layout.as_ref().map_or(&[], |l| &l.notes)
    }

    /// Each weight set's folder under SRC and DST, `/` separators (`""`
    /// for the root, and for a file).
    pub fn weight_sets(&self) -> Vec<String> {
        match &self.layout {
            Some(l) => l.sets.iter().map(|s| s.rel.clone()).collect(),
            None => vec![String::new()],
        }
    }

    /// Where the weight set at `rel` is read from (inside an HF cache
    /// repo, its snapshot's folder).
    pub fn set_dir(&self, rel: &str) -> PathBuf {
        match &self.layout {
            Some(l) => layout::join_rel(&l.root, rel),
            None => self.path.clone(),
        }
    }

    /// The plans [`ConvertSource::convert`] executes, weight set by weight
    /// set (what `--dry-run` prints).
    pub fn plans(&self, options: &ConvertOptions) -> Result<Vec<(String, Plan)>, ConvertError> {
        match (&self.layout, &self.root) {
            (Some(layout), _) => plan_layout(layout, options),
            (None, Some(ck)) => Ok(vec![(String::new(), plan_for(ck, options)?)]),
            (None, None) => Ok(Vec::new()),
        }
    }

    /// Converts the source into `dst`: every weight set of a folder under
    /// its library's names, with the rest of its tree mirrored; a file as
    /// one checkpoint, nothing beside it copied. `before_commit` is asked
    /// before each folder is committed (see [`convert_gated`]).
    pub fn convert(
        &self,
        dst: &Path,
        options: &ConvertOptions,
        pool: &WindowPool,
        reporter: &dyn Reporter,
        cancel: &AtomicBool,
        before_commit: BeforeCommit,
    ) -> Result<ConvertSummary, ConvertError> {
        let mut options = options.clone();
        options.copy_other_files = self.layout.is_some();
        match (&self.layout, &self.root) {
            (Some(l), _) => convert_layout(l, dst, &options, pool, reporter, cancel, before_commit),
            (None, Some(ck)) => {
                convert_gated(ck, dst, &options, pool, reporter, cancel, before_commit)
            }
            // `open` gives a file source its checkpoint; never met.
            (None, None) => Err(FormatError::NoCheckpoint {
                path: self.path.clone(),
            }
            .into()),
        }
    }
}
