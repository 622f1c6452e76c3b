//! Where a load puts tensors: the [`Device`] trait, and the two devices
//! that implement it ([`cpu`], the host-memory stand-in, and [`cuda`]),
//! which run the same code in [`super::own`].
//!
//! A tensor reaches a device allocation one of two ways. Through staging:
//! each fill is read into the staging buffer and copied to the allocation
//! ([`Device::upload`]), then the allocation is hashed back
//! ([`Device::readback_hash`]). On a GPU that copy is a DMA, which costs
//! the CPU nothing, and the readback proves the bytes crossed it. Or in
//! place, where the device's memory is host memory the CPU can read into
//! ([`Device::host_memory`]: the CPU stand-in): the file is read straight
//! into the allocation and hashed there, so the stand-in does not charge a
//! copy a GPU would not make, and the hash of the file bytes is the hash
//! of the device copy, with no readback to take.
//!
//! Every allocation is fallible: under a commit budget an allocation past
//! it is a [`DeviceError::OutOfMemory`], never an abort.

mod api;
pub(crate) mod cpu;
pub mod cuda;

pub use self::api::{readback_via_staging, try_zeroed, Device, DeviceError, PARALLEL_MIN};

use crate::format::Checkpoint;

use super::{DeviceSpec, ValidateError};

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
