//! Scales one stream of a weight derived, kept for the other stream of the
//! same weight: a quantized weight is written as two tensors (its codes and
//! its scales), each made by its own [`super::QuantizeStream`], and both
//! need every scale. Whichever runs first derives them (reading the weight)
//! and leaves them here; the other takes them instead of reading the weight
//! again. So a weight is read once for its codes and its scales together
//! where its stripes fit the buffer, and twice (a per-tensor scale of a
//! weight larger than the buffer) at most.
//!
//! Memory: at most [`MEMO_SCALES`] scales are held in all, a few MiB; a
//! weight whose scales would pass that is simply read again.

use std::collections::HashMap;
use std::sync::Mutex;

use super::recipe::{Recipe, Scale};
use crate::format::Dtype;

/// Most scales held at once, over every weight: 4 MiB of them. A
/// per-channel weight has one per row, a block weight one per block, so a
/// real model's weights hold far fewer each.
pub const MEMO_SCALES: usize = (4 << 20) / std::mem::size_of::<Scale>();

/// Which weight, quantized how, a list of scales belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MemoKey {
    pub tensor: String,
    pub recipe: Recipe,
    pub work: Dtype,
}

/// Scales derived by one stream of a weight, waiting for the other.
#[derive(Debug, Default)]
pub struct ScaleMemo {
    held: Mutex<(usize, HashMap<MemoKey, Vec<Scale>>)>,
}

impl ScaleMemo {
    /// Keeps `scales` (every scale of the weight, in order) for the other
    /// stream of `key`, unless that would hold more than [`MEMO_SCALES`].
    pub fn put(&self, key: MemoKey, scales: Vec<Scale>) {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if held.0 + scales.len() <= MEMO_SCALES {
            held.0 += scales.len();
            if let Some(old) = held.1.insert(key, scales) {
                held.0 -= old.len();
            }
        }
    }

    /// The scales of `key`, if a stream left them, taking them out.
    pub fn take(&self, key: &MemoKey) -> Option<Vec<Scale>> {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let scales = held.1.remove(key)?;
        held.0 -= scales.len();
        Some(scales)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> MemoKey {
        MemoKey {
            tensor: name.into(),
            recipe: Recipe::PerChannel,
            work: Dtype::BF16,
        }
    }

    #[test]
    fn a_taken_list_is_gone_and_the_bound_holds() {
        let memo = ScaleMemo::default();
        let s = Scale {
            apply: 1.0,
            stored: 1.0,
        };
        memo.put(key("a"), vec![s; 3]);
        assert_eq!(memo.take(&key("a")).map(|v| v.len()), Some(3));
        assert_eq!(memo.take(&key("a")), None);
        // Past the bound: not kept (the other stream reads the weight).
        memo.put(key("big"), vec![s; MEMO_SCALES + 1]);
        assert_eq!(memo.take(&key("big")), None);
        memo.put(key("b"), vec![s; MEMO_SCALES]);
        memo.put(key("c"), vec![s; 1]);
        assert_eq!(memo.take(&key("c")), None, "the memo is full");
        assert!(memo.take(&key("b")).is_some());
    }
}
