//! oxccl-hal-rocm: the ROCm backend. (Being written.)
