//! `--part I/N`: a deterministic share of the models, so N machines (a Slurm
//! job array, a Kubernetes Indexed Job, GNU parallel) can each take one part
//! of the same folder without talking to each other.
//!
//! A model belongs to part `xxh3_64(name) % N`, where `name` is its path under
//! OUT written with `/` separators. The hash is fixed (not Rust's randomised
//! `HashMap` hasher), so every machine that lists the folder agrees, and a
//! model's part does not depend on which other models exist.

use std::fmt;
use std::str::FromStr;

use serde::{Serialize, Serializer};

/// One part of N: `index` is 0-based, `index < count`. Serialized as `"I/N"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Part {
    pub index: u64,
    pub count: u64,
}

impl Part {
    /// The whole list: part 0 of 1.
    pub const ALL: Part = Part { index: 0, count: 1 };

    /// Whether the model named `name` belongs to this part.
    pub fn contains(&self, name: &str) -> bool {
        part_of(name, self.count) == self.index
    }
}

/// The part (0-based, `< count`) of the model named `name`.
pub fn part_of(name: &str, count: u64) -> u64 {
    xxhash_rust::xxh3::xxh3_64(name.as_bytes()) % count.max(1)
}

impl Serialize for Part {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
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
