//! oxccl-perf (being written): allreduce timing against NCCL in the same run.
fn main() {}
