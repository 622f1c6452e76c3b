//! The window pool: every buffer the executor holds comes from here, and the
//! pool refuses to hand out more than its budget in total. This is how
//! reshard's memory stays bounded whatever the model size: the bound is a
//! type, not a habit.

use std::sync::{Condvar, Mutex};

/// A budget of bytes shared by every worker (and, in `batch`, every job).
#[derive(Debug)]
pub struct WindowPool {
    budget: u64,
    state: Mutex<PoolState>,
    freed: Condvar,
}

#[derive(Debug, Default)]
struct PoolState {
    in_use: u64,
    peak: u64,
    /// The peaks of the open [`PeakMeter`]s, by id.
    meters: Vec<(u64, u64)>,
    next_meter: u64,
}

/// The most bytes handed out at once from its start on: the peak of one
/// conversion among several that share a pool one after another (a
/// pipeline's weight sets, `--split-components`' components), where
/// [`WindowPool::peak`] is the whole run's.
#[derive(Debug)]
pub struct PeakMeter<'a> {
    pool: &'a WindowPool,
    id: u64,
}

impl PeakMeter<'_> {
    pub fn peak(&self) -> u64 {
        let state = self.pool.lock();
        state
            .meters
            .iter()
            .find(|m| m.0 == self.id)
            .map_or(0, |m| m.1)
    }
}

impl Drop for PeakMeter<'_> {
    fn drop(&mut self) {
        self.pool.lock().meters.retain(|m| m.0 != self.id);
    }
}

/// A request the pool can never satisfy.
#[derive(Debug, thiserror::Error)]
#[error("a {requested}-byte buffer does not fit the {budget}-byte window; raise --window")]
pub struct WindowTooSmall {
    pub requested: u64,
    pub budget: u64,
}

impl WindowPool {
    pub fn new(budget: u64) -> WindowPool {
        WindowPool {
            budget,
            state: Mutex::new(PoolState::default()),
            freed: Condvar::new(),
        }
    }

    pub fn budget(&self) -> u64 {
        self.budget
    }

    /// The most bytes ever handed out at once.
    pub fn peak(&self) -> u64 {
        self.lock().peak
    }

    /// A meter of the peak from now on (starting at what is in use now).
    pub fn meter(&self) -> PeakMeter<'_> {
        let mut state = self.lock();
        let id = state.next_meter;
        state.next_meter += 1;
        let now = state.in_use;
        state.meters.push((id, now));
        PeakMeter { pool: self, id }
    }

    /// Bytes handed out now.
    pub fn in_use(&self) -> u64 {
        self.lock().in_use
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PoolState> {
        // A worker that panicked cannot leave the counters inconsistent:
        // they are updated in single statements.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A zeroed buffer of `len` bytes, waiting until the budget allows it.
    pub fn acquire(&self, len: usize) -> Result<WindowBuf<'_>, WindowTooSmall> {
        let mut bufs = self.acquire_many(len, 1)?;
        Ok(bufs.remove(0))
    }

    /// `count` zeroed buffers of `len` bytes each, reserved at once: a worker
    /// that needs two never holds one while it waits for the other, so
    /// workers cannot deadlock on the pool.
    pub fn acquire_many(
        &self,
        len: usize,
        count: usize,
    ) -> Result<Vec<WindowBuf<'_>>, WindowTooSmall> {
        self.wait_for((len as u64).saturating_mul(count as u64))?;
        Ok((0..count)
            .map(|_| WindowBuf {
                pool: self,
                buf: vec![0u8; len],
            })
            .collect())
    }

    /// [`WindowPool::acquire_many`] and [`WindowPool::reserve`]`(extra)`
    /// at once, for the same reason: a worker never holds part of what it
    /// needs while it waits for the rest.
    pub fn acquire_and_reserve(
        &self,
        len: usize,
        count: usize,
        extra: u64,
    ) -> Result<(Vec<WindowBuf<'_>>, Reservation<'_>), WindowTooSmall> {
        let bufs = (len as u64).saturating_mul(count as u64);
        self.wait_for(bufs.saturating_add(extra))?;
        let made = (0..count)
            .map(|_| WindowBuf {
                pool: self,
                buf: vec![0u8; len],
            })
            .collect();
        Ok((
            made,
            Reservation {
                pool: self,
                len: extra,
            },
        ))
    }

    /// `len` bytes of the budget without a buffer, for memory the caller
    /// holds another way (a mapping of the output whose resident pages
    /// count in RSS), waiting until the budget allows it.
    pub fn reserve(&self, len: u64) -> Result<Reservation<'_>, WindowTooSmall> {
        self.wait_for(len)?;
        Ok(Reservation { pool: self, len })
    }

    /// Blocks until `requested` more bytes fit the budget, then counts them.
    fn wait_for(&self, requested: u64) -> Result<(), WindowTooSmall> {
        if requested > self.budget {
            return Err(WindowTooSmall {
                requested,
                budget: self.budget,
            });
        }
        let mut state = self.lock();
        while state.in_use + requested > self.budget {
            state = self
                .freed
                .wait(state)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        state.in_use += requested;
        state.peak = state.peak.max(state.in_use);
        let in_use = state.in_use;
        for m in &mut state.meters {
            m.1 = m.1.max(in_use);
        }
        Ok(())
    }

    fn release(&self, len: u64) {
        let mut state = self.lock();
        state.in_use -= len;
        drop(state);
        self.freed.notify_all();
    }
}

/// Bytes of a [`WindowPool`]'s budget held without a buffer; returned
/// when dropped.
pub struct Reservation<'a> {
    pool: &'a WindowPool,
    len: u64,
}

impl Reservation<'_> {
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        self.pool.release(self.len);
    }
}

/// A buffer on loan from a [`WindowPool`]; returned when dropped.
pub struct WindowBuf<'a> {
    pool: &'a WindowPool,
    buf: Vec<u8>,
}

impl std::ops::Deref for WindowBuf<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.buf
    }
}

impl std::ops::DerefMut for WindowBuf<'_> {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.buf
    }
}

impl Drop for WindowBuf<'_> {
    fn drop(&mut self) {
        self.pool.release(self.buf.len() as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_more_than_the_budget() {
        let pool = WindowPool::new(100);
        assert!(pool.acquire(101).is_err());
        let a = pool.acquire(60).unwrap();
        assert_eq!(pool.in_use(), 60);
        drop(a);
        assert_eq!(pool.in_use(), 0);
        assert_eq!(pool.peak(), 60);
    }

    /// `--split-components` reported each component's "buffers peaked at"
    /// as the most of the whole run so far (a 7 KiB VAE "peaked at" the
    /// UNet's 693 KiB): a meter starts at its own conversion.
    #[test]
    fn a_meter_sees_only_the_peak_from_its_start() {
        let pool = WindowPool::new(100);
        drop(pool.acquire(80).unwrap());
        let held = pool.acquire(10).unwrap();
        let meter = pool.meter();
        assert_eq!(meter.peak(), 10);
        drop(pool.acquire(30).unwrap());
        assert_eq!(meter.peak(), 40);
        assert_eq!(pool.peak(), 80);
        drop(held);
        drop(meter);
        assert!(pool.lock().meters.is_empty());
    }

    #[test]
    fn a_reservation_counts_against_the_budget() {
        let pool = WindowPool::new(100);
        let r = pool.reserve(70).unwrap();
        assert_eq!(pool.in_use(), 70);
        assert!(pool.reserve(101).is_err());
        drop(r);
        assert_eq!(pool.in_use(), 0);
    }

    #[test]
    fn buffers_and_a_reservation_are_counted_together() {
        let pool = WindowPool::new(100);
        assert!(pool.acquire_and_reserve(40, 2, 21).is_err());
        let (bufs, r) = pool.acquire_and_reserve(30, 2, 40).unwrap();
        assert_eq!(pool.in_use(), 100);
        assert_eq!(bufs.iter().map(|b| b.len()).collect::<Vec<_>>(), [30, 30]);
        drop(bufs);
        assert_eq!(pool.in_use(), 40);
        drop(r);
        assert_eq!(pool.in_use(), 0);
        assert_eq!(pool.peak(), 100);
    }

    #[test]
    fn waits_for_buffers_to_come_back() {
        let pool = std::sync::Arc::new(WindowPool::new(100));
        let held = pool.acquire(80).unwrap();
        std::thread::scope(|s| {
            let p = &pool;
            let waiter = s.spawn(move || p.acquire(50).map(|b| b.len()));
            std::thread::sleep(std::time::Duration::from_millis(20));
            drop(held);
            assert_eq!(waiter.join().unwrap().unwrap(), 50);
        });
        assert!(pool.peak() <= 100);
    }
}
