//! The layout of a model folder: which folders hold a weight set of their
//! own, and which library loads each one (and so how it must be named).
//!
//! - sentence-transformers (`modules.json`): every listed module whose
//!   folder holds weights is a weight set. The `Transformer` module (usually
//!   the root, `"path": ""`) is loaded by transformers and may be sharded;
//!   every other module (`2_Dense`, ...) loads exactly `model.safetensors`
//!   (or `pytorch_model.bin`), so it is written as one file.
//! - diffusers pipelines (`model_index.json`): every component
//!   (`"unet": ["diffusers", "UNet2DConditionModel"]`) whose folder holds
//!   weights is a weight set, loaded by the library the entry names.
//! - anything else: the folder itself is the one weight set.
//!
//! Paths taken from these files must be relative paths of plain names, each
//! folder a real folder inside the model (never a symlink): a `"../x"` is
//! refused, a symlinked component folder is left out with a note. A name
//! Windows reserves (`CON`, `nul.x`, `aux.`: [`super::names::windows_reserved`])
//! is refused too, on every platform, so an output stays portable. This
//! module reads only the two small JSON files and folder listings; it opens
//! no weight header.

use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::Value;

use super::discover::{looks_like_checkpoint, resolve_hf_cache};
use super::read::read_regular_string;
use super::FormatError;
use crate::names::{is_plain_name, is_plain_relative, reserved_part, windows_reserved};

/// Largest `modules.json` or `model_index.json` read.
pub const MAX_LAYOUT_JSON: u64 = 1 << 20;

/// What kind of model folder it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LayoutKind {
    /// One weight set in the folder itself (transformers, a lone model).
    Model,
    SentenceTransformers,
    DiffusersPipeline,
}

impl LayoutKind {
    pub fn describe(self) -> &'static str {
        match self {
            LayoutKind::Model => "model folder",
            LayoutKind::SentenceTransformers => "sentence-transformers model (modules.json)",
            LayoutKind::DiffusersPipeline => "diffusers pipeline (model_index.json)",
        }
    }
}

/// The library that loads a weight set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Library {
    Transformers,
    Diffusers,
    SentenceTransformers,
    /// Named by model_index.json but neither of the above.
    Other,
}

impl Library {
    pub fn name(self) -> &'static str {
        match self {
            Library::Transformers => "transformers",
            Library::Diffusers => "diffusers",
            Library::SentenceTransformers => "sentence-transformers",
            Library::Other => "other",
        }
    }
}

/// One folder that is converted as a model of its own.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WeightSet {
    /// Its path under the model root with `/` separators; `""` is the root.
    pub rel: String,
    pub library: Library,
    /// The library loads exactly one weight file here: never shard it.
    pub one_file: bool,
}

impl WeightSet {
    /// `rel` for messages: `.` for the root.
    pub fn label(&self) -> &str {
        if self.rel.is_empty() {
            "."
        } else {
            &self.rel
        }
    }
}

/// The weight sets of a model folder, in conversion order (root first).
#[derive(Debug, Clone, Serialize)]
pub struct ModelLayout {
    /// The model folder (for an HF cache repo, its snapshot).
    pub root: PathBuf,
    pub kind: LayoutKind,
    pub sets: Vec<WeightSet>,
    /// Entries of modules.json or model_index.json left out, and why.
    pub notes: Vec<String>,
}

impl ModelLayout {
    /// The folder of a weight set.
    pub fn dir_of(&self, set: &WeightSet) -> PathBuf {
        join_rel(&self.root, &set.rel)
    }

    /// The absolute folders of every weight set but the root.
    pub fn component_dirs(&self) -> Vec<PathBuf> {
        self.sets
            .iter()
            .filter(|s| !s.rel.is_empty())
            .map(|s| self.dir_of(s))
            .collect()
    }
}

/// `root` joined with a `/`-separated relative path.
pub fn join_rel(root: &Path, rel: &str) -> PathBuf {
    rel.split('/')
        .filter(|p| !p.is_empty())
        .fold(root.to_path_buf(), |p, c| p.join(c))
}

/// Reads the layout of the folder (or HF cache repo) at `path`.
pub fn detect(path: &Path) -> Result<ModelLayout, FormatError> {
    let root = resolve_hf_cache(path)?;
    let mut layout = ModelLayout {
        root: root.clone(),
        kind: LayoutKind::Model,
        sets: Vec::new(),
        notes: Vec::new(),
    };
    let modules = root.join("modules.json");
    let index = root.join("model_index.json");
    if exists(&modules) {
        layout.kind = LayoutKind::SentenceTransformers;
        for (rel, kind) in sentence_modules(&modules)? {
            let transformer = kind.rsplit('.').next() == Some("Transformer");
            let library = if transformer {
                Library::Transformers
            } else {
                Library::SentenceTransformers
            };
            layout.add(&modules, rel, library, !transformer);
        }
    } else if exists(&index) {
        layout.kind = LayoutKind::DiffusersPipeline;
        for (rel, library) in pipeline_components(&index)? {
            layout.add(&index, rel, library, false);
        }
    }
    let root_listed = layout.sets.iter().any(|s| s.rel.is_empty());
    if !root_listed && looks_like_checkpoint(&root) {
        layout.sets.insert(
            0,
            WeightSet {
                rel: String::new(),
                library: Library::Transformers,
                one_file: false,
            },
        );
    }
    layout.sets.sort_by(|a, b| a.rel.cmp(&b.rel));
    layout.sets.dedup_by(|a, b| a.rel == b.rel);
    if layout.sets.is_empty() && layout.kind == LayoutKind::Model {
        // What a plain open says (a symlink loop, a FIFO named like a
        // weight file, ...), or that there are no weights.
        super::open(path)?;
        return Err(FormatError::NoCheckpoint {
            path: path.to_path_buf(),
        });
    }
    Ok(layout)
}

/// True when `dir` (a folder, not an HF cache repo) is one model made of
/// weight sets in subfolders that a walk over a folder of models must not
/// take apart: it has a modules.json or model_index.json naming at least
/// one weight set, or one that cannot be read (converting it then says
/// why).
pub fn is_layout_root(dir: &Path) -> bool {
    if !exists(&dir.join("modules.json")) && !exists(&dir.join("model_index.json")) {
        return false;
    }
    detect(dir).map_or(true, |l| !l.sets.is_empty())
}

impl ModelLayout {
    /// Adds the weight set at `rel` if its folder is a real folder inside
    /// the root that holds weights; notes why not otherwise.
    fn add(&mut self, listed_in: &Path, rel: String, library: Library, one_file: bool) {
        let file = listed_in
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if !rel.is_empty() {
            // Every folder on the way must be a real folder, not a link.
            let mut dir = self.root.clone();
            for part in rel.split('/') {
                dir.push(part);
                match std::fs::symlink_metadata(&dir) {
                    Ok(m) if m.file_type().is_dir() => {}
                    Ok(m) if m.file_type().is_symlink() => {
                        self.notes.push(format!(
                            "{file}: {rel:?} is (or runs through) a symlinked folder; not followed, not converted"
                        ));
                        return;
                    }
                    _ => return, // absent: nothing to convert (no weights)
                }
            }
        }
        if looks_like_checkpoint(&join_rel(&self.root, &rel)) {
            self.sets.push(WeightSet {
                rel,
                library,
                one_file,
            });
        }
    }
}

impl ModelLayout {
    /// True when the folder is more than one plain model: several weight
    /// sets, or a root that holds none of its own (a pipeline).
    pub fn is_composite(&self) -> bool {
        !(self.kind == LayoutKind::Model && self.sets.len() == 1 && self.sets[0].rel.is_empty())
    }

    /// Every weight set opened and joined into one checkpoint, as a library
    /// holds the model once it has loaded it component by component: the
    /// files of all sets, and their tensors named `REL/NAME` (the root's
    /// unprefixed). For `fit`, which judges what the whole load costs; the
    /// result is not for writing (its tensors live under several folders).
    pub fn open_combined(&self) -> Result<super::Checkpoint, FormatError> {
        let mut combined: Option<super::Checkpoint> = None;
        for set in &self.sets {
            let ck = super::open(&self.dir_of(set))?;
            let Some(all) = combined.as_mut() else {
                let mut first = ck;
                prefix_names(&mut first, &set.rel);
                first.dir = self.root.clone();
                combined = Some(first);
                continue;
            };
            let mut ck = ck;
            prefix_names(&mut ck, &set.rel);
            let offset = all.files.len();
            all.files.extend(ck.files);
            all.tensors.extend(ck.tensors.into_iter().map(|mut t| {
                t.file += offset;
                t
            }));
            all.findings.extend(ck.findings);
            for (k, v) in ck.metadata {
                all.metadata.entry(k).or_insert(v);
            }
            all.layout = super::Layout::Loose;
        }
        combined.ok_or_else(|| FormatError::NoCheckpoint {
            path: self.root.clone(),
        })
    }
}

/// The checkpoint a loader holds once it has loaded `path`: a plain model
/// (or a file) as it is; a pipeline or a sentence-transformers folder as
/// all its weight sets together ([`ModelLayout::open_combined`]), with its
/// layout. What `fit` and `batch --mode fit` judge.
pub fn open_as_loaded(
    path: &Path,
) -> Result<(super::Checkpoint, Option<ModelLayout>), FormatError> {
    if path.is_dir() {
        let layout = detect(path)?;
        if layout.is_composite() {
            return Ok((layout.open_combined()?, Some(layout)));
        }
    }
    Ok((super::open(path)?, None))
}

fn prefix_names(ck: &mut super::Checkpoint, rel: &str) {
    if rel.is_empty() {
        return;
    }
    for t in &mut ck.tensors {
        t.name = format!("{rel}/{}", t.name);
    }
}

fn exists(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok()
}

fn read_json(path: &Path) -> Result<Value, FormatError> {
    let text = read_regular_string(path, MAX_LAYOUT_JSON)?;
    serde_json::from_str(&text).map_err(|e| FormatError::BadLayout {
        path: path.to_path_buf(),
        reason: format!("not valid JSON: {e}"),
    })
}

fn bad(path: &Path, reason: String) -> FormatError {
    FormatError::BadLayout {
        path: path.to_path_buf(),
        reason,
    }
}

/// `(path, type)` of every module of a sentence-transformers modules.json.
fn sentence_modules(path: &Path) -> Result<Vec<(String, String)>, FormatError> {
    let Value::Array(modules) = read_json(path)? else {
        return Err(bad(path, "not a JSON list of modules".into()));
    };
    let mut out = Vec::with_capacity(modules.len());
    for m in &modules {
        let rel = m
            .get("path")
            .and_then(Value::as_str)
            .ok_or_else(|| bad(path, format!("module {m} has no string \"path\"")))?;
        let rel = rel.trim_end_matches('/');
        if !rel.is_empty() && !is_plain_relative(rel) {
            return Err(bad(
                path,
                format!("module path {rel:?} is not a relative path of plain folder names inside the model; refusing it"),
            ));
        }
        if let Some((part, reason)) = reserved_part(rel) {
            return Err(bad(
                path,
                format!("module path {rel:?}: {part:?} cannot be a folder of the output: {reason}; the output must be portable to Windows"),
            ));
        }
        let kind = m.get("type").and_then(Value::as_str).unwrap_or_default();
        out.push((rel.to_string(), kind.to_string()));
    }
    Ok(out)
}

/// `(folder, library)` of every component a model_index.json names.
fn pipeline_components(path: &Path) -> Result<Vec<(String, Library)>, FormatError> {
    let Value::Object(entries) = read_json(path)? else {
        return Err(bad(path, "not a JSON object".into()));
    };
    let mut out = Vec::new();
    for (name, value) in &entries {
        // `"_class_name": "..."` and other settings are not components;
        // a component is `[library, class]` (`[null, null]` when absent).
        let Some(Value::String(library)) = value.as_array().and_then(|a| a.first()) else {
            continue;
        };
        if name.starts_with('_') {
            continue;
        }
        if !is_plain_name(name) {
            return Err(bad(
                path,
                format!("component {name:?} is not a plain folder name inside the pipeline; refusing it"),
            ));
        }
        if let Some(reason) = windows_reserved(name) {
            return Err(bad(
                path,
                format!("component {name:?} cannot be a folder of the output: {reason}; the output must be portable to Windows"),
            ));
        }
        let library = match library.as_str() {
            "diffusers" => Library::Diffusers,
            "transformers" => Library::Transformers,
            _ => Library::Other,
        };
        out.push((name.clone(), library));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_device_names_in_layout_files_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(
            tmp.path().join("modules.json"),
            r#"[{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                {"idx": 1, "name": "1", "path": "1_Pooling/AUX", "type": "sentence_transformers.models.Pooling"}]"#,
        )
        .unwrap();
        let e = detect(tmp.path()).unwrap_err().to_string();
        assert!(
            e.contains("modules.json")
                && e.contains("\"AUX\"")
                && e.contains("portable to Windows"),
            "{e}"
        );
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(
            tmp.path().join("model_index.json"),
            r#"{"_class_name": "P", "unet": ["diffusers", "U"], "Con.1": ["diffusers", "V"]}"#,
        )
        .unwrap();
        let e = detect(tmp.path()).unwrap_err().to_string();
        assert!(
            e.contains("model_index.json") && e.contains("\"Con.1\"") && e.contains("device"),
            "{e}"
        );
    }

    #[test]
    fn pipeline_and_modules_are_read() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        std::fs::write(
            root.join("model_index.json"),
            r#"{"_class_name": "P", "unet": ["diffusers", "U"], "text_encoder": ["transformers", "C"],
                "scheduler": ["diffusers", "S"], "safety_checker": [null, null]}"#,
        )
        .unwrap();
        for c in ["unet", "text_encoder", "scheduler"] {
            std::fs::create_dir(root.join(c)).unwrap();
        }
        std::fs::write(root.join("unet/diffusion_pytorch_model.safetensors"), b"").unwrap();
        std::fs::write(root.join("text_encoder/model.safetensors"), b"").unwrap();
        std::fs::write(root.join("scheduler/scheduler_config.json"), b"{}").unwrap();
        let l = detect(root).unwrap();
        assert_eq!(l.kind, LayoutKind::DiffusersPipeline);
        let sets: Vec<_> = l.sets.iter().map(|s| (s.rel.as_str(), s.library)).collect();
        assert_eq!(
            sets,
            [
                ("text_encoder", Library::Transformers),
                ("unet", Library::Diffusers)
            ]
        );
    }

    #[test]
    fn a_module_path_out_of_the_model_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(
            tmp.path().join("modules.json"),
            r#"[{"idx": 0, "name": "0", "path": "../x", "type": "sentence_transformers.models.Dense"}]"#,
        )
        .unwrap();
        let e = detect(tmp.path()).unwrap_err().to_string();
        assert!(e.contains("modules.json") && e.contains("\"../x\""), "{e}");
    }
}
