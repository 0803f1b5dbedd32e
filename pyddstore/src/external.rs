//! A torch tensor as a store share (`add_device=`): its memory, described by
//! the tensor itself, and kept alive by a reference the share holds.

use std::sync::Arc;

use ddstore_core::external::{ExternalShare, HmemIface};
use pyo3::prelude::*;

use crate::errors::{type_error, value_error};

/// The Python object whose memory a share uses; held until the share is dropped.
struct TensorOwner(#[allow(dead_code)] Py<PyAny>);

/// The device type torch reports for memory of `iface` (ROCm builds of torch say "cuda").
fn torch_device_type(iface: HmemIface) -> &'static [&'static str] {
    match iface {
        HmemIface::System => &["cpu"],
        HmemIface::Cuda | HmemIface::Rocr => &["cuda"],
        HmemIface::Ze => &["xpu"],
    }
}

/// This rank's share in `tensor`'s memory: a contiguous tensor on a device
/// of interface `iface` (index `device`), which must not be resized while
/// the store lives.
pub fn share_of_tensor(
    tensor: &Bound<'_, PyAny>,
    iface: HmemIface,
    device: i32,
) -> PyResult<ExternalShare> {
    let py = tensor.py();
    let what = |e: PyErr| type_error(py, format!("the share must be a torch.Tensor ({e})"));
    let contiguous: bool = tensor
        .call_method0("is_contiguous")
        .and_then(|v| v.extract())
        .map_err(what)?;
    if !contiguous {
        return Err(value_error(
            py,
            "the share tensor must be contiguous".into(),
        ));
    }
    let dev = tensor.getattr("device").map_err(what)?;
    let dev_type: String = dev.getattr("type")?.extract()?;
    let dev_index: Option<i32> = dev.getattr("index")?.extract()?;
    if !torch_device_type(iface).contains(&dev_type.as_str()) {
        return Err(value_error(
            py,
            format!(
                "the share tensor is on a {dev_type} device, which is not {} memory",
                iface.name()
            ),
        ));
    }
    if iface.is_device() && dev_index.is_some_and(|i| i != device) {
        return Err(value_error(
            py,
            format!(
                "the share tensor is on device {}, not {device}",
                dev_index.unwrap_or(0)
            ),
        ));
    }
    let numel: usize = tensor.call_method0("numel")?.extract()?;
    let itemsize: usize = tensor.call_method0("element_size")?.extract()?;
    let len = numel
        .checked_mul(itemsize)
        .ok_or_else(|| value_error(py, format!("the share tensor's {numel} elements overflow")))?;
    let ptr: usize = tensor.call_method0("data_ptr")?.extract()?;
    if ptr == 0 && len > 0 {
        return Err(value_error(py, "the share tensor has no memory".into()));
    }
    let owner = Arc::new(TensorOwner(tensor.clone().unbind()));
    // SAFETY: `ptr..ptr+len` is the memory of a contiguous tensor of `numel`
    // elements of `itemsize` bytes, on the device checked above (host memory
    // for System); `owner` holds a reference to the tensor, so torch keeps
    // that memory allocated while the share lives (the documented contract:
    // the tensor is not resized).
    Ok(unsafe { ExternalShare::new(ptr as *mut u8, len, iface, device, owner) })
}
