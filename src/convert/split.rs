//! `convert --split-components`: an all-in-one UI checkpoint (UNet or DiT,
//! VAE and text encoders in one `.safetensors`, names under prefixes) into
//! one file per component, so each loads alone and the commit peak is the
//! largest component, not the whole.
//!
//! Each tensor goes to the component of the longest prefix it starts with:
//! first the user's `--component-prefix NAME=PREFIX`, then [`PREFIXES`],
//! then two families (`conditioner.embedders.N.` is `text_encoder` for N = 0
//! and `text_encoder_{N+1}` after it; `text_encoders.NAME.` is `NAME`).
//! Tensors under no prefix (`alphas_cumprod`, ...) go to `other`, names
//! kept, so the union of the outputs is the input, tensor for tensor.
//!
//! The prefix is stripped: a component file as UIs load it alone (ComfyUI's
//! UNet, VAE and CLIP loaders, A1111's VAE menu, a diffusers
//! `from_single_file` of a VAE) carries the component's own names
//! (`encoder.conv_in.weight`), not the all-in-one file's. The stripped
//! prefix is recorded in the file's `__metadata__` under
//! [`PREFIX_KEY`], so the split can be undone exactly.
//!
//! Each component is written as `DST/NAME/NAME.safetensors` by its own
//! conversion (own manifest, resume, bounded memory); nothing is read but
//! the tensors' bytes, once.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::format::Checkpoint;
use crate::names::{is_plain_name, windows_reserved};

/// `__metadata__` key holding the prefix stripped from a component's names.
pub const PREFIX_KEY: &str = "reshard_stripped_prefix";
/// The component of tensors under no prefix.
pub const OTHER: &str = "other";

/// Known prefixes of all-in-one checkpoints and the component each names.
pub const PREFIXES: &[(&str, &str)] = &[
    // SD 1.x / 2.x and SDXL (ldm / sgm names), also Flux and SD3 UIs' files.
    ("unet", "model.diffusion_model."),
    ("vae", "first_stage_model."),
    ("text_encoder", "cond_stage_model."),
];

/// One `NAME=PREFIX` pair.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ComponentPrefix {
    pub name: String,
    pub prefix: String,
}

/// Why a checkpoint cannot be split.
#[derive(Debug, thiserror::Error)]
pub enum SplitError {
    #[error("--component-prefix {0:?}: expected NAME=PREFIX with NAME one plain folder name and PREFIX not empty")]
    BadPair(String),
    #[error("--component-prefix {pair:?}: {reason}; the output must be portable to Windows, choose another NAME")]
    ReservedPair { pair: String, reason: &'static str },
    #[error("{file}: tensor {tensor:?} is under component {component:?}, which cannot be a folder name: {reason}; the output must be portable to Windows, pass --component-prefix NAME={prefix} with another NAME")]
    ReservedComponent {
        file: String,
        tensor: String,
        component: String,
        prefix: String,
        reason: &'static str,
    },
    #[error("no tensor of {file} is under a known component prefix (model.diffusion_model., first_stage_model., cond_stage_model., conditioner.embedders.N., text_encoders.NAME.); pass --component-prefix NAME=PREFIX")]
    NoComponents { file: String },
    #[error("{file}: tensor {tensor:?} would be written as {name:?} once its component prefix is stripped: {reason}")]
    BadName {
        file: String,
        tensor: String,
        name: String,
        reason: &'static str,
    },
    #[error("{file}: tensor {tensor:?} {clash}; pass --component-prefix to give them different folder names")]
    NameClash {
        file: String,
        tensor: String,
        /// Which component and prefix it would join, and which is there.
        clash: String,
    },
}

impl std::str::FromStr for ComponentPrefix {
    type Err = SplitError;
    fn from_str(s: &str) -> Result<Self, SplitError> {
        let name = s.split_once('=').map_or("", |(n, _)| n);
        if let Some(reason) = windows_reserved(name) {
            return Err(SplitError::ReservedPair {
                pair: s.to_string(),
                reason,
            });
        }
        match s.split_once('=') {
            Some((name, prefix)) if is_plain_name(name) && name != OTHER && !prefix.is_empty() => {
                Ok(ComponentPrefix {
                    name: name.to_string(),
                    prefix: prefix.to_string(),
                })
            }
            _ => Err(SplitError::BadPair(s.to_string())),
        }
    }
}

/// The component and prefix of `name`: the user's pairs, the table, the
/// two families; `None` for a name under none of them.
pub fn component_of(name: &str, user: &[ComponentPrefix]) -> Option<ComponentPrefix> {
    // User pairs win over the built-in ones whatever their length.
    if let Some(p) = user
        .iter()
        .filter(|p| name.starts_with(&p.prefix))
        .max_by_key(|p| p.prefix.len())
    {
        return Some(p.clone());
    }
    PREFIXES
        .iter()
        .map(|(n, p)| (n.to_string(), p.to_string()))
        .chain(family_prefix(name))
        .filter(|(_, p)| name.starts_with(p.as_str()))
        .max_by_key(|(_, p)| p.len())
        .map(|(name, prefix)| ComponentPrefix { name, prefix })
}

/// `conditioner.embedders.N.` and `text_encoders.NAME.` prefixes of `name`.
fn family_prefix(name: &str) -> Option<(String, String)> {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if let Some(rest) = name.strip_prefix("conditioner.embedders.") {
        let n = rest.split('.').next().filter(|n| digits(n))?;
        let index: u64 = n.parse().ok()?;
        let component = match index {
            0 => "text_encoder".to_string(),
            i => format!("text_encoder_{}", i + 1),
        };
        return Some((component, format!("conditioner.embedders.{n}.")));
    }
    let rest = name.strip_prefix("text_encoders.")?;
    let enc = rest
        .split('.')
        .next()
        .filter(|e| is_plain_name(e) && *e != OTHER)?;
    Some((enc.to_string(), format!("text_encoders.{enc}.")))
}

/// One checkpoint per component: the tensors under its prefix, renamed
/// without it, the prefix recorded in the metadata; in component name order.
pub fn split(
    ck: &Checkpoint,
    user: &[ComponentPrefix],
) -> Result<Vec<(ComponentPrefix, Checkpoint)>, SplitError> {
    let file = ck
        .files
        .first()
        .map(crate::format::SourceFile::name)
        .unwrap_or_default();
    let mut parts: BTreeMap<String, (ComponentPrefix, Checkpoint)> = BTreeMap::new();
    for t in &ck.tensors {
        let (key, stripped) = match component_of(&t.name, user) {
            Some(c) => {
                let rest = &t.name[c.prefix.len()..];
                // The reader's rule for names (the planner applies it
                // again); refused here to name the tensor as the source
                // has it (`first_stage_model.__metadata__`).
                if let Some(reason) = crate::format::tensor_names::unholdable(rest) {
                    return Err(SplitError::BadName {
                        file,
                        tensor: t.name.clone(),
                        name: rest.to_string(),
                        reason,
                    });
                }
                (c, rest.to_string())
            }
            None => (
                ComponentPrefix {
                    name: OTHER.into(),
                    prefix: String::new(),
                },
                t.name.clone(),
            ),
        };
        // The name becomes DST/NAME/NAME.safetensors: `text_encoders.con.`
        // must not make DST/con/con.safetensors (the console on Windows).
        if let Some(reason) = windows_reserved(&key.name) {
            return Err(SplitError::ReservedComponent {
                file,
                tensor: t.name.clone(),
                component: key.name,
                prefix: key.prefix,
                reason,
            });
        }
        // One folder, one prefix: two prefixes under one name would write
        // two tensors under one stripped name (and record one prefix), and
        // names equal but for case are one folder on Windows and macOS.
        if let Some((other, (c, _))) = parts.iter().find(|(n, (c, _))| {
            n.eq_ignore_ascii_case(&key.name) && (**n != key.name || c.prefix != key.prefix)
        }) {
            return Err(SplitError::NameClash {
                file,
                tensor: t.name.clone(),
                clash: format!(
                    "puts component {:?} under prefix {:?}, but {:?} already names component {other:?}",
                    key.name, key.prefix, c.prefix
                ),
            });
        }
        let entry = parts.entry(key.name.clone()).or_insert_with(|| {
            let mut part = ck.clone();
            part.tensors = Vec::new();
            part.findings = Vec::new();
            part.prefix = key.name.clone();
            part.metadata.insert(PREFIX_KEY.into(), key.prefix.clone());
            (key.clone(), part)
        });
        let mut tensor = t.clone();
        tensor.name = stripped;
        entry.1.tensors.push(tensor);
    }
    if parts.keys().all(|k| k == OTHER) {
        return Err(SplitError::NoComponents { file });
    }
    Ok(parts.into_values().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(name: &str, user: &[ComponentPrefix]) -> Option<(String, String)> {
        component_of(name, user).map(|c| (c.name, c.prefix))
    }

    #[test]
    fn the_prefix_table_and_families() {
        let p = |n: &str, p: &str| Some((n.to_string(), p.to_string()));
        assert_eq!(
            c("model.diffusion_model.input_blocks.0.0.weight", &[]),
            p("unet", "model.diffusion_model.")
        );
        assert_eq!(
            c("first_stage_model.encoder.conv_in.weight", &[]),
            p("vae", "first_stage_model.")
        );
        assert_eq!(
            c("conditioner.embedders.0.transformer.x", &[]),
            p("text_encoder", "conditioner.embedders.0.")
        );
        assert_eq!(
            c("conditioner.embedders.1.model.x", &[]),
            p("text_encoder_2", "conditioner.embedders.1.")
        );
        assert_eq!(
            c("text_encoders.t5xxl.encoder.x", &[]),
            p("t5xxl", "text_encoders.t5xxl.")
        );
        assert_eq!(c("alphas_cumprod", &[]), None);
        let user: Vec<ComponentPrefix> = vec!["lora=lora_unet_".parse().unwrap()];
        assert_eq!(c("lora_unet_down.weight", &user), p("lora", "lora_unet_"));
        let over: Vec<ComponentPrefix> = vec!["dit=model.".parse().unwrap()];
        assert_eq!(
            c("model.diffusion_model.x", &over),
            p("dit", "model."),
            "user pairs win"
        );
    }

    #[test]
    fn bad_pairs_are_refused() {
        for bad in ["noequals", "=x.", "a=", "../x=y.", "other=y.", "a/b=c."] {
            assert!(bad.parse::<ComponentPrefix>().is_err(), "{bad}");
        }
    }

    #[test]
    fn windows_device_names_are_not_component_names() {
        for bad in ["CON=model.", "nul.x=y.", "lpt1=y.", "vae.=y."] {
            let e = bad.parse::<ComponentPrefix>().unwrap_err();
            assert!(
                matches!(e, SplitError::ReservedPair { .. })
                    && e.to_string().contains("portable to Windows"),
                "{bad}: {e}"
            );
        }
        assert!("console=model.".parse::<ComponentPrefix>().is_ok());
        // From the data: `text_encoders.NAME.` names the folder.
        let mut ck = crate::format::Checkpoint {
            dir: "m".into(),
            format: crate::format::Format::Safetensors,
            layout: crate::format::Layout::Single,
            prefix: "model".into(),
            files: Vec::new(),
            tensors: Vec::new(),
            metadata: Default::default(),
            findings: Vec::new(),
        };
        for name in ["model.diffusion_model.x", "text_encoders.Con.w"] {
            ck.tensors.push(crate::format::Tensor {
                name: name.into(),
                dtype: crate::format::Dtype::U8,
                shape: vec![1],
                len: 1,
                file: 0,
                data: crate::format::DataRef::Contiguous { offset: 0 },
            });
        }
        let e = split(&ck, &[]).unwrap_err();
        assert!(
            matches!(&e, SplitError::ReservedComponent { component, tensor, .. } if component == "Con" && tensor == "text_encoders.Con.w"),
            "{e}"
        );
        let fixed: Vec<ComponentPrefix> = vec!["clip=text_encoders.Con.".parse().unwrap()];
        assert_eq!(split(&ck, &fixed).unwrap().len(), 2);
    }
}
