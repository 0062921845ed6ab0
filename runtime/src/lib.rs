//! rmm-rs runtime.
