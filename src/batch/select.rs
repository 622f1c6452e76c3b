//! Which models of a folder one `batch` run takes: discovery, the
//! deterministic `--part I/N` split (by bytes or by name), what `--dry-run`
//! lists and what `--plan-parts` shows. Plain data; the CLI renders it.

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Serialize;

use super::discover::{discover, DiscoverError, Discovery, Model, Skipped};
use super::part::{assign, plan, source_bytes, Balance, ModelSize, Part, PartPlan};

/// The models found under a root and the part each one falls in.
pub struct Selection {
    /// When discovery began: a batch report's seconds count from here.
    pub started: Instant,
    pub root: PathBuf,
    pub out: PathBuf,
    pub found: Discovery,
    pub part: Part,
    pub balance: Balance,
    /// For each of `found.models`: its part and the bytes it was weighed by
    /// (0 when the split did not need sizes).
    pub placed: Vec<(u64, u64)>,
}

impl Selection {
    /// Discovers the models under `root` for outputs under `out` and places
    /// each in its part. Sizes are measured (a stat per file) when
    /// `measure_all` or when the split needs them.
    pub fn new(
        root: &Path,
        out: &Path,
        part: Part,
        balance: Balance,
        measure_all: bool,
    ) -> Result<Selection, DiscoverError> {
        let started = Instant::now();
        let found = discover(root, out)?;
        let bytes = if measure_all || (balance == Balance::Bytes && part.count > 1) {
            measure(&found.models)
        } else {
            vec![0; found.models.len()]
        };
        let placed = assign(&sized(&found.models, &bytes), part.count, balance)
            .into_iter()
            .zip(bytes)
            .collect();
        Ok(Selection {
            started,
            root: root.to_path_buf(),
            out: out.to_path_buf(),
            found,
            part,
            balance,
            placed,
        })
    }

    /// This part's models, with the bytes each was weighed by.
    pub fn mine(&self) -> Vec<(&Model, u64)> {
        self.found
            .models
            .iter()
            .zip(&self.placed)
            .filter(|(_, &(p, _))| p == self.part.index)
            .map(|(m, &(_, bytes))| (m, bytes))
            .collect()
    }

    /// The entries discovery skipped that fall in this part (by name, in
    /// both splits: they do no work).
    pub fn skipped(&self) -> Vec<&Skipped> {
        self.found
            .skipped
            .iter()
            .filter(|s| self.part.contains(&s.name))
            .collect()
    }

    /// What `--dry-run` lists.
    pub fn listing(&self) -> Listing<'_> {
        Listing {
            root: self.root.display().to_string(),
            out: self.out.display().to_string(),
            part: self.part,
            balance: self.balance,
            models: self
                .mine()
                .into_iter()
                .map(|(model, bytes)| ListedModel {
                    model,
                    part: self.part.index,
                    bytes,
                })
                .collect(),
            skipped: self.skipped(),
        }
    }
}

/// What `batch --dry-run` lists.
#[derive(Serialize)]
pub struct Listing<'a> {
    pub root: String,
    pub out: String,
    pub part: Part,
    pub balance: Balance,
    pub models: Vec<ListedModel<'a>>,
    pub skipped: Vec<&'a Skipped>,
}

/// One model of a [`Listing`].
#[derive(Serialize)]
pub struct ListedModel<'a> {
    #[serde(flatten)]
    pub model: &'a Model,
    pub part: u64,
    /// What --balance bytes weighs it by (`source_bytes`).
    pub bytes: u64,
}

/// What `batch --plan-parts N` shows: the split of every model found.
#[derive(Serialize)]
pub struct Planned {
    pub root: String,
    pub out: String,
    #[serde(flatten)]
    pub plan: PartPlan,
}

/// The split of `models` into `count` parts under `balance`, with sizes.
pub fn plan_parts(
    root: &Path,
    out: &Path,
    models: &[Model],
    count: u64,
    balance: Balance,
) -> Planned {
    let bytes = measure(models);
    Planned {
        root: root.display().to_string(),
        out: out.display().to_string(),
        plan: plan(&sized(models, &bytes), count, balance),
    }
}

/// Each model's [`source_bytes`], in order.
fn measure(models: &[Model]) -> Vec<u64> {
    models.iter().map(|m| source_bytes(&m.source)).collect()
}

fn sized<'a>(models: &'a [Model], bytes: &[u64]) -> Vec<ModelSize<'a>> {
    models
        .iter()
        .zip(bytes)
        .map(|(m, &bytes)| ModelSize {
            name: &m.name,
            bytes,
        })
        .collect()
}
