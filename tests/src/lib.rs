//! Shared helpers for oxccl integration tests (multi-process launch on the host backend).
