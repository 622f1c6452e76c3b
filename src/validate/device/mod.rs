//! Where a load puts tensors: the [`Device`] trait, and the two devices
//! that implement it ([`cpu`], the host-memory stand-in, and [`cuda`]),
//! which run the same code path in [`super::own`].
//!
//! Every allocation is fallible: under a commit budget an allocation past
//! it is a [`DeviceError::OutOfMemory`], never an abort.

pub mod cpu;
pub mod cuda;

use crate::format::Checkpoint;

use super::report::DeviceInfo;
use super::{DeviceSpec, ValidateError};

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
    /// Copies `alloc[offset..offset + len]` to `staging[..len]`.
    fn download(&mut self, alloc: usize, offset: u64, len: usize) -> Result<(), DeviceError>;
    /// The shard is loaded: the CPU stand-in hands it on (frees it); a GPU
    /// keeps it, as a loader would.
    fn end_shard(&mut self);
    /// Device bytes held now.
    fn held(&self) -> u64;
}

/// The staging buffer for a checkpoint: `requested`, but no larger than
/// the largest tensor (rounded up to 4 KiB), and at least 4 KiB.
pub fn staging_len(requested: u64, ck: &Checkpoint) -> usize {
    let largest = ck.tensors.iter().map(|t| t.len).max().unwrap_or(0);
    let len = requested.min(largest.next_multiple_of(4096)).max(4096);
    usize::try_from(len).unwrap_or(usize::MAX)
}

/// Opens the device `spec` names, with a staging buffer of `staging_len`
/// bytes (see [`staging_len`]).
pub fn open(spec: DeviceSpec, staging_len: usize) -> Result<Box<dyn Device>, ValidateError> {
    Ok(match spec {
        DeviceSpec::Cpu => Box::new(cpu::CpuDevice::new(staging_len)),
        DeviceSpec::Cuda(ordinal) => Box::new(cuda::CudaDevice::open(ordinal, staging_len)?),
    })
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
