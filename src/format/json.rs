//! Helpers for the one-pass JSON readers of the safetensors header and the
//! index: visitors that skip a value without building it, a place to keep
//! the precise error that stopped a parse, and short excerpts of JSON text
//! for messages. Nothing here reads files.

use std::cell::RefCell;

use serde::de::{Deserialize, Deserializer, SeqAccess, Visitor};

use super::FormatError;

/// The [`FormatError`] that stopped a serde parse. A visitor that finds one
/// stores it here and returns a placeholder serde error; the caller reports
/// the stored error instead of serde's.
#[derive(Debug, Default)]
pub struct Failure(RefCell<Option<FormatError>>);

impl Failure {
    /// Keeps `e` and returns the placeholder error that stops the parse.
    pub fn fail<E: serde::de::Error>(&self, e: FormatError) -> E {
        *self.0.borrow_mut() = Some(e);
        E::custom("refused")
    }

    /// The stored error, if a visitor stopped the parse.
    pub fn take(&self) -> Option<FormatError> {
        self.0.borrow_mut().take()
    }
}

/// JSON text for a message: at most 64 characters of it.
pub fn excerpt(raw: &str) -> String {
    match raw.char_indices().nth(64) {
        Some((at, _)) => format!("{}...", &raw[..at]),
        None => raw.to_string(),
    }
}

/// Visitor methods for every JSON scalar (bool, number, string, null): each
/// returns `$value`. [`skip_seq!`] and [`skip_map!`] do the same for an
/// array or an object, consuming it without keeping anything.
macro_rules! skip_scalars {
    ($value:expr) => {
        fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
            Ok($value)
        }
        fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
            Ok($value)
        }
        fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
            Ok($value)
        }
        fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
            Ok($value)
        }
        fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
            Ok($value)
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok($value)
        }
    };
}

macro_rules! skip_seq {
    ($value:expr) => {
        fn visit_seq<A: serde::de::SeqAccess<'de>>(
            self,
            mut seq: A,
        ) -> Result<Self::Value, A::Error> {
            while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
            Ok($value)
        }
    };
}

macro_rules! skip_map {
    ($value:expr) => {
        fn visit_map<A: serde::de::MapAccess<'de>>(
            self,
            mut map: A,
        ) -> Result<Self::Value, A::Error> {
            while map
                .next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?
                .is_some()
            {}
            Ok($value)
        }
    };
}

pub(crate) use {skip_map, skip_scalars, skip_seq};

/// A JSON list of non-negative integers (a shape) read with a bound: its
/// values if it has at most `max`, else only how many it has, counted
/// without being kept; anything else is `Bad`.
#[derive(Debug, PartialEq, Eq)]
pub enum Ints {
    Values(Vec<u64>),
    TooMany(u64),
    Bad,
}

impl Ints {
    /// Parses `raw` JSON text; anything but a list of non-negative integers
    /// is [`Ints::Bad`].
    pub fn parse(raw: &str, max: usize) -> Ints {
        let mut de = serde_json::Deserializer::from_str(raw);
        match de.deserialize_any(IntsVisitor { max }) {
            Ok(ints) if de.end().is_ok() => ints,
            _ => Ints::Bad,
        }
    }
}

struct IntsVisitor {
    max: usize,
}

impl<'de> Visitor<'de> for IntsVisitor {
    type Value = Ints;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a list of non-negative integers")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Ints, A::Error> {
        let mut dims = Vec::new();
        let mut count = 0u64;
        let mut bad = false;
        while let Some(dim) = seq.next_element::<Dim>()? {
            count += 1;
            match dim.0 {
                Some(d) if dims.len() < self.max => dims.push(d),
                Some(_) => {}
                None => bad = true,
            }
        }
        Ok(if bad {
            Ints::Bad
        } else if count > self.max as u64 {
            Ints::TooMany(count)
        } else {
            Ints::Values(dims)
        })
    }
    skip_scalars!(Ints::Bad);
    skip_map!(Ints::Bad);
}

/// One dimension: a non-negative integer, or `None` for anything else
/// (consumed without being kept).
struct Dim(Option<u64>);

impl<'de> Deserialize<'de> for Dim {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(DimVisitor)
    }
}

struct DimVisitor;

impl<'de> Visitor<'de> for DimVisitor {
    type Value = Dim;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a non-negative integer")
    }
    fn visit_u64<E>(self, v: u64) -> Result<Dim, E> {
        Ok(Dim(Some(v)))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Dim, E> {
        Ok(Dim(u64::try_from(v).ok()))
    }
    fn visit_f64<E>(self, _: f64) -> Result<Dim, E> {
        Ok(Dim(None))
    }
    fn visit_bool<E>(self, _: bool) -> Result<Dim, E> {
        Ok(Dim(None))
    }
    fn visit_str<E>(self, _: &str) -> Result<Dim, E> {
        Ok(Dim(None))
    }
    fn visit_unit<E>(self) -> Result<Dim, E> {
        Ok(Dim(None))
    }
    skip_seq!(Dim(None));
    skip_map!(Dim(None));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ints_keep_at_most_max_values_and_count_the_rest() {
        assert_eq!(Ints::parse("[1, 2, 3]", 8), Ints::Values(vec![1, 2, 3]));
        assert_eq!(Ints::parse("[]", 8), Ints::Values(vec![]));
        let many = format!("[{}]", vec!["1"; 100_000].join(","));
        assert_eq!(Ints::parse(&many, 8), Ints::TooMany(100_000));
        for bad in [
            "[-1]", "[1.5]", "[[1]]", "[\"1\"]", "{}", "3", "null", "[1,",
        ] {
            assert_eq!(Ints::parse(bad, 8), Ints::Bad, "{bad}");
        }
    }

    #[test]
    fn excerpts_are_short() {
        assert_eq!(excerpt("[1]"), "[1]");
        let long = "x".repeat(1000);
        assert_eq!(excerpt(&long).len(), 67);
    }
}
