//! What a kernel launch needs: the code image, the grid, and (for the host backend) the
//! table of host kernels that stand in for device code.

use std::fmt;

use crate::error::Result;

/// Grid and block shape of a launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LaunchConfig {
    /// Blocks in x, y, z.
    pub grid: [u32; 3],
    /// Threads per block in x, y, z.
    pub block: [u32; 3],
    /// Dynamic shared memory per block in bytes.
    pub shared_mem_bytes: u32,
    /// Lets the kernel start while the kernel before it on the stream is still finishing
    /// (CUDA's programmatic dependent launch, sm_90 on): its blocks are resident and
    /// waiting when the earlier kernel ends, which hides the launch latency of a kernel
    /// that is only a few microseconds long. Valid usage: the kernel calls
    /// `oxccl::wait_prior_grid()` (kernels' `platform.hpp`) before it touches memory that
    /// earlier work on the stream wrote. Backends and devices without the feature
    /// ([`crate::Capabilities::early_launch`] false) launch as usual, where that wait
    /// returns at once.
    pub early_launch: bool,
}

impl LaunchConfig {
    /// A one-dimensional launch of `blocks` x `threads`.
    pub const fn linear(blocks: u32, threads: u32) -> Self {
        LaunchConfig {
            grid: [blocks, 1, 1],
            block: [threads, 1, 1],
            shared_mem_bytes: 0,
            early_launch: false,
        }
    }

    /// The same launch with [`LaunchConfig::early_launch`] set to `on`.
    pub const fn with_early_launch(self, on: bool) -> Self {
        LaunchConfig {
            early_launch: on,
            ..self
        }
    }

    /// Total number of threads in the launch.
    pub fn total_threads(&self) -> u64 {
        self.grid
            .iter()
            .chain(self.block.iter())
            .map(|&v| u64::from(v))
            .product()
    }
}

/// A kernel that runs on the host backend: it receives the launch shape and the same
/// argument block a device kernel would, and does the whole grid's work.
pub type HostKernelFn = fn(&LaunchConfig, &[u8]) -> Result<()>;

/// A named set of host kernels: the host backend's equivalent of a code image.
#[derive(Clone, Copy)]
pub struct HostKernelTable {
    /// Name of the table, for errors and logs.
    pub name: &'static str,
    /// Kernel names and entry points.
    pub kernels: &'static [(&'static str, HostKernelFn)],
}

impl fmt::Debug for HostKernelTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostKernelTable")
            .field("name", &self.name)
            .field(
                "kernels",
                &self.kernels.iter().map(|(n, _)| *n).collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// A code image a backend can load.
#[derive(Debug, Clone, Copy)]
pub enum ModuleImage<'a> {
    /// A CUDA fatbin (SASS for the target architectures).
    Cuda(&'a [u8]),
    /// An AMD code object (or offload bundle) for the target architectures.
    Rocm(&'a [u8]),
    /// Host kernels for the host backend.
    Host(&'a HostKernelTable),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn early_launch_is_off_unless_asked_for() {
        let plain = LaunchConfig::linear(4, 128);
        assert!(!plain.early_launch);
        let early = plain.with_early_launch(true);
        assert!(early.early_launch);
        assert_eq!((early.grid, early.block), (plain.grid, plain.block));
        assert_eq!(early.with_early_launch(false), plain);
    }
}
