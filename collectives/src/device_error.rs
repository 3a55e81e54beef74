//! The failure word kernels leave in device memory: `0`, or an `OXCCL_ALLREDUCE_ERR_*`
//! code with the peer's rank in the high 32 bits (`abi_allreduce.h`). One decoder for every
//! kernel that keeps such a word (the shared scratch's, a PortChannel algorithm's own).

use std::time::Duration;

use oxccl_backend::AnyStream;
use oxccl_hal::{DevicePtr, Error, Result, Stream};
use oxccl_kernels::abi::{
    OXCCL_ALLREDUCE_ERR_ABORTED, OXCCL_ALLREDUCE_ERR_ARGS, OXCCL_ALLREDUCE_ERR_TIMEOUT,
};

/// Reads the word at `at` (after the work queued on `stream`; the caller synchronized it)
/// and decodes it: `what` names the kernels ("the allreduce kernels"), `timeout` is the
/// bound their waits had.
pub fn read(stream: &AnyStream, at: DevicePtr, what: &str, timeout: Duration) -> Result<()> {
    let mut word = [0u8; 8];
    stream.read(at, &mut word)?;
    decode(u64::from_le_bytes(word), what, timeout)
}

/// Decodes a failure word.
pub fn decode(word: u64, what: &str, timeout: Duration) -> Result<()> {
    let (code, peer) = ((word & 0xffff_ffff) as u32, (word >> 32) as u32);
    match code {
        0 => Ok(()),
        c if c == OXCCL_ALLREDUCE_ERR_TIMEOUT => Err(Error::Timeout {
            what: format!("{what}: a wait for rank {peer} (dead, slow, or a mismatched call)"),
            waited: timeout,
        }),
        c if c == OXCCL_ALLREDUCE_ERR_ABORTED => Err(Error::Aborted(format!(
            "{what}: the communicator was aborted (Communicator::abort, ncclCommAbort) while a \
             wait for rank {peer} was under way; it serves no more calls"
        ))),
        c if c == OXCCL_ALLREDUCE_ERR_ARGS => Err(Error::InvalidArgument(format!(
            "{what}: a kernel rejected its argument block"
        ))),
        other => Err(Error::InvalidArgument(format!(
            "{what}: kernel failure code {other}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_decode_to_errors_naming_the_peer() {
        let t = Duration::from_secs(3);
        assert!(decode(0, "k", t).is_ok());
        let e = decode(u64::from(OXCCL_ALLREDUCE_ERR_TIMEOUT) | (5 << 32), "k", t)
            .unwrap_err()
            .to_string();
        assert!(e.contains("rank 5") && e.contains("k:"), "{e}");
        let e = decode(u64::from(OXCCL_ALLREDUCE_ERR_ABORTED) | (1 << 32), "k", t).unwrap_err();
        assert!(matches!(e, Error::Aborted(_)), "{e}");
        let e = e.to_string();
        assert!(e.contains("aborted") && e.contains("rank 1"), "{e}");
        let e = decode(u64::from(OXCCL_ALLREDUCE_ERR_ARGS), "k", t).unwrap_err();
        assert!(e.to_string().contains("argument block"), "{e}");
        assert!(decode(77, "k", t).unwrap_err().to_string().contains("77"));
    }
}
