//! ddstore-core: the transport-independent part of pyddstore.
//!
//! A [`store::Store`] holds named variables. Each rank owns a contiguous share
//! of every variable's rows; [`layout::Layout`] maps a global row to its owner,
//! [`plan::Plan`] turns a batch of rows into coalesced byte-range reads, and a
//! [`transport::Transport`] moves the bytes that are not in this process.

#![warn(missing_docs)]

pub mod comm;
pub mod config;
pub mod direct_io;
pub mod dtype;
pub mod error;
pub mod external;
pub mod fd_limit;
pub mod file_comm;
pub mod file_load;
pub mod fork;
pub mod interrupt;
pub mod kinds;
pub mod launcher;
pub mod layout;
pub mod memory;
pub mod node_only;
pub mod plan;
pub mod private_dir;
pub mod profile;
pub mod reader_pool;
pub mod region;
pub mod row_map;
pub mod spill;
pub mod store;
pub mod transport;

pub use comm::{Comm, SingleComm};
pub use config::Config;
pub use dtype::DType;
pub use error::{Error, Result};
pub use layout::Layout;
pub use store::Store;
