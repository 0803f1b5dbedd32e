//! Raw bindings to libfabric (>= 1.17).
//!
//! libfabric's API is mostly `static inline` functions calling through the
//! provider's ops tables; the C shim (`shim/shim.c`) gives each one we use a
//! real symbol named `ddfi_<name>` (e.g. [`ddfi_domain`] for `fi_domain`).
//! The only libfabric symbols linked directly are those every release since
//! 1.x exports: `fi_getinfo`, `fi_freeinfo`, `fi_dupinfo`, `fi_fabric`,
//! `fi_strerror`, `fi_version`, `fi_tostr`.
//!
//! `src/bindings.rs` was generated once by bindgen from libfabric 1.17's
//! headers; build with the `bindgen` feature to regenerate them against the
//! headers pkg-config finds (a site with libfabric 2.x or CXI extensions).

#![allow(non_camel_case_types, non_snake_case, non_upper_case_globals)]
#![allow(clippy::all)]
// Generated code: its unsafe blocks carry no SAFETY lines (the workspace lints
// for them apply to the hand-written crates).
#![allow(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]

#[cfg(feature = "bindgen")]
include!(concat!(env!("OUT_DIR"), "/bindings.rs"));

#[cfg(not(feature = "bindgen"))]
include!("bindings.rs");

/// `FI_ADDR_UNSPEC` is a cast macro (`((uint64_t) -1)`) bindgen cannot translate.
pub const FI_ADDR_UNSPEC: fi_addr_t = u64::MAX;

/// `FI_VERSION(major, minor)`: the version word `fi_getinfo` expects.
pub const fn fi_version_word(major: u32, minor: u32) -> u32 {
    (major << 16) | minor
}

/// The API version this crate asks for: 1.17, the oldest release supported.
pub const FI_API_VERSION: u32 = fi_version_word(1, 17);
