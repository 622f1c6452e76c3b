//! The CUDA device, through cudarc's driver API loaded at run time.
//!
//! Without a driver (no libcuda), [`CudaDevice::open`] returns
//! [`ValidateError::NoCudaDriver`]; it checks for the library before cudarc
//! touches it (cudarc panics when the library is missing) and runs every
//! first driver call under `catch_unwind` as a second guard. A driver
//! older than [`MIN_DRIVER_VERSION`] is refused by name
//! ([`ValidateError::CudaDriverTooOld`]).
//!
//! Before each device allocation the driver's free dedicated memory is
//! read (`cuMemGetInfo`), so the load can report which blocks came before
//! the dedicated memory ran out and which after it (on Windows, NVIDIA's
//! System Memory Fallback then places them in shared system memory).
//!
//! The staging buffer is page-locked host memory allocated once (plain
//! host memory if pinning fails); device allocations are kept for the whole
//! load, as a loader holds a model on a GPU. Device memory is not commit on
//! Linux; pinned memory is (see docs/validate.md).

#![allow(unsafe_code)]

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use cudarc::driver::sys::CUresult;
use cudarc::driver::{result, sys};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DriverError, PinnedHostSlice};

use super::{try_zeroed, Device, DeviceError};
use crate::validate::report::DeviceInfo;
use crate::validate::ValidateError;

enum Staging {
    Pinned(PinnedHostSlice<u8>),
    Plain(Vec<u8>),
}

pub struct CudaDevice {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    staging_len: usize,
    staging: Option<Staging>,
    allocs: Vec<CudaSlice<u8>>,
    held: u64,
    info: DeviceInfo,
}

/// Whether a CUDA driver library can be loaded at all.
pub fn driver_present() -> bool {
    // SAFETY: is_culib_present only tries to dlopen the driver library under
    // its usual names and drops the handle; loading libcuda runs no code of
    // ours and has no preconditions.
    let present = catch_unwind(|| unsafe { cudarc::driver::sys::is_culib_present() });
    present.unwrap_or(false)
}

/// Dedicated memory of CUDA device `ordinal` in bytes; `None` without a
/// driver or device. Used by `fit` to detect VRAM.
pub fn dedicated_memory(ordinal: usize) -> Option<u64> {
    if !driver_present() {
        return None;
    }
    // No context: creating one costs a real driver hundreds of MB of host
    // commit and a noticeable pause, and the total needs none.
    guarded(|| {
        result::init().map_err(cuda_err("cannot initialize the driver"))?;
        let ordinal = i32::try_from(ordinal).map_err(|_| ValidateError::Cuda {
            reason: format!("no device {ordinal}"),
        })?;
        let device = result::device::get(ordinal).map_err(cuda_err("cannot open the device"))?;
        // SAFETY: `device` is a handle the driver just returned.
        let total = unsafe { result::device::total_mem(device) }
            .map_err(cuda_err("cannot read the device memory"))?;
        Ok(total as u64)
    })
    .ok()
}

/// The oldest driver reshard's CUDA path runs on, as `cuDriverGetVersion`
/// gives it (1000 x major + 10 x minor): CUDA 11.2, the first with every
/// entry point and attribute the load uses (stream-ordered allocation,
/// `cuMemAllocAsync`, and the memory-pool attribute cudarc reads when it
/// makes a context). An older driver would fail inside cudarc with a
/// missing symbol or an invalid attribute instead of this message.
pub const MIN_DRIVER_VERSION: i32 = 11020;

/// `12.8` for 12080.
fn version_text(v: i32) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

/// The driver's CUDA version, refused below [`MIN_DRIVER_VERSION`].
fn check_driver_version() -> Result<(), ValidateError> {
    let mut version = 0;
    // SAFETY: cuDriverGetVersion writes one int through a valid pointer; it
    // needs no initialization or context.
    unsafe { sys::cuDriverGetVersion(&mut version) }
        .result()
        .map_err(cuda_err("cannot read the driver version"))?;
    if version < MIN_DRIVER_VERSION {
        return Err(ValidateError::CudaDriverTooOld {
            version: version_text(version),
            minimum: version_text(MIN_DRIVER_VERSION),
        });
    }
    Ok(())
}

/// Runs `f` with panics caught and the panic message kept off stderr.
fn guarded<T>(f: impl FnOnce() -> Result<T, ValidateError>) -> Result<T, ValidateError> {
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let result = catch_unwind(AssertUnwindSafe(f));
    std::panic::set_hook(hook);
    result.unwrap_or_else(|panic| {
        // cudarc panics "Missing symbol NAME: ..." when the library loads
        // but lacks an entry point: a driver, just not one reshard can use.
        let text = panic
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| panic.downcast_ref::<&str>().copied())
            .unwrap_or("");
        match text.strip_prefix("Missing symbol ") {
            Some(rest) => Err(ValidateError::Cuda {
                reason: format!(
                    "the driver library lacks the entry point {} (update the NVIDIA driver)",
                    rest.split(':').next().unwrap_or(rest)
                ),
            }),
            None => Err(ValidateError::NoCudaDriver),
        }
    })
}

fn cuda_err(what: &str) -> impl Fn(DriverError) -> ValidateError + '_ {
    move |e| ValidateError::Cuda {
        reason: format!("{what}: {}", driver_text(e)),
    }
}

fn device_err(e: DriverError) -> DeviceError {
    DeviceError::Driver(driver_text(e))
}

/// `CUDA_ERROR_DEVICE_UNAVAILABLE (CUDA-capable device(s) is/are busy or
/// unavailable)`: the code's name, then the driver's own words for it.
fn driver_text(e: DriverError) -> String {
    match e.error_string() {
        Ok(s) => format!("{:?} ({})", e.0, s.to_string_lossy()),
        Err(_) => format!("{:?}", e.0),
    }
}

impl CudaDevice {
    /// Opens CUDA device `ordinal` with a staging buffer of `staging_len`
    /// bytes (allocated by [`Device::prepare`]).
    pub fn open(ordinal: usize, staging_len: usize) -> Result<CudaDevice, ValidateError> {
        if !driver_present() {
            return Err(ValidateError::NoCudaDriver);
        }
        guarded(|| {
            check_driver_version()?;
            let count = CudaContext::device_count().map_err(cuda_err("cannot count devices"))?;
            let count = usize::try_from(count).unwrap_or(0);
            if ordinal >= count {
                return Err(ValidateError::NoSuchCudaDevice { ordinal, count });
            }
            let ctx = CudaContext::new(ordinal).map_err(cuda_err("cannot create a context"))?;
            let name = ctx
                .name()
                .map_err(cuda_err("cannot read the device name"))?;
            let total = ctx
                .total_mem()
                .map_err(cuda_err("cannot read the device memory"))?;
            let stream = ctx.default_stream();
            let info = DeviceInfo {
                device: format!("cuda:{ordinal}"),
                name,
                total_memory: Some(total as u64),
                pinned_staging: false,
            };
            Ok(CudaDevice {
                ctx,
                stream,
                staging_len,
                staging: None,
                allocs: Vec::new(),
                held: 0,
                info,
            })
        })
    }

    fn pinned(&self) -> Result<PinnedHostSlice<u8>, DriverError> {
        // SAFETY: the allocation is uninitialized; it is zeroed through its
        // raw pointer below before any slice of it is made.
        let mut p = unsafe { self.ctx.alloc_pinned_with_flags::<u8>(self.staging_len, 0) }?;
        let ptr = p.as_mut_ptr()?;
        // SAFETY: `ptr` points to `staging_len` writable bytes just
        // allocated and owned by `p`; nothing else refers to them.
        unsafe { std::ptr::write_bytes(ptr, 0, self.staging_len) };
        Ok(p)
    }
}

impl Device for CudaDevice {
    fn info(&self) -> DeviceInfo {
        self.info.clone()
    }

    fn prepare(&mut self) -> Result<(), DeviceError> {
        if self.staging.is_some() {
            return Ok(());
        }
        // Plain (not write-combined) pinned memory: we hash what we stage.
        self.staging = Some(match self.pinned() {
            Ok(p) => {
                self.info.pinned_staging = true;
                Staging::Pinned(p)
            }
            Err(_) => Staging::Plain(try_zeroed(self.staging_len)?),
        });
        Ok(())
    }

    fn staging(&mut self) -> Result<&mut [u8], DeviceError> {
        match &mut self.staging {
            Some(Staging::Pinned(p)) => p.as_mut_slice().map_err(device_err),
            Some(Staging::Plain(v)) => Ok(v),
            None => Err(DeviceError::Driver("staging buffer not allocated".into())),
        }
    }

    fn alloc(&mut self, len: u64) -> Result<usize, DeviceError> {
        let n = usize::try_from(len).map_err(|_| DeviceError::OutOfMemory {
            needed: len,
            host: false,
        })?;
        match self.stream.alloc_zeros::<u8>(n) {
            Ok(slice) => {
                self.allocs.push(slice);
                self.held += len;
                Ok(self.allocs.len() - 1)
            }
            Err(DriverError(CUresult::CUDA_ERROR_OUT_OF_MEMORY)) => Err(DeviceError::OutOfMemory {
                needed: len,
                host: false,
            }),
            Err(e) => Err(device_err(e)),
        }
    }

    fn upload(&mut self, alloc: usize, offset: u64, len: usize) -> Result<(), DeviceError> {
        let off = usize::try_from(offset)
            .map_err(|_| DeviceError::Driver("offset out of range".into()))?;
        let src: &[u8] = match &self.staging {
            Some(Staging::Pinned(p)) => &p.as_slice().map_err(device_err)?[..len],
            Some(Staging::Plain(v)) => &v[..len],
            None => return Err(DeviceError::Driver("staging buffer not allocated".into())),
        };
        let dst = self
            .allocs
            .get_mut(alloc)
            .ok_or_else(|| DeviceError::Driver(format!("no allocation {alloc}")))?;
        if off.checked_add(len).is_none_or(|end| end > dst.len()) {
            return Err(DeviceError::Driver(format!(
                "upload past the end of allocation {alloc}"
            )));
        }
        let mut view = dst.slice_mut(off..off + len);
        self.stream
            .memcpy_htod(src, &mut view)
            .map_err(device_err)?;
        // The staging buffer is refilled next: wait for the copy.
        self.stream.synchronize().map_err(device_err)
    }

    fn download(&mut self, alloc: usize, offset: u64, len: usize) -> Result<(), DeviceError> {
        let off = usize::try_from(offset)
            .map_err(|_| DeviceError::Driver("offset out of range".into()))?;
        let src = self
            .allocs
            .get(alloc)
            .ok_or_else(|| DeviceError::Driver(format!("no allocation {alloc}")))?;
        if off.checked_add(len).is_none_or(|end| end > src.len()) {
            return Err(DeviceError::Driver(format!(
                "download past the end of allocation {alloc}"
            )));
        }
        let view = src.slice(off..off + len);
        let dst: &mut [u8] = match &mut self.staging {
            Some(Staging::Pinned(p)) => &mut p.as_mut_slice().map_err(device_err)?[..len],
            Some(Staging::Plain(v)) => &mut v[..len],
            None => return Err(DeviceError::Driver("staging buffer not allocated".into())),
        };
        self.stream.memcpy_dtoh(&view, dst).map_err(device_err)?;
        self.stream.synchronize().map_err(device_err)
    }

    fn end_shard(&mut self) {
        // A GPU keeps what it loaded.
    }

    fn held(&self) -> u64 {
        self.held
    }

    fn free_dedicated(&mut self) -> Result<Option<u64>, DeviceError> {
        let (free, _total) = self.ctx.mem_get_info().map_err(device_err)?;
        Ok(Some(free as u64))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_driver_open_is_an_error_not_a_panic() {
        if driver_present() {
            eprintln!("skipped: a CUDA driver is present");
            return;
        }
        assert!(matches!(
            CudaDevice::open(0, 4096),
            Err(ValidateError::NoCudaDriver)
        ));
    }
}
