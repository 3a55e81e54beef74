//! oxccl-kernels (being written).
pub mod formats;
pub mod pattern;
pub mod reduce;
