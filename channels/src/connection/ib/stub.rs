//! The InfiniBand stub of builds without the `ib` feature: same API, every constructor
//! answers [`NOT_BUILT`], and the types have no values, so no other call can be reached.

use std::time::Duration;

use oxccl_hal::{DevicePtr, Error, Result};

use super::NOT_BUILT;
use crate::bootstrap::Bootstrap;
use crate::registered_memory::{RegisteredMemory, RemoteMemory};

fn not_built() -> Error {
    Error::Unsupported(NOT_BUILT.into())
}

/// Whether this process can use InfiniBand: never, in this build.
pub fn available() -> bool {
    false
}

/// A memory region registered with the RDMA device (none exist in this build).
#[derive(Debug)]
pub enum IbRegion {}

impl IbRegion {
    /// Registers `len` bytes at `ptr`: always [`Error::Unsupported`] in this build.
    pub fn register(_ptr: DevicePtr, _len: usize) -> Result<IbRegion> {
        Err(not_built())
    }

    /// Address of the first registered byte.
    pub fn addr(&self) -> u64 {
        match *self {}
    }

    /// The remote key peers write with.
    pub fn rkey(&self) -> u32 {
        match *self {}
    }

    /// The local key this process posts with.
    pub fn lkey(&self) -> u32 {
        match *self {}
    }
}

/// An InfiniBand connection (none exist in this build).
#[derive(Debug)]
pub enum IbConnection {}

impl IbConnection {
    /// Sets up a queue pair with `peer`: always [`Error::Unsupported`] in this build.
    pub fn connect(_bootstrap: &Bootstrap, _peer: u32, _tag: u32) -> Result<IbConnection> {
        Err(not_built())
    }

    /// The peer's rank.
    pub fn peer(&self) -> u32 {
        match *self {}
    }

    /// RDMA write (see [`crate::connection::Connection::write`]).
    pub fn write(
        &self,
        _dst: &RemoteMemory,
        _dst_offset: usize,
        _src: &RegisteredMemory,
        _src_offset: usize,
        _bytes: usize,
    ) -> Result<()> {
        match *self {}
    }

    /// RDMA write of a signal value (see [`crate::connection::Connection::update_and_sync`]).
    pub fn update_and_sync(
        &self,
        _dst: &RemoteMemory,
        _dst_offset: usize,
        _value: u64,
    ) -> Result<()> {
        match *self {}
    }

    /// Completion polling (see [`crate::connection::Connection::flush`]).
    pub fn flush(&self, _timeout: Duration) -> Result<()> {
        match *self {}
    }
}
