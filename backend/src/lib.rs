//! oxccl-backend: run-time dispatch over the built backends. (Being written.)
