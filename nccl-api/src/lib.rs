//! # oxccl-nccl-api: `liboxccl_nccl.so`, the NCCL C API served by oxccl
//!
//! A `cdylib` that exports every function of NCCL 2.28's `nccl.h` (and the `pnccl*`
//! aliases) with NCCL's names and ABI (`include/nccl.h` is our own header of that ABI), so a
//! program built against NCCL runs on oxccl when this library is preloaded
//! (`LD_PRELOAD=liboxccl_nccl.so`):
//!
//! - `ncclAllReduce` of fp32/fp16/bf16/fp8 (e4m3, e5m2) with sum/prod/min/max/avg, on one
//!   node of up to 8 ranks, is served by oxccl's algorithms on the caller's stream (inside
//!   CUDA graph capture too);
//! - PreMulSum operators (`ncclRedOpCreatePreMulSum`) are kept here ([`ops`]) and served
//!   for allreduce, reduce-scatter and reduce;
//! - everything else (other collectives, send/recv, windows, larger worlds) is forwarded to the real NCCL, loaded at run time from
//!   `OXCCL_NCCL_LIB_PATH` or `libnccl.so.2`, on a real communicator created beside the
//!   oxccl one at init; without a real NCCL those calls return `ncclInvalidUsage` and
//!   `ncclGetLastError` says why;
//! - a communicator the real NCCL made (the real library calls some of its own exported
//!   functions, which then land here) is recognised by its missing magic and passed
//!   through unchanged.
//!
//! On the ROCm backend the same library stands in for RCCL (whose C ABI is NCCL's): the
//! caller's `hipStream_t` is wrapped as the `cudaStream_t` is on CUDA, RCCL is the real
//! library, and fp8 reductions stay with it ([`serve`] has each decision and its reason).
//!
//! The unique id carries both ids ([`id`]). `OXCCL_NCCL_LOG=info` logs which side served
//! each call; `OXCCL_NCCL_PROFILE=1` reports the host time spent in each function
//! ([`profile`]). On the host backend (`OXCCL_BACKEND=host`, or a build without GPU backends)
//! allreduce runs on host memory across processes, synchronously: that is what CI tests.
//! `docs/nccl-api.md` has the details.

pub mod comm;
pub mod error;
pub mod exports;
pub mod group;
pub mod id;
pub mod ops;
pub mod profile;
pub mod real;
pub mod register;
pub mod serve;
pub mod types;
