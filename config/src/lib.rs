//! rmm-rs configuration (in progress).
