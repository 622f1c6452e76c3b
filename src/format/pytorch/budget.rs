//! The memory budget of one run of the pickle machine.
//!
//! Every allocation the machine makes for a value it holds is charged here
//! first, then made with `try_reserve`: growth of the stack, the marks, the
//! memo and every list, dict or tuple (charged by capacity, as the vector
//! will really grow), and the bytes of every string. A charge over the limit
//! is [`Exhausted::Budget`]; an allocation the system refuses is
//! [`Exhausted::Memory`]. Neither aborts. Charges are never refunded, so the
//! total bounds what is held at any moment. This module holds the numbers
//! and the arithmetic; [`super::pickle`] decides what to charge.

/// The budget every pickle gets whatever its length: 8 MiB.
pub const HELD_BASE: u64 = 8 << 20;
/// Budget per byte of pickle. The torch-written fixtures charge at most 20
/// bytes a byte: a tensor's ~100 bytes of opcodes build a name, a storage
/// tuple, shape and stride tuples, and about ten memo entries, which keep
/// all of them alive to the end (about 1.8 KiB). 40 is twice the worst of
/// them. A pickle of `N` opcodes appended to a list charges 70 to 120 bytes
/// a byte and is refused.
pub const HELD_PER_BYTE: u64 = 40;
/// The budget never exceeds 512 MiB, whatever the pickle's length. The
/// largest real checkpoint (about 100,000 tensors) in one `.bin` would
/// charge about 180 MiB.
pub const MAX_HELD: u64 = 512 << 20;

/// A list, dict or tuple's own allocation (Rc, RefCell, Vec header).
pub const CONTAINER: u64 = 64;
/// One memo entry: key, value and the hash table's slack.
pub const MEMO_ENTRY: u64 = 64;

/// Why a charge failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exhausted {
    /// The charge would pass the budget.
    Budget,
    /// The system refused the allocation.
    Memory,
}

/// Bytes charged, and the most that may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    pub held: u64,
    pub limit: u64,
}

impl Budget {
    pub fn new(limit: u64) -> Budget {
        Budget { held: 0, limit }
    }

    /// The budget for a pickle of `len` bytes: [`HELD_BASE`] plus
    /// [`HELD_PER_BYTE`] a byte, at most [`MAX_HELD`].
    pub fn for_len(len: usize) -> u64 {
        HELD_PER_BYTE
            .saturating_mul(len as u64)
            .saturating_add(HELD_BASE)
            .min(MAX_HELD)
    }

    /// Charges `bytes` before they are allocated.
    pub fn charge(&mut self, bytes: u64) -> Result<(), Exhausted> {
        let held = self.held.saturating_add(bytes);
        if held > self.limit {
            return Err(Exhausted::Budget);
        }
        self.held = held;
        Ok(())
    }

    /// A new vector of exactly `n` items, charged first.
    pub fn exact<T>(&mut self, n: usize) -> Result<Vec<T>, Exhausted> {
        self.charge((n as u64).saturating_mul(std::mem::size_of::<T>() as u64))?;
        let mut v = Vec::new();
        v.try_reserve_exact(n).map_err(|_| Exhausted::Memory)?;
        Ok(v)
    }

    /// Makes room for `extra` more items in `v`, doubling its capacity the
    /// way `push` would, and charges the new capacity first.
    pub fn grow<T>(&mut self, v: &mut Vec<T>, extra: usize) -> Result<(), Exhausted> {
        let need = v.len().checked_add(extra).ok_or(Exhausted::Budget)?;
        if need <= v.capacity() {
            return Ok(());
        }
        let new_cap = need.max(v.capacity().saturating_mul(2)).max(4);
        let added = (new_cap - v.capacity()) as u64;
        self.charge(added.saturating_mul(std::mem::size_of::<T>() as u64))?;
        v.try_reserve_exact(new_cap - v.len())
            .map_err(|_| Exhausted::Memory)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn growth_is_charged_by_capacity_and_refused_past_the_limit() {
        let mut b = Budget::new(1000);
        let mut v: Vec<u64> = Vec::new();
        b.grow(&mut v, 1).unwrap();
        assert_eq!((v.capacity(), b.held), (4, 32));
        v.extend([1, 2, 3, 4]);
        b.grow(&mut v, 1).unwrap();
        assert_eq!((v.capacity(), b.held), (8, 64));
        assert_eq!(b.grow(&mut v, 1000), Err(Exhausted::Budget));
        assert_eq!(b.held, 64, "a refused charge is not kept");
        assert_eq!(b.charge(936), Ok(()));
        assert_eq!(b.charge(1), Err(Exhausted::Budget));
    }

    #[test]
    fn budgets_grow_with_the_pickle_and_stop_at_the_cap() {
        assert_eq!(Budget::for_len(0), HELD_BASE);
        assert_eq!(Budget::for_len(1000), HELD_BASE + 40_000);
        assert_eq!(Budget::for_len(usize::MAX), MAX_HELD);
    }
}
