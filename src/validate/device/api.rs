//! The interface a validation device implements ([`Device`]), its error,
//! and the helpers every device shares.

use crate::validate::report::DeviceInfo;
use crate::write::digest::Xxh3;

/// Why a device operation failed.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// `host`: the memory was host memory (commit); otherwise device memory.
    #[error("out of memory: {needed} bytes")]
    OutOfMemory { needed: u64, host: bool },
    #[error("{0}")]
    Driver(String),
}

/// A place tensors are loaded into. Allocation handles are indices.
pub trait Device {
    fn info(&self) -> DeviceInfo;
    /// Allocates the staging buffer (once).
    fn prepare(&mut self) -> Result<(), DeviceError>;
    /// The staging buffer; [`Device::prepare`] must have succeeded.
    fn staging(&mut self) -> Result<&mut [u8], DeviceError>;
    /// A device allocation of `len` (> 0) bytes.
    fn alloc(&mut self, len: u64) -> Result<usize, DeviceError>;
    /// Copies `staging[..len]` to `alloc[offset..offset + len]`.
    fn upload(&mut self, alloc: usize, offset: u64, len: usize) -> Result<(), DeviceError>;
    /// Runs `beside` over `staging[..len]` and uploads those bytes to
    /// `alloc[offset..]` when `alloc` is given: by default one after the
    /// other; the CPU stand-in (when it goes through staging, as a test
    /// wrapper makes it) does both at once on two threads.
    fn upload_beside(
        &mut self,
        alloc: Option<usize>,
        offset: u64,
        len: usize,
        beside: &mut (dyn FnMut(&[u8]) + Send),
    ) -> Result<(), DeviceError> {
        let staging = self.staging()?;
        let bytes = staging.get(..len).ok_or_else(|| {
            DeviceError::Driver(format!("{len} bytes are more than the staging buffer"))
        })?;
        beside(bytes);
        match alloc {
            Some(h) => self.upload(h, offset, len),
            None => Ok(()),
        }
    }
    /// The whole of allocation `alloc` as host memory the CPU reads into
    /// and hashes in place, where the device has such memory (the CPU
    /// stand-in); `None` (the default, and CUDA's) means the bytes go
    /// through staging. See the module doc for the two paths.
    fn host_memory(&mut self, _alloc: usize) -> Option<&mut [u8]> {
        None
    }
    /// Copies `alloc[offset..offset + len]` to `staging[..len]`.
    fn download(&mut self, alloc: usize, offset: u64, len: usize) -> Result<(), DeviceError>;
    /// The xxh3 of `alloc[..len]` as the device holds it: the readback
    /// check. By default the bytes come back through staging
    /// ([`readback_via_staging`]); a device whose memory the CPU can read
    /// (the CPU stand-in) hashes it in place.
    fn readback_hash(&mut self, alloc: usize, len: u64) -> Result<u64, DeviceError> {
        readback_via_staging(self, alloc, len)
    }
    /// The most bytes read into staging at a time, given its length: the
    /// whole buffer by default (few, large transfers suit a GPU); the CPU
    /// stand-in reads less, so the bytes stay in cache while they are
    /// hashed (and copied, on the staging path). It sizes the reads into
    /// [`Device::host_memory`] too.
    fn fill_len(&self, staging_len: usize) -> usize {
        staging_len
    }
    /// The shard is loaded: the CPU stand-in hands it on (releases its
    /// allocations, keeping them for reuse within the same peak, see
    /// [`cpu`]); a GPU keeps it, as a loader would.
    fn end_shard(&mut self);
    /// Device bytes held now.
    fn held(&self) -> u64;
    /// The device's free dedicated memory as its driver reports it now
    /// (`cuMemGetInfo`), read before each allocation; `None` (the default,
    /// and the CPU stand-in's) where a device has no such figure.
    fn free_dedicated(&mut self) -> Result<Option<u64>, DeviceError> {
        Ok(None)
    }
}

/// Bytes below which work on them is not split across threads: handing
/// it to another thread costs more than it saves.
pub const PARALLEL_MIN: usize = 64 << 10;

/// The xxh3 of `alloc[..len]`, downloaded through staging piece by piece.
pub fn readback_via_staging<D: Device + ?Sized>(
    device: &mut D,
    alloc: usize,
    len: u64,
) -> Result<u64, DeviceError> {
    let mut hash = Xxh3::new();
    let mut done = 0u64;
    while done < len {
        let cap = device.staging()?.len();
        let n = usize::try_from(len - done).unwrap_or(usize::MAX).min(cap);
        device.download(alloc, done, n)?;
        hash.update(&device.staging()?[..n]);
        done += n as u64;
    }
    Ok(hash.digest())
}

/// A zeroed buffer of `len` bytes, or `OutOfMemory` if the allocator (or
/// the commit limit) refuses it.
pub fn try_zeroed(len: usize) -> Result<Vec<u8>, DeviceError> {
    let mut v = Vec::new();
    v.try_reserve_exact(len)
        .map_err(|_| DeviceError::OutOfMemory {
            needed: len as u64,
            host: true,
        })?;
    v.resize(len, 0);
    Ok(v)
}
