//! The CPU device: host memory standing in for device memory, through the
//! same [`Device`] code a GPU takes.
//!
//! Its "device memory" is host memory, so it offers it
//! ([`Device::host_memory`]): the load reads the file straight into each
//! allocation and hashes it there, as a GPU's DMA from staging costs the CPU
//! nothing (see [`super`]). The staging buffer is still allocated, as a GPU
//! run commits it; it carries the bytes outside tensors that the shard
//! digest needs. The staging methods ([`Device::upload`],
//! [`Device::upload_beside`], [`Device::readback_hash`]) still work, for
//! wrappers that hide the host memory (the tests of the staging path).
//!
//! Unlike a GPU it releases each shard's allocations when the shard is done
//! (it stands in for a loader that hands the shard on), so its own commit
//! peak is the staging buffer plus the largest shard. `--vram-budget` still
//! counts device bytes cumulatively, as a GPU would hold them.
//!
//! Released allocations are kept as spares, as a caching allocator keeps
//! them, and a later allocation of exactly the same length takes one (the
//! layers of a checkpoint repeat their shapes), so the next shard does not
//! fault in fresh pages for every byte. Spares never raise the peak: before
//! new memory is mapped, spares are returned to the system until what is
//! held plus what is spare plus the new allocation fits in the most this
//! device ever had committed, or none are left; so the commit is never more
//! than the largest shard, as without spares. A reused allocation holds the
//! previous shard's bytes until the load overwrites them; the hash is taken
//! of what the allocation holds after the read into it (or, through
//! staging, by the readback), so bytes left from the last shard are never
//! taken for this one's.
//!
//! Staging and "device" allocations are [`PrivateMemory`] (private
//! anonymous mappings, `VirtualAlloc` on Windows), not `malloc`: they are
//! committed when made and returned to the system exactly when dropped, so
//! the measured peak does not depend on the allocator's heuristics (glibc
//! keeps freed blocks below its adaptive mmap threshold in its heap). Every
//! allocation is fallible, so under a commit limit one past the budget is an
//! error value, not an abort.

use crate::write::digest::xxh3_64;

use crate::platform::PrivateMemory;

use super::{Device, DeviceError, PARALLEL_MIN};
use crate::validate::report::DeviceInfo;

/// Bytes read at a time (into the allocation in place, or into staging):
/// few enough reads that the two hashing threads meet (`rayon::join`) a
/// few hundred times a GB, not thousands (at 1 MiB the wake-ups cost about
/// a tenth of the run), and small enough that the bytes are still in cache
/// when both hashes read them.
const FILL_LEN: usize = 4 << 20;

pub struct CpuDevice {
    staging_len: usize,
    staging: Option<PrivateMemory>,
    allocs: Vec<PrivateMemory>,
    /// Released allocations, kept for reuse (see the module doc).
    spare: Vec<PrivateMemory>,
    held: u64,
    spare_bytes: u64,
    /// The most `held + spare_bytes` has been.
    most_committed: u64,
}

impl CpuDevice {
    pub fn new(staging_len: usize) -> CpuDevice {
        CpuDevice {
            staging_len,
            staging: None,
            allocs: Vec::new(),
            spare: Vec::new(),
            held: 0,
            spare_bytes: 0,
            most_committed: 0,
        }
    }

    /// An allocation of exactly `len` (> 0) bytes: a spare of that length,
    /// or new memory after returning spares as the module doc says.
    fn take(&mut self, len: usize) -> Result<PrivateMemory, DeviceError> {
        if let Some(k) = self.spare.iter().position(|m| m.len() == len) {
            self.spare_bytes -= len as u64;
            return Ok(self.spare.swap_remove(k));
        }
        let wanted = self.held + len as u64;
        while wanted + self.spare_bytes > self.most_committed {
            let Some(m) = self.spare.pop() else { break };
            self.spare_bytes -= m.len() as u64;
        }
        let m = anon(len)?;
        self.most_committed = self.most_committed.max(wanted + self.spare_bytes);
        Ok(m)
    }
}

/// `len` (> 0) zeroed bytes of private memory, or `OutOfMemory` if the
/// system (or the commit limit) refuses them.
pub fn anon(len: usize) -> Result<PrivateMemory, DeviceError> {
    PrivateMemory::new(len).map_err(|_| DeviceError::OutOfMemory {
        needed: len as u64,
        host: true,
    })
}

impl Device for CpuDevice {
    fn info(&self) -> DeviceInfo {
        DeviceInfo {
            device: "cpu".into(),
            name: "host memory (CPU stand-in for a device)".into(),
            total_memory: None,
            pinned_staging: false,
        }
    }

    fn prepare(&mut self) -> Result<(), DeviceError> {
        if self.staging.is_none() {
            self.staging = Some(anon(self.staging_len.max(1))?);
        }
        Ok(())
    }

    fn staging(&mut self) -> Result<&mut [u8], DeviceError> {
        self.staging
            .as_deref_mut()
            .ok_or_else(|| DeviceError::Driver("staging buffer not allocated".into()))
    }

    fn alloc(&mut self, len: u64) -> Result<usize, DeviceError> {
        let oom = || DeviceError::OutOfMemory {
            needed: len,
            host: true,
        };
        let len = usize::try_from(len).map_err(|_| oom())?;
        // The handle table grows first, so its growth cannot fail later.
        self.allocs.try_reserve(1).map_err(|_| oom())?;
        let memory = self.take(len.max(1))?;
        self.held += memory.len() as u64;
        self.allocs.push(memory);
        Ok(self.allocs.len() - 1)
    }

    fn upload(&mut self, alloc: usize, offset: u64, len: usize) -> Result<(), DeviceError> {
        let (Some(staging), Some(dst)) = (self.staging.as_deref(), self.allocs.get_mut(alloc))
        else {
            return Err(DeviceError::Driver(format!("no allocation {alloc}")));
        };
        let dst = usize::try_from(offset)
            .ok()
            .and_then(|o| dst.get_mut(o..o.checked_add(len)?))
            .ok_or_else(|| {
                DeviceError::Driver(format!("upload past the end of allocation {alloc}"))
            })?;
        dst.copy_from_slice(&staging[..len]);
        Ok(())
    }

    fn upload_beside(
        &mut self,
        alloc: Option<usize>,
        offset: u64,
        len: usize,
        beside: &mut (dyn FnMut(&[u8]) + Send),
    ) -> Result<(), DeviceError> {
        let staging = self
            .staging
            .as_deref()
            .ok_or_else(|| DeviceError::Driver("staging buffer not allocated".into()))?;
        let src = staging.get(..len).ok_or_else(|| {
            DeviceError::Driver(format!("{len} bytes are more than the staging buffer"))
        })?;
        let Some(alloc) = alloc else {
            beside(src);
            return Ok(());
        };
        let dst = self
            .allocs
            .get_mut(alloc)
            .and_then(|a| {
                let o = usize::try_from(offset).ok()?;
                a.get_mut(o..o.checked_add(len)?)
            })
            .ok_or_else(|| {
                DeviceError::Driver(format!("upload past the end of allocation {alloc}"))
            })?;
        if len >= PARALLEL_MIN {
            rayon::join(|| beside(src), || dst.copy_from_slice(src));
        } else {
            beside(src);
            dst.copy_from_slice(src);
        }
        Ok(())
    }

    fn host_memory(&mut self, alloc: usize) -> Option<&mut [u8]> {
        self.allocs.get_mut(alloc).map(|m| &mut m[..])
    }

    fn download(&mut self, alloc: usize, offset: u64, len: usize) -> Result<(), DeviceError> {
        let (Some(staging), Some(src)) = (self.staging.as_deref_mut(), self.allocs.get(alloc))
        else {
            return Err(DeviceError::Driver(format!("no allocation {alloc}")));
        };
        let src = usize::try_from(offset)
            .ok()
            .and_then(|o| src.get(o..o.checked_add(len)?))
            .ok_or_else(|| {
                DeviceError::Driver(format!("download past the end of allocation {alloc}"))
            })?;
        staging[..len].copy_from_slice(src);
        Ok(())
    }

    fn readback_hash(&mut self, alloc: usize, len: u64) -> Result<u64, DeviceError> {
        let bytes = self
            .allocs
            .get(alloc)
            .and_then(|a| a.get(..usize::try_from(len).ok()?))
            .ok_or_else(|| {
                DeviceError::Driver(format!("readback past the end of allocation {alloc}"))
            })?;
        Ok(xxh3_64(bytes))
    }

    fn fill_len(&self, staging_len: usize) -> usize {
        staging_len.min(FILL_LEN)
    }

    fn end_shard(&mut self) {
        // The spare list grows first, so keeping the memory cannot fail;
        // if it cannot grow, the memory goes back to the system.
        if self.spare.try_reserve(self.allocs.len()).is_ok() {
            self.spare_bytes += self.held;
            self.spare.append(&mut self.allocs);
        }
        self.allocs = Vec::new();
        self.held = 0;
    }

    fn held(&self) -> u64 {
        self.held
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uploads_and_reads_back_through_staging() {
        let mut d = CpuDevice::new(4);
        d.prepare().unwrap();
        let h = d.alloc(6).unwrap();
        d.staging().unwrap().copy_from_slice(b"abcd");
        d.upload(h, 0, 4).unwrap();
        d.staging().unwrap()[..2].copy_from_slice(b"ef");
        d.upload(h, 4, 2).unwrap();
        assert!(d.upload(h, 7, 1).is_err());
        d.download(h, 2, 4).unwrap();
        assert_eq!(d.staging().unwrap(), b"cdef");
        assert_eq!(d.held(), 6);
        d.end_shard();
        assert_eq!(d.held(), 0);
    }

    #[test]
    fn readback_hashes_the_device_copy_not_staging() {
        let mut d = CpuDevice::new(4);
        d.prepare().unwrap();
        let h = d.alloc(6).unwrap();
        d.staging().unwrap().copy_from_slice(b"abcd");
        d.upload(h, 0, 4).unwrap();
        d.staging().unwrap()[..2].copy_from_slice(b"ef");
        d.upload(h, 4, 2).unwrap();
        // Staging now holds other bytes: the readback must not look there.
        d.staging().unwrap().copy_from_slice(b"zzzz");
        let in_place = d.readback_hash(h, 6).unwrap();
        assert_eq!(in_place, xxh3_64(b"abcdef"));
        // The same figure as the default, through staging (two pieces).
        assert_eq!(
            super::super::readback_via_staging(&mut d, h, 6).unwrap(),
            in_place
        );
        assert!(d.readback_hash(h, 7).is_err());
        assert!(d.readback_hash(h + 1, 1).is_err());
    }

    #[test]
    fn upload_beside_copies_the_bytes_it_shows_beside() {
        let len = 3 * PARALLEL_MIN;
        let mut d = CpuDevice::new(len);
        d.prepare().unwrap();
        let h = d.alloc(len as u64 + 10).unwrap();
        for (i, b) in d.staging().unwrap().iter_mut().enumerate() {
            *b = (i * 7 % 251) as u8;
        }
        let expected = xxh3_64(&d.staging().unwrap()[..len]);
        let mut seen = 0;
        let mut beside = |b: &[u8]| seen = xxh3_64(b);
        d.upload_beside(Some(h), 10, len, &mut beside).unwrap();
        assert_eq!(seen, expected);
        d.download(h, 10, len).unwrap();
        assert_eq!(xxh3_64(d.staging().unwrap()), expected);
        // Without an allocation only `beside` runs; past the end is an error.
        let mut calls = 0;
        d.upload_beside(None, 0, 8, &mut |_: &[u8]| calls += 1)
            .unwrap();
        assert_eq!(calls, 1);
        assert!(d
            .upload_beside(Some(h), 11, len, &mut |_: &[u8]| {})
            .is_err());
        assert!(d
            .upload_beside(Some(h), 0, len + 1, &mut |_: &[u8]| {})
            .is_err());
    }

    #[test]
    fn host_memory_is_the_allocation_itself() {
        let mut d = CpuDevice::new(4);
        d.prepare().unwrap();
        let h = d.alloc(6).unwrap();
        let memory = d.host_memory(h).unwrap();
        assert_eq!(memory.len(), 6);
        memory.copy_from_slice(b"abcdef");
        // What was written there is what the device holds: the readback
        // and a download see it, and staging is untouched.
        assert_eq!(d.readback_hash(h, 6).unwrap(), xxh3_64(b"abcdef"));
        d.download(h, 2, 4).unwrap();
        assert_eq!(d.staging().unwrap(), b"cdef");
        assert_eq!(d.held(), 6);
        assert!(d.host_memory(h + 1).is_none());
        // Released, the handle names nothing; reused, the same memory.
        d.end_shard();
        assert!(d.host_memory(h).is_none());
        let h = d.alloc(6).unwrap();
        assert_eq!(&d.host_memory(h).unwrap()[..], b"abcdef");
    }

    #[test]
    fn a_released_allocation_of_the_same_length_is_reused() {
        let mut d = CpuDevice::new(4);
        d.prepare().unwrap();
        let h = d.alloc(4).unwrap();
        d.staging().unwrap().copy_from_slice(b"wxyz");
        d.upload(h, 0, 4).unwrap();
        d.end_shard();
        assert_eq!(d.held(), 0);
        // The next shard's allocation of that length is the same memory:
        // it still holds the last shard's bytes (so the readback of a
        // missed upload would not match the file).
        let h = d.alloc(4).unwrap();
        assert_eq!(d.readback_hash(h, 4).unwrap(), xxh3_64(b"wxyz"));
        // Another length is fresh, zeroed memory.
        let g = d.alloc(3).unwrap();
        assert_eq!(d.readback_hash(g, 3).unwrap(), xxh3_64(&[0, 0, 0]));
    }

    #[test]
    fn spares_never_commit_more_than_the_largest_shard() {
        let shards: [&[u64]; 5] = [
            &[100, 100],
            &[60, 60, 60],
            &[100, 30, 100],
            &[10],
            &[300, 100],
        ];
        let mut d = CpuDevice::new(4);
        let mut largest = 0u64;
        for lens in shards {
            largest = largest.max(lens.iter().sum());
            for &len in lens {
                d.alloc(len).unwrap();
                let committed = d.held + d.spare_bytes;
                let sum: u64 = d
                    .allocs
                    .iter()
                    .chain(&d.spare)
                    .map(|m| m.len() as u64)
                    .sum();
                assert_eq!(committed, sum, "the books match the memory");
                assert!(committed <= largest, "{committed} > {largest} at {lens:?}");
            }
            d.end_shard();
        }
        assert_eq!(d.most_committed, 400);
    }

    #[test]
    fn an_impossible_allocation_is_an_error_value() {
        let mut d = CpuDevice::new(4);
        assert!(matches!(
            d.alloc(u64::MAX / 2),
            Err(DeviceError::OutOfMemory { host: true, .. })
        ));
    }
}
