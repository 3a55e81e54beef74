//! Inputs and references shared by the allreduce integration tests.

use oxccl_collectives::hal::{AccumType, DataType, ReduceOp};
use oxccl_collectives::kernels::{formats, reduce};

/// Deterministic non-zero inputs of `rank`: values near ±1 (a zero would hide a missing
/// contribution of a rank in a sum).
pub fn input(dtype: DataType, rank: u32, count: usize, salt: u64) -> Vec<u8> {
    let mut out = vec![0u8; dtype.bytes(count).unwrap()];
    let mut s = 0x9e37_79b9_7f4a_7c15u64
        ^ (u64::from(rank) << 32)
        ^ salt.wrapping_mul(0x1234_5678_9abc_def1);
    for i in 0..count {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        let mag = 0.25 + (s % 1000) as f32 / 1000.0;
        let v = if s & (1 << 20) != 0 { -mag } else { mag };
        let mut bits = formats::encode(dtype, v);
        if formats::decode(dtype, bits) == 0.0 {
            bits = formats::encode(dtype, 0.5);
        }
        formats::write_element(dtype, &mut out, i, bits).unwrap();
    }
    out
}

/// What every rank must hold after the allreduce of [`input`]s: the host reference, in
/// rank order.
pub fn expected(
    dtype: DataType,
    op: ReduceOp,
    accum: AccumType,
    world: u32,
    count: usize,
    salt: u64,
) -> Vec<u8> {
    let inputs: Vec<Vec<u8>> = (0..world).map(|r| input(dtype, r, count, salt)).collect();
    let refs: Vec<&[u8]> = inputs.iter().map(|v| v.as_slice()).collect();
    let mut out = vec![0u8; dtype.bytes(count).unwrap()];
    reduce::reduce(dtype, op, accum, &refs, &mut out, count).unwrap();
    out
}

/// Runs this test binary's ignored `child_rank` test as `world` rank processes on this
/// machine (launcher environment as torchrun sets it, host backend, `env` on top), and
/// asserts that every rank exits successfully; `what` names the case in the message.
pub fn run_child_ranks(world: u32, env: &[(&str, &str)], what: &str) {
    let exe = std::env::current_exe().unwrap();
    // Below the ephemeral range: a port from bind(0) can be handed to another test's
    // outgoing connection before rank 0 binds it.
    let master_port = oxccl_collectives::channels::bootstrap::free_rendezvous_port().unwrap();
    let children: Vec<_> = (0..world)
        .map(|r| {
            std::process::Command::new(&exe)
                .args([
                    "--exact",
                    "child_rank",
                    "--ignored",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env("OXCCL_TEST_CHILD", "1")
                .env("OXCCL_BACKEND", "host")
                .env("OXCCL_TIMEOUT_MS", "20000")
                .envs(env.iter().copied())
                .env("RANK", r.to_string())
                .env("LOCAL_RANK", r.to_string())
                .env("WORLD_SIZE", world.to_string())
                .env("LOCAL_WORLD_SIZE", world.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", master_port.to_string())
                .env("OXCCL_BOOTSTRAP_PORT", (master_port + 1).to_string())
                .spawn()
                .unwrap()
        })
        .collect();
    for mut c in children {
        let status = c.wait().unwrap();
        assert!(status.success(), "{what}: a rank failed ({status})");
    }
}
