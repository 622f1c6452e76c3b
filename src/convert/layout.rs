//! Converting a model folder made of several weight sets
//! ([`ModelLayout`]: a sentence-transformers model, a diffusers pipeline,
//! or a plain model folder with subfolders).
//!
//! The root job runs first: the root's own weights, if it has any (a
//! pipeline's root has none: the job then only copies), and every other
//! file of the tree that no other weight set's folder holds, at its
//! relative path. Then each weight set is converted in its own folder of
//! DST, as a model of its own ([`convert_gated`]: own plan, lock,
//! manifest, resume), under the names its library loads: the source's
//! prefix is kept (`diffusion_pytorch_model` for diffusers models, `model`
//! for transformers), a set the library reads as one file
//! ([`WeightSet::one_file`]) is written as one file, and a diffusers
//! config.json (which has no dtype key) is copied as it is.
//!
//! Each folder is all or nothing on its own; a run stopped between two
//! folders leaves the finished ones committed and a rerun finishes the rest.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::AtomicBool;

use super::error::ConvertError;
use super::options::{BeforeCommit, ComponentSummary, ConvertOptions, ConvertSummary};
use super::other::{self, Walk};
use super::run::{convert_gated, convert_with_pool, plan_for};
use super::split::{self, ComponentPrefix};
use crate::exec::{Reporter, WindowPool};
use crate::format::layout::{Library, ModelLayout, WeightSet};
use crate::format::{self, Checkpoint, Format, Layout};
use crate::plan::Plan;

/// Converts every weight set of `layout` into `dst` (see the module doc),
/// asking `before_commit` before each folder commits ([`convert_gated`]).
pub fn convert_layout(
    layout: &ModelLayout,
    dst: &Path,
    options: &ConvertOptions,
    pool: &WindowPool,
    reporter: &dyn Reporter,
    cancel: &AtomicBool,
    before_commit: BeforeCommit,
) -> Result<ConvertSummary, ConvertError> {
    // A reserved name deep in a component folder would otherwise be found
    // only after the root job has written.
    other::check_portable_names(&layout.root)?;
    let components = layout.component_dirs();
    let (root_ck, root_set) = match layout.sets.iter().find(|s| s.rel.is_empty()) {
        Some(set) => (format::open(&layout.root)?, Some(set)),
        None => (copy_only(&layout.root), None),
    };
    let mut root_options = set_options(options, root_set);
    root_options.walk = Walk::Tree {
        except: components.clone(),
    };
    let mut summary = convert_gated(
        &root_ck,
        dst,
        &root_options,
        pool,
        reporter,
        cancel,
        before_commit,
    )?;
    for set in layout.sets.iter().filter(|s| !s.rel.is_empty()) {
        let dir = layout.dir_of(set);
        let ck = format::open(&dir)?;
        let out = other::subfolder(dst, &set.rel)?;
        let mut o = set_options(options, Some(set));
        o.walk = Walk::Tree {
            except: components
                .iter()
                .filter(|c| c.starts_with(&dir) && **c != dir)
                .cloned()
                .collect(),
        };
        if o.within.is_none() {
            o.within = Some(dst.to_path_buf());
        }
        let s = convert_gated(&ck, &out, &o, pool, reporter, cancel, before_commit)?;
        summary.components.push(ComponentSummary {
            path: set.rel.clone(),
            library: set.library,
            one_file: set.one_file,
            findings: ck.findings,
            summary: s,
        });
    }
    Ok(summary)
}

/// `convert --split-components`: each component of the all-in-one `ck`
/// ([`split::split`]) as one file, `DST/NAME/NAME.safetensors`, by its own
/// conversion (in component name order).
pub fn convert_split(
    ck: &Checkpoint,
    dst: &Path,
    options: &ConvertOptions,
    prefixes: &[ComponentPrefix],
    pool: &WindowPool,
    reporter: &dyn Reporter,
    cancel: &AtomicBool,
) -> Result<Vec<ComponentSummary>, ConvertError> {
    let parts = split::split(ck, prefixes)?;
    // Taken back if no component is written (the first one refused).
    let made = crate::write::made::MadeDirs::create(dst)
        .map_err(|e| crate::write::WriteError::io(dst, e))?;
    let mut out = Vec::with_capacity(parts.len());
    for (component, part) in parts {
        let folder = other::subfolder(dst, &component.name)?;
        let mut o = component_options(options, &component);
        o.within = Some(o.within.clone().unwrap_or_else(|| dst.to_path_buf()));
        let summary = convert_with_pool(&part, &folder, &o, pool, reporter, cancel)?;
        out.push(ComponentSummary {
            path: component.name.clone(),
            library: Library::Other,
            one_file: true,
            findings: Vec::new(),
            summary,
        });
    }
    made.keep();
    Ok(out)
}

/// The plans [`convert_layout`] executes, weight set by weight set (the
/// root's, under `""`, first when it holds weights): what `--dry-run`
/// prints, from the same per-set options.
pub fn plan_layout(
    layout: &ModelLayout,
    options: &ConvertOptions,
) -> Result<Vec<(String, Plan)>, ConvertError> {
    let mut plans = Vec::with_capacity(layout.sets.len());
    let root_first = layout
        .sets
        .iter()
        .filter(|s| s.rel.is_empty())
        .chain(layout.sets.iter().filter(|s| !s.rel.is_empty()));
    for set in root_first {
        let ck = format::open(&layout.dir_of(set))?;
        plans.push((
            set.rel.clone(),
            plan_for(&ck, &set_options(options, Some(set)))?,
        ));
    }
    Ok(plans)
}

/// The plans [`convert_split`] executes, component by component.
pub fn plan_split(
    ck: &Checkpoint,
    options: &ConvertOptions,
    prefixes: &[ComponentPrefix],
) -> Result<Vec<(ComponentPrefix, Plan)>, ConvertError> {
    let mut plans = Vec::new();
    for (component, part) in split::split(ck, prefixes)? {
        let plan = plan_for(&part, &component_options(options, &component))?;
        plans.push((component, plan));
    }
    Ok(plans)
}

/// `options` for one component of a split: one file, nothing else copied,
/// kept whole (no cast) when a preset keeps the component.
fn component_options(options: &ConvertOptions, component: &ComponentPrefix) -> ConvertOptions {
    let mut o = options.clone();
    o.plan.max_shard_size = u64::MAX;
    o.copy_other_files = false;
    o.walk = Walk::Flat;
    o.id_salt = Some(format!("split {}={}", component.name, component.prefix));
    // `other` holds what no model reads as a weight: a scheduler's tables
    // (`alphas_cumprod`, `betas`), EMA counters. `--dtype f16` would round
    // `alphas_cumprod` (0.99915 -> 0.99902) for nothing, so it keeps its
    // dtype, as a kept component does.
    if o.keep_components.contains(&component.name) || component.name == split::OTHER {
        o.plan.dtype = None;
    }
    o
}

/// `options` for one weight set: one file where its library reads one,
/// config.json's dtype rewritten only where the library keeps one there.
fn set_options(options: &ConvertOptions, set: Option<&WeightSet>) -> ConvertOptions {
    let mut o = options.clone();
    o.copy_other_files = true;
    if let Some(set) = set {
        if set.one_file {
            o.plan.max_shard_size = u64::MAX;
        }
        o.config_dtype = set.library != Library::Diffusers;
        if o.keep_components.contains(&set.rel) {
            o.plan.dtype = None;
        }
    }
    o
}

/// A checkpoint with no tensors: the root job of a folder whose root holds
/// no weights (a pipeline) writes no shard and only copies files.
fn copy_only(dir: &Path) -> Checkpoint {
    Checkpoint {
        dir: dir.to_path_buf(),
        format: Format::Safetensors,
        layout: Layout::Loose,
        prefix: "model".into(),
        files: Vec::new(),
        tensors: Vec::new(),
        metadata: BTreeMap::new(),
        findings: Vec::new(),
    }
}
