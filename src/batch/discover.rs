//! Finding every model under a folder, for `batch`.
//!
//! The rules, in the order they apply to each folder met in the walk:
//!
//! - Names starting with `.` are not entered (`.git`, `.locks`, `.cache`).
//! - The output folder is not entered, so OUT may sit inside ROOT.
//! - A symlink to one of its own ancestors is a loop, and a folder reached a
//!   second time through another symlink is a duplicate: both are reported
//!   as skipped entries, never followed (canonical paths are tracked, and the
//!   walk uses an explicit stack, so no layout can hang it or overflow it).
//! - A Hugging Face cache repo (`models--ORG--NAME` holding `snapshots/` and
//!   `refs/` or `blobs/`) is one model, the snapshot `refs/main` names, written to
//!   `OUT/ORG--NAME`; its snapshots are not listed separately. `datasets--`
//!   and `spaces--` repos are skipped.
//! - A folder with weights ([`looks_like_checkpoint`]) is a model, written to
//!   `OUT/<its path under ROOT>`; the walk does not go below it. So is a
//!   folder whose modules.json or model_index.json names weight sets
//!   ([`is_layout_root`]: a sentence-transformers model, a diffusers
//!   pipeline): it is converted as `convert` converts it, every component
//!   and the rest of its tree (scheduler, tokenizer, model_index.json) in
//!   one output, which its library loads.
//! - Each GGUF file in a folder is a model of its own, and each gguf-split
//!   set (`NAME-00001-of-0000N.gguf` ...) is one model, however many of its
//!   members are there: named `<folder under ROOT>/<file stem>` or
//!   `<folder>/NAME`, written to `OUT/` that name. A folder that is a
//!   safetensors or `.bin` model yields its GGUF files too (their outputs
//!   nest inside the folder's own); a folder of GGUF files only is still
//!   walked into. An HF cache repo whose snapshot holds GGUF files and no
//!   other weights yields one model per file or set, `ORG--NAME/<stem>`.
//! - Every component of a model's output path must be one plain name
//!   ([`is_plain_name`]): a repo folder named `models--..`, `models--.` or
//!   `models--` (which would map to OUT's parent, OUT itself or nothing), or
//!   a folder name holding a `\`, is skipped with the reason, never
//!   joined. (`convert` checks again that each output resolves inside OUT.)
//! - OUT may not lie inside a model's folder: outputs would be written into
//!   a source.
//! - Any other folder is walked into; folders without weights (a
//!   README-only folder) yield nothing.
//!
//! This module only lists; it opens no headers (a broken model shows up when
//! its job runs).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::format::discover::{looks_like_checkpoint, resolve_hf_cache};
use crate::format::layout::is_layout_root;
use crate::names::is_plain_name;
use crate::write::scope::{model_root, resolve};

/// A model found under ROOT.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Model {
    /// Its path under OUT with `/` separators (`org/llama`, `org--tiny`);
    /// `.` when ROOT itself is the model. Also the key `--part` hashes.
    pub name: String,
    /// What `format::open` reads: a model folder or an HF cache repo folder.
    pub source: PathBuf,
    /// Where its conversion goes.
    pub output: PathBuf,
    /// True for an HF cache repo (what `--verify-source` can check).
    pub hf_cache: bool,
}

/// Something discovery met and did not list as a model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Skipped {
    /// Its path under ROOT with `/` separators.
    pub name: String,
    pub path: PathBuf,
    pub reason: String,
}

/// Everything found under ROOT, sorted by name.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Discovery {
    pub models: Vec<Model>,
    pub skipped: Vec<Skipped>,
}

/// Why discovery could not start. Problems below ROOT are [`Skipped`]
/// entries instead.
#[derive(Debug, thiserror::Error)]
pub enum DiscoverError {
    #[error("{}: cannot read the folder to convert", .root.display())]
    Root {
        root: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: not a folder", .root.display())]
    RootNotDir { root: PathBuf },
    #[error("{}: the output folder must not be ROOT itself", .out.display())]
    OutIsRoot { out: PathBuf },
    #[error("{}: the output folder is inside the model folder {}; outputs would be written into a source", .out.display(), .model.display())]
    OutInsideModel { out: PathBuf, model: PathBuf },
    #[error("cannot resolve the output folder {}", .out.display())]
    OutUnresolvable {
        out: PathBuf,
        #[source]
        source: crate::write::scope::ScopeError,
    },
}

/// One folder waiting in the walk.
struct Pending {
    path: PathBuf,
    /// Components under ROOT.
    rel: Vec<String>,
    /// Canonical path of the folder that listed it (None for ROOT).
    parent: Option<PathBuf>,
}

/// Lists the models under `root` whose outputs go under `out`.
pub fn discover(root: &Path, out: &Path) -> Result<Discovery, DiscoverError> {
    let root_canon = crate::platform::canonicalize(root).map_err(|source| DiscoverError::Root {
        root: root.to_path_buf(),
        source,
    })?;
    if !root_canon.is_dir() {
        return Err(DiscoverError::RootNotDir {
            root: root.to_path_buf(),
        });
    }
    let out_canon = crate::platform::canonicalize(out).ok();
    if out_canon.as_ref() == Some(&root_canon) {
        return Err(DiscoverError::OutIsRoot {
            out: out.to_path_buf(),
        });
    }
    let mut found = Discovery::default();
    let mut visited: HashMap<PathBuf, String> = HashMap::new();
    let mut stack = vec![Pending {
        path: root.to_path_buf(),
        rel: Vec::new(),
        parent: None,
    }];
    while let Some(dir) = stack.pop() {
        let name = rel_name(&dir.rel);
        let canon = match crate::platform::canonicalize(&dir.path) {
            Ok(c) => c,
            Err(e) => {
                found.skipped.push(skip(&name, &dir.path, io_reason(&e)));
                continue;
            }
        };
        if out_canon.as_ref() == Some(&canon) {
            continue;
        }
        if dir.parent.as_ref().is_some_and(|p| p.starts_with(&canon)) {
            let reason = format!(
                "symlink loop: points back to its ancestor {}",
                canon.display()
            );
            found.skipped.push(skip(&name, &dir.path, reason));
            continue;
        }
        if let Some(first) = visited.get(&canon) {
            let reason = format!("same folder as {first} (reached through a symlink)");
            found.skipped.push(skip(&name, &dir.path, reason));
            continue;
        }
        visited.insert(canon.clone(), name.clone());
        if is_hf_repo(&dir.path) {
            hf_repo(&dir, &name, out, &mut found);
            continue;
        }
        let is_model = looks_like_checkpoint(&dir.path) || is_layout_root(&dir.path);
        if is_model || has_gguf(&dir.path) {
            if let Some(bad) = dir.rel.iter().find(|c| !is_plain_name(c)) {
                let reason = format!("folder name {bad:?} cannot be an output folder name");
                found.skipped.push(skip(&name, &dir.path, reason));
                continue;
            }
            let output = dir.rel.iter().fold(out.to_path_buf(), |p, c| p.join(c));
            gguf_models(&dir.path, &dir.rel, &output, &mut found);
            if is_model {
                found.models.push(Model {
                    name,
                    source: dir.path,
                    output,
                    hf_cache: false,
                });
                continue;
            }
        }
        let children = match subfolders(&dir.path) {
            Ok(c) => c,
            Err(e) => {
                found.skipped.push(skip(&name, &dir.path, io_reason(&e)));
                continue;
            }
        };
        for child in children.into_iter().rev() {
            match child {
                Ok((file_name, path)) => {
                    let mut rel = dir.rel.clone();
                    rel.push(file_name);
                    stack.push(Pending {
                        path,
                        rel,
                        parent: Some(canon.clone()),
                    });
                }
                Err((file_name, path, reason)) => {
                    let mut rel = dir.rel.clone();
                    rel.push(file_name);
                    found.skipped.push(skip(&rel_name(&rel), &path, reason));
                }
            }
        }
    }
    dedupe_outputs(&mut found);
    refuse_out_inside_a_model(out, &found)?;
    found.models.sort_by(|a, b| a.name.cmp(&b.name));
    found.skipped.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(found)
}

type Child = Result<(String, PathBuf), (String, PathBuf, String)>;

/// The folders (after following symlinks) in `dir`, sorted, without hidden
/// ones; entries the OS cannot resolve (ELOOP, dangling links to folders)
/// come back as errors to report.
fn subfolders(dir: &Path) -> std::io::Result<Vec<Child>> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)?.filter_map(Result::ok).collect();
    entries.sort_by_key(std::fs::DirEntry::file_name);
    let mut out = Vec::new();
    for entry in entries {
        let file_name = entry.file_name().to_string_lossy().into_owned();
        if file_name.starts_with('.') {
            continue;
        }
        let path = entry.path();
        match std::fs::metadata(&path) {
            Ok(m) if m.is_dir() => out.push(Ok((file_name, path))),
            Ok(_) => {}
            // A dangling link is not a folder we lost; only a loop is news.
            Err(e) if crate::platform::is_symlink_loop(&e) => {
                out.push(Err((file_name, path, io_reason(&e))))
            }
            Err(_) => {}
        }
    }
    Ok(out)
}

/// `snapshots/` beside `refs/` or `blobs/`: a cache repo as huggingface_hub
/// writes it with symlinks or without (Windows without Developer Mode, where
/// the snapshot holds real copies and `blobs/` may be gone), or as a copy of
/// the cache that left the empty `blobs/` behind.
fn is_hf_repo(dir: &Path) -> bool {
    dir.join("snapshots").is_dir() && (dir.join("refs").is_dir() || dir.join("blobs").is_dir())
}

/// An HF cache repo: one model named ORG--NAME, or a skipped entry.
fn hf_repo(dir: &Pending, name: &str, out: &Path, found: &mut Discovery) {
    let file_name = dir.rel.last().cloned().or_else(|| {
        dir.path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
    });
    let Some(repo) = file_name
        .as_deref()
        .and_then(|n| n.strip_prefix("models--"))
    else {
        found.skipped.push(skip(
            name,
            &dir.path,
            "hugging face cache repo that is not a model (datasets--, spaces--)".into(),
        ));
        return;
    };
    if !is_plain_name(repo) {
        found.skipped.push(skip(
            name,
            &dir.path,
            format!("repo name {repo:?} cannot be an output folder name"),
        ));
        return;
    }
    // A repo whose refs/main is broken is still listed: its job fails with
    // the reader's precise error instead of the model silently vanishing.
    if let Ok(snapshot) = resolve_hf_cache(&dir.path) {
        let is_model = looks_like_checkpoint(&snapshot) || is_layout_root(&snapshot);
        if !is_model && has_gguf(&snapshot) {
            let rel = [repo.to_string()];
            gguf_models(&snapshot, &rel, &out.join(repo), found);
            return;
        }
        if !is_model {
            found.skipped.push(skip(
                name,
                &dir.path,
                "no weight files in the snapshot refs/main names".into(),
            ));
            return;
        }
    }
    found.models.push(Model {
        name: repo.to_string(),
        source: dir.path.clone(),
        output: out.join(repo),
        hf_cache: true,
    });
}

/// A GGUF file in `dir`: one model.
struct GgufEntry {
    /// The file stem, or a split set's `NAME`.
    name: String,
    /// The file to open: the set's first member when it is there, else its
    /// lowest-numbered one (opening it names the missing members).
    file: PathBuf,
}

/// Whether `dir` holds a GGUF file (a regular file or a link to one).
fn has_gguf(dir: &Path) -> bool {
    !gguf_entries(dir).is_empty()
}

/// The GGUF models in `dir`, by name: one per file, one per split set.
fn gguf_entries(dir: &Path) -> Vec<GgufEntry> {
    let Ok(read) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    // name -> (split number, 0 for a single file; path)
    let mut by_name: BTreeMap<String, (u64, PathBuf)> = BTreeMap::new();
    for entry in read.filter_map(Result::ok) {
        let file_name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        if file_name.starts_with('.')
            || !crate::format::gguf::is_gguf_path(&path)
            || !std::fs::metadata(&path).is_ok_and(|m| m.is_file())
        {
            continue;
        }
        let (name, no) = match split_member(&file_name) {
            Some((prefix, no)) => (prefix.to_string(), no),
            None => (gguf_stem(&file_name).to_string(), 0),
        };
        match by_name.get(&name) {
            Some((have, _)) if *have <= no => {}
            _ => {
                by_name.insert(name, (no, path));
            }
        }
    }
    by_name
        .into_iter()
        .map(|(name, (_, file))| GgufEntry { name, file })
        .collect()
}

/// `NAME` and the 1-based member number of `NAME-00001-of-0000N.gguf`
/// (five digits each, as llama.cpp names them).
pub(crate) fn split_member(file_name: &str) -> Option<(&str, u64)> {
    let stem = gguf_stem(file_name);
    let (head, count) = stem.rsplit_once("-of-")?;
    let (prefix, no) = head.rsplit_once('-')?;
    let digits = |s: &str| s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit());
    if prefix.is_empty() || !digits(no) || !digits(count) {
        return None;
    }
    let (no, count) = (no.parse::<u64>().ok()?, count.parse::<u64>().ok()?);
    (1..=count).contains(&no).then_some((prefix, no))
}

fn gguf_stem(file_name: &str) -> &str {
    let cut = file_name.len().saturating_sub(".gguf".len());
    file_name.get(..cut).unwrap_or(file_name)
}

/// Lists the GGUF models of `dir` under `rel` (outputs under `output`).
fn gguf_models(dir: &Path, rel: &[String], output: &Path, found: &mut Discovery) {
    for e in gguf_entries(dir) {
        let mut parts = rel.to_vec();
        parts.push(e.name.clone());
        let name = rel_name(&parts);
        if !is_plain_name(&e.name) {
            let reason = format!("file name {:?} cannot be an output folder name", e.name);
            found.skipped.push(skip(&name, &e.file, reason));
            continue;
        }
        found.models.push(Model {
            name,
            output: output.join(&e.name),
            source: e.file,
            hf_cache: false,
        });
    }
}

/// OUT inside a model's folder (or its HF cache repo) would put outputs
/// into a source.
fn refuse_out_inside_a_model(out: &Path, found: &Discovery) -> Result<(), DiscoverError> {
    let out_real = resolve(out).map_err(|source| DiscoverError::OutUnresolvable {
        out: out.to_path_buf(),
        source,
    })?;
    for m in &found.models {
        let Ok(real) = crate::platform::canonicalize(&m.source) else {
            continue;
        };
        let snapshot = resolve_hf_cache(&m.source)
            .ok()
            .and_then(|d| crate::platform::canonicalize(&d).ok());
        let roots = [Some(real), snapshot.map(|s| model_root(&s))];
        if roots.iter().flatten().any(|r| out_real.starts_with(r)) {
            return Err(DiscoverError::OutInsideModel {
                out: out.to_path_buf(),
                model: m.source.clone(),
            });
        }
    }
    Ok(())
}

/// Two models may not share an output folder (two HF caches holding the same
/// repo, or a cache repo next to a folder named ORG--NAME): the first in
/// walk order keeps it.
fn dedupe_outputs(found: &mut Discovery) {
    let mut owner: BTreeMap<String, PathBuf> = BTreeMap::new();
    let mut kept = Vec::with_capacity(found.models.len());
    for m in found.models.drain(..) {
        if let Some(first) = owner.get(&m.name) {
            let reason = format!(
                "its output {} is already taken by {}",
                m.output.display(),
                first.display()
            );
            found.skipped.push(skip(&m.name, &m.source, reason));
        } else {
            owner.insert(m.name.clone(), m.source.clone());
            kept.push(m);
        }
    }
    found.models = kept;
}

fn rel_name(rel: &[String]) -> String {
    if rel.is_empty() {
        ".".to_string()
    } else {
        rel.join("/")
    }
}

fn skip(name: &str, path: &Path, reason: String) -> Skipped {
    Skipped {
        name: name.to_string(),
        path: path.to_path_buf(),
        reason,
    }
}

fn io_reason(e: &std::io::Error) -> String {
    if crate::platform::is_symlink_loop(e) {
        "symlink loop (too many levels of symbolic links)".to_string()
    } else {
        format!("cannot read: {e}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny but real safetensors file: discovery only looks at names, but
    /// keep it openable.
    fn weights(dir: &Path, name: &str) {
        std::fs::create_dir_all(dir).unwrap();
        let header = br#"{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}  "#;
        let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(header);
        bytes.extend_from_slice(&[0; 4]);
        std::fs::write(dir.join(name), bytes).unwrap();
    }

    fn names(d: &Discovery) -> Vec<&str> {
        d.models.iter().map(|m| m.name.as_str()).collect()
    }

    #[test]
    fn each_gguf_file_and_each_split_set_is_one_model() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("root");
        let g = root.join("llm");
        std::fs::create_dir_all(g.join("more")).unwrap();
        for f in [
            "a.gguf",
            "b-Q4_K_M.gguf",
            "big-00001-of-00003.gguf",
            "big-00002-of-00003.gguf",
            "big-00003-of-00003.gguf",
            "half-00002-of-00002.gguf",
            "notes.txt",
        ] {
            std::fs::write(g.join(f), b"GGUF").unwrap();
        }
        std::fs::write(g.join("more/c.gguf"), b"GGUF").unwrap();
        let out = tmp.path().join("out");
        let d = discover(&root, &out).unwrap();
        assert_eq!(
            names(&d),
            ["llm/a", "llm/b-Q4_K_M", "llm/big", "llm/half", "llm/more/c"]
        );
        let big = &d.models[2];
        assert_eq!(big.source, g.join("big-00001-of-00003.gguf"));
        assert_eq!(big.output, out.join("llm/big"));
        // A set missing its first member opens from the lowest one there,
        // which names what is missing.
        assert_eq!(d.models[3].source, g.join("half-00002-of-00002.gguf"));
        assert!(d.models.iter().all(|m| !m.hf_cache));
        assert!(d.skipped.is_empty(), "{:?}", d.skipped);
    }

    #[test]
    fn a_safetensors_model_folder_yields_its_gguf_files_too() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("root");
        weights(&root.join("m"), "model.safetensors");
        std::fs::write(root.join("m/m-Q8_0.gguf"), b"GGUF").unwrap();
        weights(&root.join("m/sub"), "model.safetensors");
        std::fs::write(root.join("top.gguf"), b"GGUF").unwrap();
        let d = discover(&root, &tmp.path().join("out")).unwrap();
        // The folder's own weights, its GGUF, and a GGUF in ROOT itself;
        // the walk still stops at the safetensors model.
        assert_eq!(names(&d), ["m", "m/m-Q8_0", "top"]);
        assert_eq!(d.models[0].source, root.join("m"));
        assert_eq!(d.models[1].source, root.join("m/m-Q8_0.gguf"));
    }

    #[test]
    fn split_member_names() {
        assert_eq!(split_member("x-00001-of-00002.gguf"), Some(("x", 1)));
        assert_eq!(split_member("a-b-00010-of-00012.gguf"), Some(("a-b", 10)));
        for plain in [
            "x.gguf",
            "x-1-of-2.gguf",
            "x-00003-of-00002.gguf",
            "x-00000-of-00002.gguf",
            "-00001-of-00002.gguf",
            "x-0001a-of-00002.gguf",
        ] {
            assert_eq!(split_member(plain), None, "{plain}");
        }
    }

    #[test]
    fn finds_models_and_stops_at_them() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("root");
        weights(&root.join("a"), "model.safetensors");
        weights(&root.join("a/checkpoint-10"), "model.safetensors");
        weights(&root.join("org/b"), "model-00001-of-00002.safetensors");
        weights(&root.join("org/c"), "pytorch_model.bin");
        std::fs::create_dir_all(root.join("docs")).unwrap();
        std::fs::write(root.join("docs/README.md"), "hi").unwrap();
        weights(&root.join(".hidden"), "model.safetensors");
        let d = discover(&root, &tmp.path().join("out")).unwrap();
        assert_eq!(names(&d), ["a", "org/b", "org/c"]);
        assert_eq!(d.models[1].output, tmp.path().join("out/org/b"));
        assert!(d.skipped.is_empty(), "{:?}", d.skipped);
    }

    #[test]
    fn a_pipeline_is_one_model_and_out_inside_root_is_skipped() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        std::fs::create_dir_all(root.join("sd/scheduler")).unwrap();
        std::fs::write(
            root.join("sd/model_index.json"),
            r#"{"unet": ["diffusers", "U"], "vae": ["diffusers", "V"], "scheduler": ["diffusers", "S"]}"#,
        )
        .unwrap();
        weights(&root.join("sd/unet"), "diffusion_pytorch_model.safetensors");
        weights(&root.join("sd/vae"), "diffusion_pytorch_model.safetensors");
        // A model_index.json that names no weight set is no pipeline: its
        // folders are walked into.
        std::fs::create_dir_all(root.join("odd")).unwrap();
        std::fs::write(root.join("odd/model_index.json"), "{}").unwrap();
        weights(
            &root.join("odd/unet"),
            "diffusion_pytorch_model.safetensors",
        );
        // A sentence-transformers model whose Transformer module sits in a
        // subfolder: one model too.
        std::fs::create_dir_all(root.join("st")).unwrap();
        std::fs::write(
            root.join("st/modules.json"),
            r#"[{"path": "0_Transformer", "type": "sentence_transformers.models.Transformer"},
                {"path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]"#,
        )
        .unwrap();
        weights(&root.join("st/0_Transformer"), "model.safetensors");
        weights(&root.join("out/old"), "model.safetensors");
        let d = discover(root, &root.join("out")).unwrap();
        assert_eq!(names(&d), ["odd/unet", "sd", "st"]);
        assert_eq!(d.models[1].source, root.join("sd"));
        assert_eq!(d.models[1].output, root.join("out/sd"));
    }

    #[test]
    fn hf_cache_repo_is_one_model_named_org_name() {
        let tmp = tempfile::tempdir().unwrap();
        let repo = tmp.path().join("hub/models--org--tiny");
        weights(&repo.join("snapshots/abc"), "model.safetensors");
        weights(&repo.join("snapshots/old"), "model.safetensors");
        std::fs::create_dir_all(repo.join("blobs")).unwrap();
        std::fs::create_dir_all(repo.join("refs")).unwrap();
        std::fs::write(repo.join("refs/main"), "abc").unwrap();
        std::fs::create_dir_all(tmp.path().join("hub/datasets--org--d/snapshots")).unwrap();
        std::fs::create_dir_all(tmp.path().join("hub/datasets--org--d/blobs")).unwrap();
        let d = discover(tmp.path(), &tmp.path().join("../out")).unwrap();
        assert_eq!(names(&d), ["org--tiny"]);
        assert!(d.models[0].hf_cache);
        assert!(d.models[0].output.ends_with("out/org--tiny"));
        assert_eq!(d.skipped.len(), 1);
        assert!(d.skipped[0].reason.contains("not a model"));
    }

    #[test]
    fn hf_cache_repo_without_blobs_is_still_one_model() {
        // Windows without symlinks: the snapshot holds real copies, and a
        // copied or cleaned cache may have no blobs/ at all.
        let tmp = tempfile::tempdir().unwrap();
        let repo = tmp.path().join("hub/models--org--copied");
        weights(&repo.join("snapshots/abc"), "model.safetensors");
        std::fs::create_dir_all(repo.join("refs")).unwrap();
        std::fs::write(repo.join("refs/main"), "abc").unwrap();
        let d = discover(tmp.path(), &tmp.path().join("../out")).unwrap();
        assert_eq!(names(&d), ["org--copied"]);
        assert!(d.models[0].hf_cache);
    }

    #[cfg(unix)]
    #[test]
    fn symlink_loops_are_skipped_not_followed() {
        use std::os::unix::fs::symlink;
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("root");
        weights(&root.join("m"), "model.safetensors");
        std::fs::create_dir_all(root.join("x/y")).unwrap();
        symlink("..", root.join("x/y/up")).unwrap();
        symlink("../../..", root.join("x/y/way-up")).unwrap();
        symlink("self", root.join("x/self")).unwrap();
        symlink("../m", root.join("x/same")).unwrap();
        let d = discover(&root, &tmp.path().join("out")).unwrap();
        assert_eq!(names(&d), ["m"]);
        let skipped: Vec<(&str, &str)> = d
            .skipped
            .iter()
            .map(|s| (s.name.as_str(), s.reason.as_str()))
            .collect();
        assert_eq!(skipped.len(), 4, "{skipped:?}");
        assert!(
            skipped[0].0 == "x/same" && skipped[0].1.contains("same folder as m"),
            "{skipped:?}"
        );
        assert!(
            skipped[1].0 == "x/self" && skipped[1].1.contains("loop"),
            "{skipped:?}"
        );
        assert!(
            skipped[2].0 == "x/y/up" && skipped[2].1.contains("loop"),
            "{skipped:?}"
        );
        assert!(
            skipped[3].0 == "x/y/way-up" && skipped[3].1.contains("loop"),
            "{skipped:?}"
        );
    }

    #[test]
    fn names_that_are_not_one_folder_name_are_skipped_and_out_inside_a_model_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("root");
        // Win32 strips trailing dots from a folder name: `models--..` and
        // `models--.` cannot exist on Windows, only the empty name can.
        let bad: &[&str] = if cfg!(windows) {
            &["models--"]
        } else {
            &["models--..", "models--.", "models--"]
        };
        for name in bad {
            let repo = root.join(name);
            weights(&repo.join("snapshots/abc"), "model.safetensors");
            std::fs::create_dir_all(repo.join("blobs")).unwrap();
        }
        weights(&root.join("ok"), "model.safetensors");
        let d = discover(&root, &tmp.path().join("out")).unwrap();
        assert_eq!(names(&d), ["ok"]);
        assert_eq!(d.skipped.len(), bad.len(), "{:?}", d.skipped);
        assert!(d
            .skipped
            .iter()
            .all(|s| s.reason.contains("cannot be an output folder name")));
        assert!(matches!(
            discover(&root, &root.join("ok/converted")),
            Err(DiscoverError::OutInsideModel { .. })
        ));
    }

    #[test]
    fn root_errors() {
        let tmp = tempfile::tempdir().unwrap();
        assert!(matches!(
            discover(&tmp.path().join("nope"), tmp.path()),
            Err(DiscoverError::Root { .. })
        ));
        std::fs::write(tmp.path().join("f"), "x").unwrap();
        assert!(matches!(
            discover(&tmp.path().join("f"), tmp.path()),
            Err(DiscoverError::RootNotDir { .. })
        ));
        assert!(matches!(
            discover(tmp.path(), tmp.path()),
            Err(DiscoverError::OutIsRoot { .. })
        ));
    }
}
