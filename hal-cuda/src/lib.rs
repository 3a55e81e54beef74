//! oxccl-hal-cuda: the CUDA backend. (Being written.)
