//! Transports behind `ddstore_core::transport::Transport`.
