//! Every shim function and every directly linked libfabric symbol resolves,
//! and one real `fi_getinfo` call finds the tcp provider over loopback.

use std::ffi::{CStr, CString};
use std::ptr;

use libfabric_sys::*;

#[test]
fn every_wrapped_and_linked_symbol_resolves() {
    let symbols: &[(&str, usize)] = &[
        ("fi_getinfo", fi_getinfo as *const () as usize),
        ("fi_freeinfo", fi_freeinfo as *const () as usize),
        ("fi_dupinfo", fi_dupinfo as *const () as usize),
        ("fi_fabric", fi_fabric as *const () as usize),
        ("fi_strerror", fi_strerror as *const () as usize),
        ("fi_version", fi_version as *const () as usize),
        ("fi_tostr", fi_tostr as *const () as usize),
        ("ddfi_allocinfo", ddfi_allocinfo as *const () as usize),
        ("ddfi_close", ddfi_close as *const () as usize),
        ("ddfi_control", ddfi_control as *const () as usize),
        ("ddfi_domain", ddfi_domain as *const () as usize),
        ("ddfi_endpoint", ddfi_endpoint as *const () as usize),
        ("ddfi_av_open", ddfi_av_open as *const () as usize),
        ("ddfi_cq_open", ddfi_cq_open as *const () as usize),
        ("ddfi_ep_bind", ddfi_ep_bind as *const () as usize),
        ("ddfi_enable", ddfi_enable as *const () as usize),
        ("ddfi_cancel", ddfi_cancel as *const () as usize),
        ("ddfi_getname", ddfi_getname as *const () as usize),
        ("ddfi_av_insert", ddfi_av_insert as *const () as usize),
        ("ddfi_mr_reg", ddfi_mr_reg as *const () as usize),
        ("ddfi_mr_regattr", ddfi_mr_regattr as *const () as usize),
        ("ddfi_mr_key", ddfi_mr_key as *const () as usize),
        ("ddfi_mr_desc", ddfi_mr_desc as *const () as usize),
        ("ddfi_mr_bind", ddfi_mr_bind as *const () as usize),
        ("ddfi_mr_enable", ddfi_mr_enable as *const () as usize),
        ("ddfi_read", ddfi_read as *const () as usize),
        ("ddfi_cq_read", ddfi_cq_read as *const () as usize),
        ("ddfi_cq_readerr", ddfi_cq_readerr as *const () as usize),
        ("ddfi_cq_sread", ddfi_cq_sread as *const () as usize),
        ("ddfi_cq_signal", ddfi_cq_signal as *const () as usize),
        ("ddfi_cq_strerror", ddfi_cq_strerror as *const () as usize),
    ];
    for (name, addr) in symbols {
        assert_ne!(*addr, 0, "{name} did not resolve");
    }
}

#[test]
fn runtime_version_and_strerror() {
    // SAFETY: fi_version takes no arguments and only returns a number.
    let v = unsafe { fi_version() };
    assert!(
        v >= FI_API_VERSION,
        "libfabric {}.{} is older than 1.17",
        v >> 16,
        v & 0xffff
    );
    // SAFETY: fi_strerror returns a static string for any errno value.
    let msg = unsafe { CStr::from_ptr(fi_strerror(FI_EAGAIN as i32)) };
    assert!(!msg.to_bytes().is_empty());
    assert_eq!(FI_ADDR_UNSPEC, u64::MAX);
}

#[test]
fn getinfo_finds_tcp_rxm_with_rma() {
    std::env::set_var("FI_TCP_IFACE", "lo");
    // SAFETY: fi_allocinfo returns a zeroed fi_info with zeroed attribute
    // structs, or NULL; the provider name is malloc'd because fi_freeinfo frees it.
    unsafe {
        let hints = ddfi_allocinfo();
        assert!(!hints.is_null());
        (*(*hints).ep_attr).type_ = FI_EP_RDM;
        (*hints).caps = (FI_RMA | FI_READ | FI_REMOTE_READ) as u64;
        (*(*hints).domain_attr).mr_mode =
            (FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_PROV_KEY | FI_MR_ALLOCATED | FI_MR_ENDPOINT)
                as i32;
        let prov = CString::new("tcp;ofi_rxm").unwrap();
        (*(*hints).fabric_attr).prov_name = libc::strdup(prov.as_ptr());
        let node = CString::new("127.0.0.1").unwrap();
        let mut info: *mut fi_info = ptr::null_mut();
        let rc = fi_getinfo(
            FI_API_VERSION,
            node.as_ptr(),
            ptr::null(),
            0,
            hints,
            &mut info,
        );
        fi_freeinfo(hints);
        assert_eq!(rc, 0, "fi_getinfo: {:?}", CStr::from_ptr(fi_strerror(-rc)));
        assert!(!info.is_null());
        let name = CStr::from_ptr((*(*info).fabric_attr).prov_name)
            .to_string_lossy()
            .into_owned();
        assert!(name.contains("tcp"), "provider {name}");
        assert_ne!((*info).caps & FI_RMA as u64, 0);
        fi_freeinfo(info);
    }
}
