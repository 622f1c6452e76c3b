//! Lists of a manifest that deserialize with a length cap, so a planted or
//! corrupt `reshard.json` of many tiny entries (16M one-letter file names
//! in 64 MB) is refused after the cap instead of becoming gigabytes of
//! small strings. The caps are what real outputs can hold: reshard never
//! writes more tensors than [`MAX_TENSORS`] nor mirrors more files than
//! [`MAX_FILES`].

use std::marker::PhantomData;

use serde::de::{Deserialize, Deserializer, Error, SeqAccess, Visitor};

use crate::format::MAX_TENSORS;

/// Most files convert mirrors beside the shards (its walk stops there).
pub const MAX_FILES: usize = 100_000;

/// A list of at most [`MAX_FILES`] entries (copied files and their
/// records).
pub fn files<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Vec<T>, D::Error> {
    capped(d, MAX_FILES)
}

/// A list of at most [`MAX_TENSORS`] entries (shards, tensors, drops and
/// planned names).
pub fn tensors<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Vec<T>, D::Error> {
    capped(d, MAX_TENSORS)
}

fn capped<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
    max: usize,
) -> Result<Vec<T>, D::Error> {
    struct Capped<T>(usize, PhantomData<T>);
    impl<'de, T: Deserialize<'de>> Visitor<'de> for Capped<T> {
        type Value = Vec<T>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            write!(f, "a list of at most {} entries", self.0)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
            let mut out = Vec::new();
            while let Some(item) = seq.next_element()? {
                if out.len() == self.0 {
                    return Err(A::Error::custom(format!(
                        "more than {} entries, more than reshard ever writes",
                        self.0
                    )));
                }
                out.push(item);
            }
            Ok(out)
        }
    }
    d.deserialize_seq(Capped(max, PhantomData))
}

#[cfg(test)]
mod tests {
    #[derive(serde::Deserialize)]
    struct Lists {
        #[serde(deserialize_with = "super::files")]
        names: Vec<String>,
    }

    #[test]
    fn a_list_past_its_cap_is_refused_and_one_at_it_read() {
        let at = format!(
            "{{\"names\": [{}]}}",
            vec!["\"a\""; super::MAX_FILES].join(",")
        );
        assert_eq!(
            serde_json::from_str::<Lists>(&at).unwrap().names.len(),
            super::MAX_FILES
        );
        let past = format!(
            "{{\"names\": [{}]}}",
            vec!["\"a\""; super::MAX_FILES + 1].join(",")
        );
        let err = serde_json::from_str::<Lists>(&past)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("more than 100000 entries"), "{err}");
    }
}
