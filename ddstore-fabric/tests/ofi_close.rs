//! Explicit closes of libfabric objects report the provider's answer: in
//! fabtests' order (registration, endpoint, CQ and AV, domain, fabric) every
//! close succeeds, on tcp;ofi_rxm and shm over loopback.

use std::sync::Arc;

use ddstore_fabric::ofi::{Av, Cq, Domain, Endpoint, Fabric, Info, InfoRequest, MemoryRegion};
use libfabric_sys as sys;

/// `arc`'s object, which nothing else may still hold.
fn last<T>(what: &str, arc: Arc<T>) -> T {
    Arc::into_inner(arc).unwrap_or_else(|| panic!("the {what} is still held"))
}

/// Opens one of each object on `provider`, reads nothing, closes them in
/// order; `None` when the provider is not available here.
fn open_and_close(provider: &str) -> Option<()> {
    let request = InfoRequest {
        provider: Some(provider.into()),
        node: provider.starts_with("tcp").then(|| "127.0.0.1".into()),
        ..Default::default()
    };
    let info = Info::query(&request).ok()?;
    let fabric = Arc::new(Fabric::open(&info).unwrap());
    let domain = Domain::open(&fabric).unwrap();
    let cq = Arc::new(Cq::open(&domain, 16, false).unwrap());
    let av = Arc::new(Av::open(&domain, 4).unwrap());
    let ep = Arc::new(Endpoint::open(&domain, cq.clone(), av.clone()).unwrap());
    let share = vec![7u8; 4096];
    // SAFETY: `share` outlives the registration, which is closed below.
    let mr = unsafe {
        MemoryRegion::register(
            &domain,
            &ep,
            share.as_ptr(),
            share.len(),
            sys::FI_REMOTE_READ as u64,
        )
    }
    .unwrap();
    assert!(mr.key() != 0 || domain.requires(sys::FI_MR_PROV_KEY));
    let report = |what: &str, closed: ddstore_fabric::error::FabricResult<()>| {
        if let Err(e) = closed {
            panic!("{provider}: closing the {what} failed: {e}");
        }
    };
    report("registration", mr.close());
    report("endpoint", last("endpoint", ep).close());
    report("completion queue", last("completion queue", cq).close());
    report("address vector", last("address vector", av).close());
    report("domain", last("domain", domain).close());
    report("fabric", last("fabric", fabric).close());
    Some(())
}

#[test]
fn objects_close_in_order_and_report_success() {
    assert!(
        open_and_close("tcp;ofi_rxm").is_some(),
        "tcp;ofi_rxm is not available"
    );
    if open_and_close("shm").is_none() {
        eprintln!("shm is not available here: closed on tcp;ofi_rxm only");
    }
}

/// A child's close also closes the parents it held last: the endpoint of
/// an object chain nothing else holds takes its CQ, AV, domain and fabric.
#[test]
fn the_last_holder_closes_its_parents() {
    let request = InfoRequest {
        provider: Some("tcp;ofi_rxm".into()),
        node: Some("127.0.0.1".into()),
        ..Default::default()
    };
    let info = Info::query(&request).expect("tcp;ofi_rxm");
    let fabric = Arc::new(Fabric::open(&info).unwrap());
    let domain = Domain::open(&fabric).unwrap();
    let cq = Arc::new(Cq::open(&domain, 16, false).unwrap());
    let av = Arc::new(Av::open(&domain, 4).unwrap());
    let ep = Endpoint::open(&domain, cq, av).unwrap();
    let weak_domain = Arc::downgrade(&domain);
    let weak_fabric = Arc::downgrade(&fabric);
    drop((domain, fabric));
    ep.close().unwrap();
    assert!(weak_domain.upgrade().is_none() && weak_fabric.upgrade().is_none());
}
