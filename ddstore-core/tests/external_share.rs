//! A one-process store over caller-owned (external) shares: what each
//! `OwnRows` mode does with the rank's own rows, and device shares refusing
//! native copies.

use std::sync::{Arc, Mutex};

use ddstore_core::external::{ExternalShare, HmemIface};
use ddstore_core::node_only::NodeOnlyTransport;
use ddstore_core::store::OwnRows;
use ddstore_core::{Comm, Config, DType, Error, SingleComm, Store};

const ROW: usize = 8;

fn store() -> Store {
    let comm: Arc<dyn Comm> = Arc::new(SingleComm);
    Store::new(comm, Arc::new(NodeOnlyTransport), Config::default())
}

/// A share of `rows` rows whose byte i is `i as u8`, in a vector the share owns.
fn share(rows: usize, iface: HmemIface) -> ExternalShare {
    let mut data: Vec<u8> = (0..rows * ROW).map(|i| i as u8).collect();
    let ptr = data.as_mut_ptr();
    // SAFETY: the vector is never resized and lives in the owner the share holds;
    // a "device" share over it is never dereferenced (native copies refuse).
    unsafe { ExternalShare::new(ptr, rows * ROW, iface, 0, Arc::new(Mutex::new(data))) }
}

#[test]
fn own_rows_modes_on_a_host_share() {
    let s = store();
    s.init_external("v", 5, ROW, DType::Bytes, share(5, HmemIface::System))
        .unwrap();
    let rows = [4i64, 0, 4];
    let mut out = vec![0xAAu8; rows.len() * ROW];
    s.read_rows_with("v", &rows, &mut out, OwnRows::Copy)
        .unwrap();
    assert_eq!(&out[..ROW], &(32..40).collect::<Vec<u8>>()[..]);
    assert_eq!(&out[ROW..2 * ROW], &(0..8).collect::<Vec<u8>>()[..]);
    assert_eq!(&out[2 * ROW..], &out[..ROW].to_vec()[..]);

    let mut out = vec![0xAAu8; rows.len() * ROW];
    s.read_rows_with("v", &rows, &mut out, OwnRows::Skip)
        .unwrap();
    assert!(out.iter().all(|&b| b == 0xAA), "skipped rows were written");
    assert_eq!(s.profile("v").unwrap().local_rows, 6);

    // A one-process store has no transport route to its own external share.
    let err = s
        .read_rows_with("v", &rows, &mut out, OwnRows::Transport)
        .unwrap_err();
    assert!(matches!(err, Error::Unsupported(_)), "{err}");
    s.free().unwrap();
}

#[test]
fn device_share_refuses_native_copies() {
    let s = store();
    s.init_external("d", 3, ROW, DType::Bytes, share(3, HmemIface::Cuda))
        .unwrap();
    let mut out = vec![0u8; ROW];
    let err = s.read_rows("d", &[1], &mut out).unwrap_err().to_string();
    assert!(err.contains("cuda device memory"), "{err}");
    assert!(s.write_local("d", 0, &[0; ROW]).is_err());
    s.read_rows_with("d", &[1], &mut out, OwnRows::Skip)
        .unwrap();
    s.free().unwrap();
}

#[test]
fn share_of_the_wrong_size_is_refused() {
    let s = store();
    let err = s
        .init_external("w", 4, ROW, DType::Bytes, share(3, HmemIface::System))
        .unwrap_err()
        .to_string();
    assert!(err.contains("rank 0") && err.contains("24 bytes"), "{err}");
    assert!(s.names().is_empty());
}
