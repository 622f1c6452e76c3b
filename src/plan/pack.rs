//! Packing: cut a list of tensors, already in layer order, into shards.
//!
//! Greedy in order, so shards are contiguous runs of the layer order and a
//! loader that goes shard by shard meets layers in forward order. A numbered
//! block stays in one shard when it fits; a block larger than the limit is
//! split at tensor boundaries (so MoE experts stay in contiguous ranges); a
//! tensor larger than the limit gets a shard of its own.

use std::ops::Range;

/// One tensor as the packer sees it: its output size and its block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Item<B> {
    pub bytes: u64,
    /// Tensors with equal `Some(block)` next to each other form one unit.
    pub block: Option<B>,
    /// Must land in the same shard as the item before it (a quantized
    /// weight's scale): never split from it, whatever the limit.
    pub glued: bool,
}

/// Cuts `items` into shards of at most `limit` bytes each (except a shard
/// holding one larger tensor) and returns each shard as a range of indices.
pub fn pack<B: PartialEq>(items: &[Item<B>], limit: u64) -> Vec<Range<usize>> {
    let mut shards = Vec::new();
    let mut start = 0;
    let mut size = 0u64;
    let close = |shards: &mut Vec<Range<usize>>, start: &mut usize, end: usize, size: &mut u64| {
        if end > *start {
            shards.push(*start..end);
        }
        *start = end;
        *size = 0;
    };
    for unit in units(items) {
        let unit_bytes: u64 = items[unit.clone()].iter().map(|i| i.bytes).sum();
        if size.saturating_add(unit_bytes) <= limit {
            size += unit_bytes;
            continue;
        }
        if unit_bytes <= limit {
            close(&mut shards, &mut start, unit.start, &mut size);
            size = unit_bytes;
            continue;
        }
        // The unit alone is over the limit: split it at tensor boundaries,
        // never between glued items.
        for atom in atoms(items, unit) {
            let bytes: u64 = items[atom.clone()].iter().map(|i| i.bytes).sum();
            if size.saturating_add(bytes) <= limit {
                size += bytes;
            } else if bytes <= limit {
                close(&mut shards, &mut start, atom.start, &mut size);
                size = bytes;
            } else {
                close(&mut shards, &mut start, atom.start, &mut size);
                close(&mut shards, &mut start, atom.end, &mut size);
            }
        }
    }
    close(&mut shards, &mut start, items.len(), &mut size);
    shards
}

/// Maximal runs of items sharing one `Some(block)`, extended by the glued
/// items that follow; other items stand alone (with their glued ones).
fn units<B: PartialEq>(items: &[Item<B>]) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < items.len() {
        let mut j = i + 1;
        loop {
            let same_block =
                items[i].block.is_some() && j < items.len() && items[j].block == items[i].block;
            if same_block || (j < items.len() && items[j].glued) {
                j += 1;
            } else {
                break;
            }
        }
        out.push(i..j);
        i = j;
    }
    out
}

/// `unit` cut into runs that start at an item not glued to the one before.
fn atoms<B>(items: &[Item<B>], unit: Range<usize>) -> Vec<Range<usize>> {
    let mut out: Vec<Range<usize>> = Vec::new();
    for i in unit {
        match out.last_mut() {
            Some(last) if items[i].glued => last.end = i + 1,
            _ => out.push(i..i + 1),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn item(bytes: u64, block: Option<u32>) -> Item<u32> {
        Item {
            bytes,
            block,
            glued: false,
        }
    }

    #[test]
    fn glued_items_stay_with_the_item_before_them() {
        // A weight (5) and its scale (1) glued, in a block over the limit,
        // and a loose weight and its scale at the end.
        let mut items = vec![
            item(5, Some(0)),
            item(4, Some(0)),
            item(1, Some(0)),
            item(3, None),
            item(1, None),
        ];
        items[2].glued = true;
        items[4].glued = true;
        let shards = pack(&items, 5);
        assert_eq!(shards, vec![0..1, 1..3, 3..5]);
        // Without the glue the scale of the block would sit with the weight
        // before it only by chance, and the loose scale would be alone.
        let mut loose = items.clone();
        loose[4].glued = false;
        assert_eq!(pack(&loose, 3), vec![0..1, 1..3, 3..4, 4..5]);
        assert_eq!(pack(&items, 3), vec![0..1, 1..3, 3..5]);
    }

    #[test]
    fn keeps_blocks_whole_when_they_fit() {
        // emb 4 | block0: 3+3 | block1: 3+3 | norm 1, limit 10
        let items = [
            item(4, None),
            item(3, Some(0)),
            item(3, Some(0)),
            item(3, Some(1)),
            item(3, Some(1)),
            item(1, None),
        ];
        assert_eq!(pack(&items, 10), vec![0..3, 3..6]);
    }

    #[test]
    fn splits_a_block_larger_than_the_limit_at_tensor_boundaries() {
        let items = [
            item(4, Some(0)),
            item(4, Some(0)),
            item(4, Some(0)),
            item(1, None),
        ];
        assert_eq!(pack(&items, 9), vec![0..2, 2..4]);
    }

    #[test]
    fn an_oversized_tensor_gets_its_own_shard() {
        let items = [item(2, None), item(20, None), item(2, None)];
        assert_eq!(pack(&items, 10), vec![0..1, 1..2, 2..3]);
    }

    #[test]
    fn empty_input_gives_no_shards() {
        assert!(pack::<u32>(&[], 10).is_empty());
    }

    fn arb_items() -> impl Strategy<Value = Vec<Item<u32>>> {
        prop::collection::vec((0u64..50, prop::option::of(0u32..6)), 0..60).prop_map(|v| {
            let mut v: Vec<_> = v.into_iter().map(|(b, k)| item(b, k)).collect();
            // Blocks come in layer order: sort by block so runs are contiguous.
            v.sort_by_key(|i| i.block.map_or(u32::MAX, |b| b));
            v
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn every_tensor_exactly_once_in_order(items in arb_items(), limit in 1u64..120) {
            let shards = pack(&items, limit);
            let mut next = 0;
            for s in &shards {
                prop_assert_eq!(s.start, next);
                prop_assert!(s.end > s.start);
                next = s.end;
            }
            prop_assert_eq!(next, items.len());
        }

        #[test]
        fn limit_respected_unless_single_oversized(items in arb_items(), limit in 1u64..120) {
            for s in pack(&items, limit) {
                let bytes: u64 = items[s.clone()].iter().map(|i| i.bytes).sum();
                prop_assert!(bytes <= limit || s.len() == 1, "{:?} holds {} > {}", s, bytes, limit);
            }
        }

        #[test]
        fn blocks_that_fit_are_not_split(items in arb_items(), limit in 1u64..120) {
            let shards = pack(&items, limit);
            for unit in units(&items) {
                let bytes: u64 = items[unit.clone()].iter().map(|i| i.bytes).sum();
                if bytes <= limit {
                    let holders = shards.iter().filter(|s| s.start < unit.end && unit.start < s.end).count();
                    prop_assert_eq!(holders, 1, "unit {:?} split", unit);
                }
            }
        }

        #[test]
        fn glued_items_never_start_a_shard(
            items in arb_items(),
            glue in prop::collection::vec(any::<bool>(), 60),
            limit in 1u64..120,
        ) {
            let mut items = items;
            for (i, g) in items.iter_mut().zip(glue).skip(1) {
                i.glued = g;
            }
            let shards = pack(&items, limit);
            let mut next = 0;
            for s in &shards {
                prop_assert_eq!(s.start, next);
                prop_assert!(!items[s.start].glued, "{:?} starts at a glued item", s);
                next = s.end;
            }
            prop_assert_eq!(next, items.len());
        }

        #[test]
        fn packing_is_deterministic(items in arb_items(), limit in 1u64..120) {
            prop_assert_eq!(pack(&items, limit), pack(&items, limit));
        }
    }
}
