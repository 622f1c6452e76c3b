//! `--part I/N`: a deterministic share of the models, so N machines (a Slurm
//! job array, a Kubernetes Indexed Job, GNU parallel) can each take one part
//! of the same folder without talking to each other.
//!
//! Two ways to split ([`Balance`]):
//!
//! - `bytes` (the default): models are taken largest first (ties by name) and
//!   each goes to the part holding the fewest bytes so far (ties to the lowest
//!   part). Parts then hold about the same bytes, so they finish at about the
//!   same time. A model's part depends on the sizes and names of all models,
//!   so every machine must see the same folder contents; for the same contents
//!   the assignment is the same on every machine and every run.
//! - `name`: a model belongs to part `xxh3_64(name) % N`, where `name` is its
//!   path under OUT written with `/` separators. The hash is fixed (not Rust's
//!   randomised `HashMap` hasher), and a model's part does not depend on which
//!   other models exist, so it holds while the folder changes under a run.
//!
//! A model's size is [`source_bytes`]: what its folder holds, measured with
//! `stat` only, so planning opens no header. This module only decides; it
//! runs nothing and prints nothing.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;
use std::fmt;
use std::path::Path;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::format::discover::resolve_hf_cache;

/// One part of N: `index` is 0-based, `index < count`. Serialized as `"I/N"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Part {
    pub index: u64,
    pub count: u64,
}

impl Part {
    /// The whole list: part 0 of 1.
    pub const ALL: Part = Part { index: 0, count: 1 };

    /// Whether the model named `name` belongs to this part under
    /// [`Balance::Name`].
    pub fn contains(&self, name: &str) -> bool {
        part_of(name, self.count) == self.index
    }
}

/// The part (0-based, `< count`) of the model named `name` under
/// [`Balance::Name`].
pub fn part_of(name: &str, count: u64) -> u64 {
    crate::write::digest::xxh3_64(name.as_bytes()) % count.max(1)
}

/// How `--part I/N` splits the models.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Balance {
    /// About the same bytes in every part: largest first to the least loaded.
    #[default]
    Bytes,
    /// A fixed hash of each model's name.
    Name,
}

impl Balance {
    /// What reports written before `balance` was recorded used.
    pub fn legacy() -> Balance {
        Balance::Name
    }
}

impl fmt::Display for Balance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Balance::Bytes => "bytes",
            Balance::Name => "name",
        })
    }
}

/// A model to place: its name and its size in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelSize<'a> {
    pub name: &'a str,
    pub bytes: u64,
}

/// The part (0-based, `< count`) of each of `models`, in their order.
///
/// Deterministic: the result depends only on the names and sizes, not on the
/// order of `models`. Memory is O(len + min(count, len)), whatever `count`.
pub fn assign(models: &[ModelSize], count: u64, balance: Balance) -> Vec<u64> {
    let count = count.max(1);
    match balance {
        Balance::Name => models.iter().map(|m| part_of(m.name, count)).collect(),
        Balance::Bytes => assign_by_bytes(models, count),
    }
}

fn assign_by_bytes(models: &[ModelSize], count: u64) -> Vec<u64> {
    let mut order: Vec<usize> = (0..models.len()).collect();
    order.sort_by(|&a, &b| by_size_then_name(&models[a], &models[b]).then(a.cmp(&b)));
    // With more parts than models every model lands in an empty part, in
    // this order, so parts past the number of models never need a slot.
    let slots = count.min(models.len() as u64);
    let mut loads: BinaryHeap<Reverse<(u64, u64)>> = (0..slots).map(|p| Reverse((0, p))).collect();
    let mut parts = vec![0; models.len()];
    for i in order {
        let Some(Reverse((load, part))) = loads.pop() else {
            break;
        };
        parts[i] = part;
        loads.push(Reverse((load.saturating_add(models[i].bytes), part)));
    }
    parts
}

/// Largest first; equal sizes by name.
fn by_size_then_name(a: &ModelSize, b: &ModelSize) -> Ordering {
    b.bytes.cmp(&a.bytes).then_with(|| a.name.cmp(b.name))
}

/// A model's size for balancing: the bytes of the regular files directly in
/// its folder (for a Hugging Face cache repo, in the snapshot `refs/main`
/// names, through its blob links); for a GGUF file its size, and for a
/// gguf-split member every member's beside it. Only `stat` is used; what cannot be read
/// counts 0, so a broken model still gets a part and fails when it runs.
pub fn source_bytes(source: &Path) -> u64 {
    if let Some(m) = std::fs::metadata(source)
        .ok()
        .filter(std::fs::Metadata::is_file)
    {
        return gguf_set_bytes(source).unwrap_or(m.len());
    }
    let dir = resolve_hf_cache(source).unwrap_or_else(|_| source.to_path_buf());
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return 0;
    };
    entries
        .flatten()
        .filter_map(|e| std::fs::metadata(e.path()).ok())
        .filter(std::fs::Metadata::is_file)
        .fold(0u64, |sum, m| sum.saturating_add(m.len()))
}

/// A gguf-split member's whole set: the sizes of the members beside it
/// (`None` for any other file).
fn gguf_set_bytes(file: &Path) -> Option<u64> {
    let prefix = |p: &Path| {
        let name = p.file_name()?.to_str()?;
        super::discover::split_member(name).map(|(prefix, _)| prefix.to_string())
    };
    let want = prefix(file)?;
    let dir = file.parent()?;
    let total = std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .filter(|e| prefix(&e.path()).as_deref() == Some(want.as_str()))
        .filter_map(|e| std::fs::metadata(e.path()).ok())
        .filter(std::fs::Metadata::is_file)
        .fold(0u64, |sum, m| sum.saturating_add(m.len()));
    Some(total)
}

/// The assignment of a whole folder: what `batch --plan-parts N` prints.
#[derive(Debug, Clone, Serialize)]
pub struct PartPlan {
    pub balance: Balance,
    /// N.
    pub count: u64,
    pub total_bytes: u64,
    /// `total_bytes / count`.
    pub average_bytes: u64,
    /// The largest single model: no part can hold less than this.
    pub largest_model_bytes: u64,
    /// The most bytes any part holds.
    pub largest_part_bytes: u64,
    pub parts: Vec<PlannedPart>,
}

/// One part of a [`PartPlan`].
#[derive(Debug, Clone, Serialize)]
pub struct PlannedPart {
    pub part: Part,
    pub bytes: u64,
    /// Names, largest first (ties by name).
    pub models: Vec<PlannedModel>,
}

/// One model of a [`PlannedPart`].
#[derive(Debug, Clone, Serialize)]
pub struct PlannedModel {
    pub name: String,
    pub bytes: u64,
}

/// Plans `models` into `count` parts. `count` is what the caller will list
/// (one entry per part), so the CLI bounds it.
pub fn plan(models: &[ModelSize], count: u64, balance: Balance) -> PartPlan {
    let count = count.max(1);
    let assigned = assign(models, count, balance);
    let mut parts: Vec<PlannedPart> = (0..count)
        .map(|index| PlannedPart {
            part: Part { index, count },
            bytes: 0,
            models: Vec::new(),
        })
        .collect();
    let mut order: Vec<usize> = (0..models.len()).collect();
    order.sort_by(|&a, &b| by_size_then_name(&models[a], &models[b]));
    for i in order {
        let Some(p) = usize::try_from(assigned[i])
            .ok()
            .and_then(|p| parts.get_mut(p))
        else {
            continue;
        };
        p.bytes = p.bytes.saturating_add(models[i].bytes);
        p.models.push(PlannedModel {
            name: models[i].name.to_string(),
            bytes: models[i].bytes,
        });
    }
    let total_bytes = models.iter().fold(0u64, |s, m| s.saturating_add(m.bytes));
    PartPlan {
        balance,
        count,
        total_bytes,
        average_bytes: total_bytes / count,
        largest_model_bytes: models.iter().map(|m| m.bytes).max().unwrap_or(0),
        largest_part_bytes: parts.iter().map(|p| p.bytes).max().unwrap_or(0),
        parts,
    }
}

impl Serialize for Part {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Part {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Part, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

impl fmt::Display for Part {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

/// Why a `--part` value does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadPart {
    #[error("invalid part {0:?}: use I/N, for example 0/8 (I counts from 0)")]
    Syntax(String),
    #[error("invalid part {text:?}: I must be less than N ({index} >= {count})")]
    OutOfRange {
        text: String,
        index: u64,
        count: u64,
    },
    #[error("invalid part {0:?}: N must be at least 1")]
    ZeroParts(String),
}

impl FromStr for Part {
    type Err = BadPart;

    fn from_str(s: &str) -> Result<Part, BadPart> {
        let syntax = || BadPart::Syntax(s.to_string());
        let (i, n) = s.trim().split_once('/').ok_or_else(syntax)?;
        let index: u64 = i.trim().parse().map_err(|_| syntax())?;
        let count: u64 = n.trim().parse().map_err(|_| syntax())?;
        if count == 0 {
            return Err(BadPart::ZeroParts(s.to_string()));
        }
        if index >= count {
            return Err(BadPart::OutOfRange {
                text: s.to_string(),
                index,
                count,
            });
        }
        Ok(Part { index, count })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sized(v: &[(String, u64)]) -> Vec<ModelSize<'_>> {
        v.iter()
            .map(|(name, bytes)| ModelSize {
                name,
                bytes: *bytes,
            })
            .collect()
    }

    /// Bytes per part of an assignment.
    fn loads(models: &[ModelSize], parts: &[u64], count: u64) -> Vec<u64> {
        let mut l = vec![0u64; count as usize];
        for (m, &p) in models.iter().zip(parts) {
            l[p as usize] += m.bytes;
        }
        l
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn bytes_assignment_is_a_deterministic_partition(
            sizes in proptest::collection::vec(0u64..1_000_000, 0..60),
            count in 1u64..12,
            rotate in 0usize..60,
        ) {
            let named: Vec<(String, u64)> =
                sizes.iter().enumerate().map(|(i, &b)| (format!("m{i}"), b)).collect();
            let models = sized(&named);
            let parts = assign(&models, count, Balance::Bytes);
            prop_assert_eq!(parts.len(), models.len());
            prop_assert!(parts.iter().all(|&p| p < count), "{:?}", parts);
            // The same contents listed in another order give the same parts.
            let mut shuffled = named.clone();
            if !shuffled.is_empty() {
                let k = rotate % shuffled.len();
                shuffled.rotate_left(k);
                shuffled.reverse();
            }
            let again = assign(&sized(&shuffled), count, Balance::Bytes);
            let by_name: std::collections::BTreeMap<&str, u64> =
                shuffled.iter().map(|(n, _)| n.as_str()).zip(again).collect();
            for (m, p) in models.iter().zip(&parts) {
                prop_assert_eq!(by_name[m.name], *p, "{} moved", m.name);
            }
            // Each part's plan lists exactly its models, once.
            let plan = plan(&models, count, Balance::Bytes);
            let listed: usize = plan.parts.iter().map(|p| p.models.len()).sum();
            prop_assert_eq!(listed, models.len());
            prop_assert_eq!(plan.total_bytes, sizes.iter().sum::<u64>());
            let l = loads(&models, &parts, count);
            prop_assert_eq!(plan.parts.iter().map(|p| p.bytes).collect::<Vec<_>>(), l.clone());
            // Greedy bound: the fullest part is at most the average plus one
            // model, or one model alone.
            let max = l.iter().copied().max().unwrap_or(0);
            let largest = plan.largest_model_bytes;
            prop_assert!(max <= largest.max(plan.total_bytes / count + largest), "{:?}", l);
        }

        #[test]
        fn name_assignment_matches_the_hash(
            n in 0usize..40,
            count in 1u64..9,
        ) {
            let named: Vec<(String, u64)> = (0..n).map(|i| (format!("x/{i}"), i as u64)).collect();
            let models = sized(&named);
            let parts = assign(&models, count, Balance::Name);
            for (m, p) in models.iter().zip(parts) {
                prop_assert_eq!(p, part_of(m.name, count));
                let part = Part { index: p, count };
                prop_assert!(part.contains(m.name));
            }
        }
    }

    #[test]
    fn one_model_twenty_times_the_others_stays_within_a_quarter_of_average() {
        // The criterion: on mixed sizes with one model 20x the
        // others, the fullest part holds at most 1.25x the average part, or
        // the single largest model when that alone is more.
        let mut worst: f64 = 0.0;
        for count in 2u64..=8 {
            for small in [11usize, 24, 50, 100, 300] {
                // "Mixed": 1 to 3 MB, in a fixed pseudo-random pattern.
                let mut named: Vec<(String, u64)> = (0..small)
                    .map(|i| {
                        (
                            format!("org/m{i:03}"),
                            1_000_000 + (i as u64 * 7919 % 2_000_001),
                        )
                    })
                    .collect();
                let base = named.iter().map(|(_, b)| b).sum::<u64>() / small as u64;
                named.push(("org/giant".into(), 20 * base));
                let models = sized(&named);
                let plan = plan(&models, count, Balance::Bytes);
                let average = plan.total_bytes as f64 / count as f64;
                let bound = (1.25 * average).max(plan.largest_model_bytes as f64);
                assert!(
                    plan.largest_part_bytes as f64 <= bound,
                    "{count} parts, {small} small: largest part {} > {bound}",
                    plan.largest_part_bytes
                );
                if plan.largest_model_bytes as f64 <= 1.25 * average {
                    worst = worst.max(plan.largest_part_bytes as f64 / average);
                }
            }
        }
        assert!(worst > 1.0 && worst <= 1.25, "worst ratio {worst}");
    }

    #[test]
    fn the_hash_split_does_not_balance_what_bytes_does() {
        // Twelve models, two of them large: by name, one part can end up
        // with both; by bytes never.
        let named: Vec<(String, u64)> = (0..12)
            .map(|i| (format!("m{i}"), if i < 2 { 100 } else { 10 }))
            .collect();
        let models = sized(&named);
        let by_bytes = plan(&models, 2, Balance::Bytes);
        assert_eq!(
            by_bytes.parts.iter().map(|p| p.bytes).collect::<Vec<_>>(),
            [150, 150]
        );
        assert_eq!(by_bytes.parts[0].models[0].name, "m0", "largest first");
        assert_eq!(by_bytes.parts[1].models[0].name, "m1", "ties by name");
    }

    #[test]
    fn more_parts_than_models_puts_one_model_in_each_first_part() {
        let named: Vec<(String, u64)> = vec![("b".into(), 5), ("a".into(), 5), ("c".into(), 9)];
        let models = sized(&named);
        // Far more parts than could be allocated: only 3 slots are used.
        assert_eq!(assign(&models, u64::MAX, Balance::Bytes), [2, 1, 0]);
        assert_eq!(assign(&models, 1, Balance::Bytes), [0, 0, 0]);
        assert!(assign(&[], 4, Balance::Bytes).is_empty());
    }

    #[test]
    fn source_bytes_sums_the_files_of_a_model_folder() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("a.safetensors"), [0u8; 100]).unwrap();
        std::fs::write(tmp.path().join("config.json"), [0u8; 7]).unwrap();
        std::fs::create_dir(tmp.path().join("checkpoint-5")).unwrap();
        std::fs::write(tmp.path().join("checkpoint-5/b.safetensors"), [0u8; 50]).unwrap();
        assert_eq!(source_bytes(tmp.path()), 107, "subfolders are not counted");
        assert_eq!(source_bytes(&tmp.path().join("missing")), 0);
        assert_eq!(source_bytes(&tmp.path().join("config.json")), 7);
    }

    #[test]
    fn source_bytes_of_a_gguf_split_member_is_its_whole_set() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("m-00001-of-00002.gguf"), [0u8; 100]).unwrap();
        std::fs::write(tmp.path().join("m-00002-of-00002.gguf"), [0u8; 30]).unwrap();
        std::fs::write(tmp.path().join("other.gguf"), [0u8; 7]).unwrap();
        let first = tmp.path().join("m-00001-of-00002.gguf");
        assert_eq!(source_bytes(&first), 130);
        assert_eq!(source_bytes(&tmp.path().join("other.gguf")), 7);
    }

    #[test]
    fn parts_read_back_from_reports() {
        let p: Part = serde_json::from_str("\"3/8\"").unwrap();
        assert_eq!(p, Part { index: 3, count: 8 });
        assert!(serde_json::from_str::<Part>("\"8/8\"").is_err());
        assert_eq!(serde_json::to_string(&p).unwrap(), "\"3/8\"");
        assert_eq!(serde_json::to_string(&Balance::Bytes).unwrap(), "\"bytes\"");
    }

    #[test]
    fn parses_i_of_n() {
        assert_eq!("0/8".parse(), Ok(Part { index: 0, count: 8 }));
        assert_eq!(" 7 / 8 ".parse(), Ok(Part { index: 7, count: 8 }));
        assert_eq!("0/1".parse(), Ok(Part::ALL));
    }

    #[test]
    fn refuses_bad_parts() {
        assert!(matches!(
            "8/8".parse::<Part>(),
            Err(BadPart::OutOfRange { .. })
        ));
        assert!(matches!("0/0".parse::<Part>(), Err(BadPart::ZeroParts(_))));
        for bad in ["", "1", "a/2", "1/b", "-1/2", "1/2/3"] {
            assert!(
                matches!(bad.parse::<Part>(), Err(BadPart::Syntax(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn every_name_is_in_exactly_one_part() {
        let names: Vec<String> = (0..500)
            .map(|i| format!("org/model-{i}/text_encoder"))
            .collect();
        for count in [1, 2, 3, 7, 16] {
            let parts: Vec<Part> = (0..count).map(|index| Part { index, count }).collect();
            for name in &names {
                let holders = parts.iter().filter(|p| p.contains(name)).count();
                assert_eq!(holders, 1, "{name} in {holders} of {count} parts");
            }
        }
    }

    #[test]
    fn parts_are_stable_across_runs_and_machines() {
        // Fixed values: a change here would move models between parts of
        // a scale-out run already under way.
        assert_eq!(part_of("", 1), 0);
        let pinned = [
            ("meta/llama-tiny", 0),
            ("acme--tiny", 1),
            ("gpt2", 2),
            ("google/t5-tiny", 2),
        ];
        for (name, part) in pinned {
            assert_eq!(part_of(name, 3), part, "{name}");
        }
        let spread: std::collections::BTreeSet<u64> =
            (0..64).map(|i| part_of(&format!("m{i}"), 4)).collect();
        assert_eq!(spread.len(), 4, "64 names should reach all 4 parts");
    }
}
