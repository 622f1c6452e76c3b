//! What reshard may touch: the one place that decides whether an output
//! path is allowed, before anything is written.
//!
//! [`OutputScope`] resolves once, to real paths (every symlink followed,
//! `canonicalize`), the source's files, the model's root folder, DST and,
//! for `batch`, OUT. It then refuses:
//!
//! - a DST that is a source file, or lies inside one;
//! - for a folder SRC, a DST equal to or inside the model's root (the folder;
//!   for a Hugging Face cache snapshot, the whole `models--ORG--NAME` repo);
//!   a single-file SRC may write beside the file, never onto it;
//! - a DST that holds any source file's real file (a folder of links whose
//!   targets live in DST): writing or cleaning DST could destroy them;
//! - for `batch`, a DST that does not resolve inside OUT (OUT itself is the
//!   output only when ROOT itself is the one model).
//!
//! Everything reshard writes or deletes is a name directly inside DST (see
//! [`super::owned`]): temps are created with `create_new`, finals appear by
//! rename and removal never follows a link, so with the checks above no
//! write or delete reaches a source file. [`check_report`] applies the same
//! rules to `batch --report FILE` and `batch-report merge -o FILE` (which
//! may not land on one of its input reports either).
//!
//! Paths are compared in their canonical form only (on Windows that is the
//! `\\?\C:\...` form for both sides); messages show the path the user gave.

use std::io;
use std::path::{Component, Path, PathBuf};

use crate::format::{Checkpoint, Layout};

#[derive(Debug, thiserror::Error)]
pub enum ScopeError {
    #[error("cannot resolve {}", .path.display())]
    Resolve {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{}: `..` after a folder that does not exist; give the output folder without it", .path.display())]
    Unresolvable { path: PathBuf },
    #[error("{}: output must not be the source folder or inside it", .dst.display())]
    DstInsideSource { dst: PathBuf },
    #[error("{}: output is the source file {} or inside it", .dst.display(), .file.display())]
    DstOnSourceFile { dst: PathBuf, file: PathBuf },
    #[error("{}: holds the source file {} (its real path is {}); the output must not be where the source's files live", .dst.display(), .file.display(), .real.display())]
    SourceInsideDst {
        dst: PathBuf,
        file: PathBuf,
        real: PathBuf,
    },
    #[error("{}: resolves to {}, which is not inside the output folder {}", .dst.display(), .real.display(), .out.display())]
    OutsideOut {
        dst: PathBuf,
        real: PathBuf,
        out: PathBuf,
    },
    #[error("{}: is (or resolves to) the source file {}; refusing to write the report there", .report.display(), .file.display())]
    ReportOnSource { report: PathBuf, file: PathBuf },
    #[error("{}: is inside the source model folder {}; refusing to write the report there", .report.display(), .root.display())]
    ReportInsideSource { report: PathBuf, root: PathBuf },
    #[error("{}: is (or resolves to) the report {} being read; refusing to write over it", .report.display(), .input.display())]
    ReportOnInput { report: PathBuf, input: PathBuf },
    #[error("{}: exists and is not a report reshard wrote (or is a symlink); refusing to replace it", .report.display())]
    ReportNotOurs { report: PathBuf },
}

/// The resolved paths of one conversion, and the rules they passed.
#[derive(Debug, Clone)]
pub struct OutputScope {
    /// DST as the user gave it.
    dst: PathBuf,
    /// DST's real path (its existing part canonicalized, the rest appended).
    dst_real: PathBuf,
    /// The real model root: other files are copied only from inside it.
    root: PathBuf,
    /// Real paths of every source file (weights and index).
    sources: Vec<PathBuf>,
}

/// What [`OutputScope::resolve`] needs to know beyond the checkpoint.
#[derive(Debug, Clone, Copy, Default)]
pub struct ScopeRules<'a> {
    /// SRC was one file: DST may sit in the file's folder.
    pub single_file: bool,
    /// `batch`: DST must resolve inside this folder (or be it).
    pub within: Option<&'a Path>,
}

impl OutputScope {
    /// Resolves the checkpoint's files and `dst` and checks every rule.
    /// Writes nothing (DST may not exist yet).
    pub fn resolve(
        ck: &Checkpoint,
        dst: &Path,
        rules: ScopeRules<'_>,
    ) -> Result<OutputScope, ScopeError> {
        let dir = canonical(&ck.dir)?;
        let mut sources = Vec::with_capacity(ck.files.len() + 1);
        let mut given: Vec<&Path> = ck.files.iter().map(|f| f.path.as_path()).collect();
        if let Layout::Indexed { index } = &ck.layout {
            given.push(index);
        }
        for path in &given {
            sources.push(canonical(path)?);
        }
        let root = if rules.single_file {
            sources.first().cloned().unwrap_or_else(|| dir.clone())
        } else {
            model_root(&dir)
        };
        let scope = OutputScope {
            dst: dst.to_path_buf(),
            dst_real: resolve(dst)?,
            root,
            sources,
        };
        scope.check(&given, rules)?;
        Ok(scope)
    }

    /// Resolves DST again once it exists and checks the rules again, so a
    /// folder swapped for a symlink between the first look and its creation
    /// is caught before anything is written into it.
    pub fn confirm(&mut self, ck: &Checkpoint, rules: ScopeRules<'_>) -> Result<(), ScopeError> {
        self.dst_real = canonical(&self.dst)?;
        let mut given: Vec<&Path> = ck.files.iter().map(|f| f.path.as_path()).collect();
        if let Layout::Indexed { index } = &ck.layout {
            given.push(index);
        }
        self.check(&given, rules)
    }

    fn check(&self, given: &[&Path], rules: ScopeRules<'_>) -> Result<(), ScopeError> {
        let dst = || self.dst.clone();
        for (real, file) in self.sources.iter().zip(given) {
            if self.dst_real.starts_with(real) {
                return Err(ScopeError::DstOnSourceFile {
                    dst: dst(),
                    file: file.to_path_buf(),
                });
            }
        }
        if !rules.single_file && self.dst_real.starts_with(&self.root) {
            return Err(ScopeError::DstInsideSource { dst: dst() });
        }
        for (real, file) in self.sources.iter().zip(given) {
            if real.starts_with(&self.dst_real) {
                return Err(ScopeError::SourceInsideDst {
                    dst: dst(),
                    file: file.to_path_buf(),
                    real: real.clone(),
                });
            }
        }
        if let Some(out) = rules.within {
            let out_real = resolve(out)?;
            if !self.dst_real.starts_with(&out_real) {
                return Err(ScopeError::OutsideOut {
                    dst: dst(),
                    real: self.dst_real.clone(),
                    out: out.to_path_buf(),
                });
            }
        }
        Ok(())
    }

    /// The model's real root folder (for a single-file SRC, the file).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// True if `path` (an entry of the source folder) really lies inside the
    /// model's root once every symlink is followed: the rule for copying
    /// other files (HF snapshot links into `../../blobs` pass; a link to
    /// `/proc/self/environ` or to another user's folder does not).
    pub fn inside_root(&self, path: &Path) -> bool {
        canonical(path).is_ok_and(|real| real.starts_with(&self.root) && real != self.root)
    }
}

/// The model root of a real checkpoint folder: for a Hugging Face cache
/// snapshot (`models--ORG--NAME/snapshots/REV`, beside `blobs/`), the repo
/// folder its links point into; otherwise the folder itself.
pub fn model_root(dir: &Path) -> PathBuf {
    // The snapshot itself, or a component folder inside it (a pipeline's
    // `snapshots/REV/unet`, whose links point into the same `blobs/`).
    for snapshot in dir.ancestors().take(3) {
        let repo = snapshot
            .parent()
            .filter(|p| p.file_name().is_some_and(|n| n == "snapshots"))
            .and_then(Path::parent);
        if let Some(repo) = repo.filter(|r| r.join("blobs").is_dir()) {
            return repo.to_path_buf();
        }
    }
    dir.to_path_buf()
}

/// `path` with every symlink followed; it must exist.
pub fn canonical(path: &Path) -> Result<PathBuf, ScopeError> {
    crate::platform::canonicalize(path).map_err(|source| ScopeError::Resolve {
        path: path.to_path_buf(),
        source,
    })
}

/// The real path `path` has or would have once created: its longest
/// existing ancestor canonicalized, the rest appended (`.` dropped; `..`
/// below a missing folder refused rather than guessed).
pub fn resolve(path: &Path) -> Result<PathBuf, ScopeError> {
    let absolute = std::path::absolute(path).map_err(|source| ScopeError::Resolve {
        path: path.to_path_buf(),
        source,
    })?;
    for existing in absolute.ancestors() {
        let Ok(real) = crate::platform::canonicalize(existing) else {
            continue;
        };
        let tail = absolute.strip_prefix(existing).unwrap_or(Path::new(""));
        let mut out = real;
        for c in tail.components() {
            match c {
                Component::Normal(n) => out.push(n),
                Component::CurDir => {}
                _ => {
                    return Err(ScopeError::Unresolvable {
                        path: path.to_path_buf(),
                    })
                }
            }
        }
        return Ok(out);
    }
    Err(ScopeError::Resolve {
        path: path.to_path_buf(),
        source: io::Error::from(io::ErrorKind::NotFound),
    })
}

/// The source folders and files a `batch --report` must stay away from.
#[derive(Debug, Clone, Default)]
pub struct SourceSet {
    /// Real model roots.
    roots: Vec<PathBuf>,
    /// Real targets of the entries directly in each model folder (a folder
    /// of links keeps its weights elsewhere).
    files: Vec<PathBuf>,
    /// Reports being read (`batch-report merge`'s inputs): (real, given).
    inputs: Vec<(PathBuf, PathBuf)>,
}

impl SourceSet {
    /// Adds one model: its folder (an HF cache repo folder counts whole)
    /// and the real targets of the files in it. Unreadable parts are left
    /// out: the model's own job reports them.
    pub fn add_model(&mut self, source: &Path) {
        let Ok(real) = crate::platform::canonicalize(source) else {
            return;
        };
        let dir = crate::format::discover::resolve_hf_cache(source)
            .ok()
            .and_then(|d| crate::platform::canonicalize(&d).ok())
            .unwrap_or_else(|| real.clone());
        if let Ok(entries) = std::fs::read_dir(&dir) {
            self.files.extend(
                entries
                    .filter_map(Result::ok)
                    .filter_map(|e| crate::platform::canonicalize(&e.path()).ok()),
            );
        }
        self.roots.push(model_root(&dir));
        self.roots.push(real);
    }
}

impl SourceSet {
    /// Adds a report that is read to make the one written (`batch-report
    /// merge`'s inputs): the output may not land on it.
    pub fn add_input(&mut self, report: &Path) {
        if let Ok(real) = crate::platform::canonicalize(report) {
            self.inputs.push((real, report.to_path_buf()));
        }
    }
}

/// The rule for a report file reshard writes (`batch --report FILE`,
/// `batch-report merge -o FILE`):
/// it may not resolve onto any source file or into any model folder, and an
/// existing file there is replaced only if it is a regular file (not a
/// symlink) that holds a reshard report (a JSON object with
/// `reshard_version` and `models`). Anything else is refused.
pub fn check_report(report: &Path, sources: &SourceSet) -> Result<(), ScopeError> {
    let real = resolve(report)?;
    if let Some((_, input)) = sources.inputs.iter().find(|(r, _)| *r == real) {
        return Err(ScopeError::ReportOnInput {
            report: report.to_path_buf(),
            input: input.clone(),
        });
    }
    if let Some(file) = sources.files.iter().find(|f| **f == real) {
        return Err(ScopeError::ReportOnSource {
            report: report.to_path_buf(),
            file: file.clone(),
        });
    }
    if let Some(root) = sources.roots.iter().find(|r| real.starts_with(r)) {
        return Err(ScopeError::ReportInsideSource {
            report: report.to_path_buf(),
            root: root.clone(),
        });
    }
    match std::fs::symlink_metadata(report) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(ScopeError::Resolve {
            path: report.to_path_buf(),
            source,
        }),
        Ok(meta) if meta.file_type().is_file() && is_reshard_report(report) => Ok(()),
        Ok(_) => Err(ScopeError::ReportNotOurs {
            report: report.to_path_buf(),
        }),
    }
}

/// Reports are small; a file larger than this is not one of ours.
const MAX_REPORT_LEN: u64 = 256 << 20;

/// True if `path` holds a reshard report: a JSON object with a string
/// `reshard_version` and an array `models`. Checked without building the
/// document: the models are skipped element by element (serde's
/// `IgnoredAny`), so a large report costs its bytes, not a tree of values.
fn is_reshard_report(path: &Path) -> bool {
    let Ok(bytes) = crate::format::read::read_regular(path, MAX_REPORT_LEN) else {
        return false;
    };
    is_report_bytes(&bytes)
}

/// True if `bytes` are a reshard report's JSON (see [`is_reshard_report`]).
pub fn is_report_bytes(bytes: &[u8]) -> bool {
    serde_json::from_slice::<ReportProbe>(bytes).is_ok()
}

/// What [`is_reshard_report`] looks for; other keys are skipped unread.
#[derive(serde::Deserialize)]
struct ReportProbe {
    #[allow(dead_code)]
    reshard_version: String,
    #[allow(dead_code)]
    models: SkippedArray,
}

/// Any JSON array, its elements skipped without being kept.
struct SkippedArray;

impl<'de> serde::Deserialize<'de> for SkippedArray {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<SkippedArray, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = SkippedArray;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an array")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<SkippedArray, A::Error> {
                while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
                Ok(SkippedArray)
            }
        }
        d.deserialize_seq(Visit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolve_appends_what_does_not_exist_and_refuses_dotdot_there() {
        let tmp = tempfile::tempdir().unwrap();
        let real = tmp.path().canonicalize().unwrap();
        assert_eq!(
            resolve(&tmp.path().join("a/./b")).unwrap(),
            real.join("a/b")
        );
        if cfg!(windows) {
            // Win32 takes `..` off lexically (GetFullPathNameW), before any
            // link is followed: `a` need not exist.
            assert_eq!(resolve(&tmp.path().join("a/../b")).unwrap(), real.join("b"));
        } else {
            assert!(matches!(
                resolve(&tmp.path().join("a/../b")),
                Err(ScopeError::Unresolvable { .. })
            ));
        }
        std::fs::create_dir(tmp.path().join("a")).unwrap();
        assert_eq!(resolve(&tmp.path().join("a/../b")).unwrap(), real.join("b"));
    }

    #[test]
    fn hf_snapshot_root_is_the_repo_folder() {
        let tmp = tempfile::tempdir().unwrap();
        let repo = tmp.path().join("models--org--m");
        std::fs::create_dir_all(repo.join("snapshots/abc")).unwrap();
        assert_eq!(
            model_root(&repo.join("snapshots/abc")),
            repo.join("snapshots/abc")
        );
        std::fs::create_dir_all(repo.join("blobs")).unwrap();
        assert_eq!(model_root(&repo.join("snapshots/abc")), repo);
        // A pipeline component inside a snapshot links into the same blobs.
        assert_eq!(model_root(&repo.join("snapshots/abc/unet")), repo);
    }

    #[test]
    fn report_rules() {
        let tmp = tempfile::tempdir().unwrap();
        let model = tmp.path().join("m");
        std::fs::create_dir(&model).unwrap();
        std::fs::write(model.join("model.safetensors"), b"w").unwrap();
        let mut sources = SourceSet::default();
        sources.add_model(&model);
        assert!(matches!(
            check_report(&model.join("model.safetensors"), &sources),
            Err(ScopeError::ReportOnSource { .. })
        ));
        assert!(matches!(
            check_report(&model.join("new.json"), &sources),
            Err(ScopeError::ReportInsideSource { .. })
        ));
        let report = tmp.path().join("r.json");
        check_report(&report, &sources).unwrap();
        std::fs::write(&report, b"{\"notes\": 1}").unwrap();
        assert!(matches!(
            check_report(&report, &sources),
            Err(ScopeError::ReportNotOurs { .. })
        ));
        std::fs::write(&report, br#"{"reshard_version": "0.1.0", "models": {}}"#).unwrap();
        assert!(matches!(
            check_report(&report, &sources),
            Err(ScopeError::ReportNotOurs { .. })
        ));
        std::fs::write(&report, br#"{"reshard_version": 1, "models": []}"#).unwrap();
        assert!(check_report(&report, &sources).is_err());
        std::fs::write(
            &report,
            br#"{"reshard_version": "0.1.0", "models": [{"a": [1]}, 2]}"#,
        )
        .unwrap();
        check_report(&report, &sources).unwrap();
    }
}
