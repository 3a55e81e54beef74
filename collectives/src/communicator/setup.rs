//! Creating a communicator (collective: every rank calls it): load the device image, agree
//! on the links and on which ranks share a node, and set up every algorithm by iterating
//! [`crate::algorithms::ALGORITHMS`]; the shared scratch is made when the first setup asks
//! for it.

use std::collections::HashMap;
use std::sync::Mutex;

use oxccl_backend::AnyDevice;
use oxccl_channels::bootstrap::{Bootstrap, BootstrapConfig, UniqueId};
use oxccl_channels::hosts::Hosts;
use oxccl_channels::local_exchange::LocalExchange;
use oxccl_hal::{BackendKind, Device, DeviceId, Error, Module, Result};
use oxccl_kernels::abi::OXCCL_ALLREDUCE_MAX_RANKS;

use super::abort::HostWords;
use super::auto_register::AutoRegistry;
use super::check::Signatures;
use super::config::{CommConfig, MIN_ONESHOT_CAPACITY};
use super::premul::{PreMulState, SCALE_KERNEL};
use super::registry::Registry;
use super::Communicator;
use crate::algorithms::{SetupContext, ALGORITHMS};
use crate::scratch::ScratchLayout;
use crate::selector::{default_oneshot_max, default_zc_threshold, Selector};
use crate::tuner::TuneMode;

impl Communicator {
    /// Joins the job described by the launcher environment (torchrun, mpirun, srun, or
    /// `oxccl-perf -N`): rank and world size from `RANK`/`WORLD_SIZE`, the device from
    /// `LOCAL_RANK`, the backend from `OXCCL_BACKEND` (else the first GPU backend built).
    pub fn from_env() -> Result<Communicator> {
        let (bootstrap, info) = Bootstrap::from_env(&BootstrapConfig::from_env()?)?;
        let kind = oxccl_backend::chosen()?;
        let device = AnyDevice::open_with(kind, DeviceId(info.local_rank))?;
        Communicator::new(bootstrap, device, CommConfig::from_env()?)
    }

    /// Joins the job named by a unique id (made by one rank with [`UniqueId::create`] and
    /// handed to the others), on `device`.
    pub fn with_unique_id(
        id: &UniqueId,
        rank: u32,
        world_size: u32,
        device: AnyDevice,
        config: CommConfig,
    ) -> Result<Communicator> {
        let bootstrap = Bootstrap::new(id, rank, world_size, &BootstrapConfig::from_env()?)?;
        Communicator::new(bootstrap, device, config)
    }

    /// Builds the communicator over an existing bootstrap (collective).
    pub fn new(
        bootstrap: Bootstrap,
        device: AnyDevice,
        config: CommConfig,
    ) -> Result<Communicator> {
        let rank = bootstrap.rank();
        let world = bootstrap.world_size();
        let at = |e: Error| e.at_rank(rank);
        let _span = tracing::info_span!("communicator", rank, world).entered();
        if world > OXCCL_ALLREDUCE_MAX_RANKS {
            return Err(at(Error::Unsupported(format!(
                "world size {world}: oxccl serves 1..={OXCCL_ALLREDUCE_MAX_RANKS} ranks (one \
                 node)"
            ))));
        }
        let backend = Device::backend(&device);
        // GPU backends: one image holds every algorithm's kernel. The host backend loads
        // each algorithm's host stand-in instead.
        let image = match backend {
            BackendKind::Host => None,
            other => Some(
                device
                    .load_module(&oxccl_kernels::module_image(other).map_err(at)?)
                    .map_err(at)?,
            ),
        };
        let oneshot_max = config
            .oneshot_max_bytes
            .unwrap_or_else(|| default_oneshot_max(world));
        let layout = ScratchLayout::new(
            world,
            oneshot_max.max(MIN_ONESHOT_CAPACITY),
            config.staging_bytes,
        )
        .map_err(at)?;
        // Every rank's view of its links, gathered: LL128 needs NVLink between every pair.
        let links = bootstrap
            .all_gather(&[u8::from(device.capabilities().peers_over_nvlink)])
            .map_err(at)?;
        let nvlink = links.iter().all(|l| l.as_slice() == [1]);
        // Every rank's node: ranks on several nodes (or every process its own node with
        // OXCCL_SEPARATE_HOSTS=1) map no peer memory; the PortChannel algorithms serve them.
        let hosts = Hosts::gather(&bootstrap).map_err(at)?;
        let multi_node = !hosts.single_node();
        // The word Communicator::abort sets and every kernel's waits read.
        let abort = HostWords::new(&device).map_err(at)?;
        // Each algorithm's setup takes what it needs: the scratch-protocol ones the shared
        // scratch (made on the first request), the PortChannel one its own channels.
        let ctx = SetupContext::new(
            &bootstrap,
            &device,
            config.forced,
            (config.timeout, abort.device_ptr()),
            (config.early_launch, config.reduce_copy_tail_bytes),
            layout,
            (&config.port, &hosts),
            &image,
        );
        let mut instances = Vec::new();
        for &algorithm in ALGORITHMS {
            if let Some(i) = (algorithm.descriptor().setup)(&ctx, algorithm).map_err(at)? {
                instances.push((algorithm, i));
            }
        }
        let (mut modules, scratch) = ctx.into_parts();
        // PreMulSum's scale kernel: in the device image, or the kernel crate's host table.
        let scale = match &image {
            Some(module) => module.kernel(SCALE_KERNEL).map_err(at)?,
            None => {
                let host = device
                    .load_module(&oxccl_kernels::module_image(BackendKind::Host).map_err(at)?)
                    .map_err(at)?;
                let kernel = host.kernel(SCALE_KERNEL).map_err(at)?;
                modules.push(host);
                kernel
            }
        };
        modules.extend(image);
        tracing::info!(
            rank,
            world,
            backend = %backend,
            scratch_bytes = scratch.as_ref().map_or(0, |_| layout.total),
            nvlink,
            multi_node,
            algorithms = ?instances.iter().map(|(a, _)| a.name()).collect::<Vec<_>>(),
            "communicator ready"
        );
        let auto = AutoRegistry::new(config.auto_register_max);
        // Zero-copy on unregistered buffers exchanges a record on every call: on one node
        // through shared memory (about 1 us) rather than the bootstrap's TCP (about 6).
        let local = if config.auto_register && !multi_node && world > 1 {
            LocalExchange::new(&bootstrap).map_err(at)?
        } else {
            None
        };
        let comm = Communicator {
            rank,
            world,
            selector: Selector {
                forced: config.forced,
                oneshot_max_bytes: oneshot_max,
                zc_threshold_bytes: config
                    .zc_threshold_bytes
                    .unwrap_or_else(|| default_zc_threshold(world)),
            },
            config,
            nvlink: nvlink && !multi_node,
            multi_node,
            layout,
            scratch,
            abort,
            premul: PreMulState::new(scale),
            instances,
            signatures: Signatures::default(),
            last_call: Mutex::new(None),
            registry: Registry::default(),
            auto,
            local,
            tuned: Mutex::new(HashMap::new()),
            _modules: modules,
            bootstrap,
            device,
        };
        if comm.config.tune != TuneMode::Off {
            let dtypes = comm.config.tune_dtypes.clone();
            comm.tune(
                &dtypes,
                comm.config.tune_max_bytes,
                comm.config.tune == TuneMode::Force,
            )?;
        }
        Ok(comm)
    }
}
