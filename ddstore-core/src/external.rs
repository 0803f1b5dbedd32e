//! Shares in memory this crate does not allocate: a device (GPU) buffer, or
//! host memory, owned by the caller (a torch tensor) and kept alive by an
//! owner object the share holds.
//!
//! A device share cannot be copied with `memcpy`: its own rows are read by
//! the caller (torch), and other ranks read it through a transport that
//! registers device memory (libfabric `FI_HMEM`). Device shares are never
//! shared on the node through shared-memory files.

use std::any::Any;
use std::sync::Arc;

use crate::memory::{Memory, RawMemory};
use crate::{Error, Result};

/// Where a share's bytes live, as libfabric's `enum fi_hmem_iface` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HmemIface {
    /// Host memory (registered like device memory; used to test that path on a CPU).
    System,
    /// NVIDIA CUDA device memory.
    Cuda,
    /// AMD ROCm device memory.
    Rocr,
    /// Intel Level Zero device memory.
    Ze,
}

impl HmemIface {
    /// The interface of a name (`cuda`, `rocr`/`hip`, `ze`, `system`/`host`).
    pub fn parse(s: &str) -> Result<HmemIface> {
        match s.to_ascii_lowercase().as_str() {
            "system" | "host" => Ok(HmemIface::System),
            "cuda" => Ok(HmemIface::Cuda),
            "rocr" | "rocm" | "hip" => Ok(HmemIface::Rocr),
            "ze" | "level_zero" => Ok(HmemIface::Ze),
            other => Err(Error::invalid(format!(
                "memory interface {other:?} is not known: expected system, cuda, rocr or ze"
            ))),
        }
    }

    /// The canonical lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            HmemIface::System => "system",
            HmemIface::Cuda => "cuda",
            HmemIface::Rocr => "rocr",
            HmemIface::Ze => "ze",
        }
    }

    /// Whether the bytes are device memory (not addressable by the CPU).
    pub fn is_device(self) -> bool {
        self != HmemIface::System
    }
}

/// This rank's share in caller-owned memory.
pub struct ExternalShare {
    memory: RawMemory,
    iface: HmemIface,
    device: i32,
}

impl ExternalShare {
    /// # Safety
    /// `ptr..ptr+len` must stay valid (and writable) for as long as `owner`
    /// is alive, and must be host memory when `iface` is `System`.
    pub unsafe fn new(
        ptr: *mut u8,
        len: usize,
        iface: HmemIface,
        device: i32,
        owner: Arc<dyn Any + Send + Sync>,
    ) -> ExternalShare {
        ExternalShare {
            // SAFETY: this function's contract is RawMemory::new's: the range
            // stays valid and writable while `owner` lives.
            memory: unsafe { RawMemory::new(ptr, len, true, owner) },
            iface,
            device,
        }
    }

    /// Which memory interface the share lives in.
    pub fn iface(&self) -> HmemIface {
        self.iface
    }

    /// The device's ordinal within its interface (0 for system memory).
    pub fn device(&self) -> i32 {
        self.device
    }

    fn refuse(&self, what: &str) -> Error {
        Error::Unsupported(format!(
            "this rank's share is in {} device memory (device {}): native code cannot {what} it; \
             read this rank's own rows on the device (pyddstore.torch does), or read them through \
             the transport",
            self.iface.name(),
            self.device
        ))
    }
}

impl Memory for ExternalShare {
    fn len(&self) -> usize {
        self.memory.len()
    }
    fn as_ptr(&self) -> *const u8 {
        self.memory.as_ptr()
    }
    fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        if self.iface.is_device() {
            return Err(self.refuse("copy from"));
        }
        self.memory.read_at(offset, dst)
    }
    fn write_at(&self, offset: usize, src: &[u8]) -> Result<()> {
        if self.iface.is_device() {
            return Err(self.refuse("copy into"));
        }
        self.memory.write_at(offset, src)
    }
    fn pread_into(
        &self,
        offset: usize,
        len: usize,
        file: &std::fs::File,
        file_offset: u64,
    ) -> Result<usize> {
        if self.iface.is_device() {
            return Err(self.refuse("read a file into"));
        }
        self.memory.pread_into(offset, len, file, file_offset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_share_copies_and_device_share_refuses() {
        let buf = Arc::new(std::sync::Mutex::new(vec![0u8; 16]));
        let ptr = buf.lock().unwrap().as_mut_ptr();
        // SAFETY: the vector lives in `buf`, which the share keeps alive, and is never resized.
        let host = unsafe { ExternalShare::new(ptr, 16, HmemIface::System, 0, buf.clone()) };
        host.write_at(4, b"abcd").unwrap();
        let mut out = [0u8; 4];
        host.read_at(4, &mut out).unwrap();
        assert_eq!(&out, b"abcd");
        assert!(host.read_at(14, &mut out).is_err());

        // SAFETY: as above (the "device" share is never dereferenced: it refuses).
        let dev = unsafe { ExternalShare::new(ptr, 16, HmemIface::Cuda, 1, buf) };
        let err = dev.read_at(0, &mut out).unwrap_err().to_string();
        assert!(err.contains("cuda device memory (device 1)"), "{err}");
        assert!(dev.write_at(0, b"x").is_err());
    }

    #[test]
    fn iface_names_round_trip() {
        for i in [
            HmemIface::System,
            HmemIface::Cuda,
            HmemIface::Rocr,
            HmemIface::Ze,
        ] {
            assert_eq!(HmemIface::parse(i.name()).unwrap(), i);
        }
        assert_eq!(HmemIface::parse("hip").unwrap(), HmemIface::Rocr);
        assert!(HmemIface::parse("tpu").is_err());
    }
}
