//! oxccl-kernels. (Being written.)
