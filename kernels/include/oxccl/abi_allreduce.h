/* oxccl/abi_allreduce.h: argument block and scratch layout of the allreduce kernels.
 *
 * Included by abi.h inside its extern "C" block (so bindgen sees it); owned by the
 * collectives crate (collectives/src/). Kernels: allreduce_oneshot_ll, allreduce_twoshot,
 * allreduce_twoshot_zc (kernels/src/device/allreduce.cu); host stand-ins with the same names and blocks live in
 * collectives/src/host_kernels.rs.
 *
 * Every rank owns one scratch allocation with the same layout; every rank maps every
 * peer's, and `scratch[r]` in the argument block is rank r's as mapped in this process.
 *
 *   [0, SYNC_BYTES)                      sync area (below); zeroed at communicator setup
 *   [packet_offset, +2*packet_half)      LL16 packets, two halves chosen by epoch parity;
 *                                        zeroed at setup (flag 0 never matches)
 *   [ll128 offset, +2*ll128 half)        LL128 lines (allreduce_oneshot_ll128), two halves
 *                                        by epoch parity, zeroed at setup; a launch of that
 *                                        kernel passes this region as packet_offset /
 *                                        packet_half_bytes
 *   [mailbox offset, +2*packet half)     LL16 packets of reduce_oneshot_ll, two halves by
 *                                        the MAILBOX_SEQ parity, zeroed at setup (a region
 *                                        of its own: that kernel keeps out of the epoch
 *                                        protocol, see MAILBOX_SEQ); its launches pass it
 *                                        as packet_offset / packet_half_bytes
 *   [data_offset, +2*data_bytes)         two-shot staging: "in" (inputs peers read) then
 *                                        "out" (reduced chunks peers read)
 *
 * Sync area (u64 words):
 *   EPOCH      calls completed by this rank's kernels; read by the one-shots at their
 *              start, advanced (+1) by block 0 of every kernel at its end, once every block
 *              of a one-shot has read it. LL flags and packet parity derive from it, so
 *              nothing on the host advances per call (graph replays stay correct).
 *   DONE       blocks of the running one-shot kernel that have read the epoch (each adds 1
 *              after its writes to the peers; block 0 waits for all, resets it and
 *              advances the epoch).
 *   ERROR      0, or OXCCL_ALLREDUCE_ERR_* | (peer rank << 32): first failure seen.
 *   MAILBOX_SEQ   reduce_oneshot_ll calls completed by this rank's kernels (advanced as
 *              EPOCH, which those calls leave alone). Its flags and mailbox halves derive
 *              from it.
 *   MAILBOX_SEEN  [MAX_RANKS]: word p holds 1 + the MAILBOX_SEQ of the latest
 *              reduce_oneshot_ll call rank p has started (p stores it here at the start
 *              of each), so p has finished reading every earlier call's packets. A sender
 *              of call s writes the root's half s & 1 once the root's word is >= s (the
 *              root has started call s - 1, so it no longer reads call s - 2's packets
 *              there); the sender never waits for the root to read call s. The epoch
 *              one-shots instead finish a call only once every peer has started it, which
 *              a call that does not wait would break for the calls after it; hence a
 *              counter and a region of its own.
 *   ROOT_IN_PLACE  reduce_relay: 1 when this rank, the root of the running call, has its
 *              output in place of its input (stored by each of its blocks before the
 *              start barrier, read by the other ranks' blocks after it), else 0.
 *   INBOUND    [MAX_BLOCKS][MAX_RANKS]: block b of rank p adds 1 to INBOUND[b][p] of this
 *              rank (release) at each two-shot barrier (both two-shot kernels).
 *   EXPECTED   [MAX_BLOCKS][MAX_RANKS]: signals consumed so far (local only).
 */
#ifndef OXCCL_ABI_ALLREDUCE_H_
#define OXCCL_ABI_ALLREDUCE_H_

#include <stdint.h>

#define OXCCL_ALLREDUCE_MAX_RANKS 8
#define OXCCL_ALLREDUCE_MAX_BLOCKS 256

#define OXCCL_ALLREDUCE_SYNC_BYTES 65536
#define OXCCL_ALLREDUCE_SYNC_EPOCH 0
#define OXCCL_ALLREDUCE_SYNC_DONE 8
#define OXCCL_ALLREDUCE_SYNC_ERROR 16
#define OXCCL_ALLREDUCE_SYNC_MAILBOX_SEQ 24
#define OXCCL_ALLREDUCE_SYNC_ROOT_IN_PLACE 32
#define OXCCL_ALLREDUCE_SYNC_MAILBOX_SEEN 64
#define OXCCL_ALLREDUCE_SYNC_INBOUND 4096
#define OXCCL_ALLREDUCE_SYNC_EXPECTED 20480

enum {
  OXCCL_ALLREDUCE_OK = 0,
  OXCCL_ALLREDUCE_ERR_TIMEOUT = 1,
  OXCCL_ALLREDUCE_ERR_ARGS = 2,
  /* a wait ended because the communicator's abort word was set (Communicator::abort) */
  OXCCL_ALLREDUCE_ERR_ABORTED = 3
};

/* The communicator's host words, 16 bytes of host memory mapped for the device, at
 * `abort_flag` of every argument block: word 0 is the abort word (the host sets it); word
 * OXCCL_HOST_WORD_FAILURE is where a kernel that records a failure in its scratch's ERROR
 * word also writes it (system scope), so the host reads it without synchronizing a stream
 * or ending a graph capture (ncclCommGetAsyncError). The first failure written stays. */
#define OXCCL_HOST_WORD_ABORT 0
#define OXCCL_HOST_WORD_FAILURE 1
#define OXCCL_HOST_WORDS 2

/* allreduce_oneshot_ll: every rank writes its input as LL16 packets (8 data bytes and the
 * call's flag twice per 16-byte store) into slot `rank` of every peer's packet half, then
 * reads the peers' packets from its own scratch and reduces in rank order. One kernel, no
 * separate barrier. Packet capacity: world_size * 2 * bytes(count) <= packet_half_bytes.
 *
 * allreduce_oneshot_ll128: the same with 128-byte lines: 8 lanes store one line in one
 * warp instruction, lanes 0-6 seven 16-byte units of the input, lane 7 the flag in all
 * four words; readers load a line in one instruction and take it when lane 7 matches.
 * Capacity: world_size * ceil(units / 7) * 128 <= packet_half_bytes (of the line region).
 * CUDA only (NVLink's 128-byte store atomicity); on HIP the kernel reports ERR_ARGS.
 *
 * allreduce_twoshot: in rounds of data_bytes: copy the input into "in" staging, barrier,
 * reduce chunk `rank` from every rank's staging (rank order) into "out" staging and the
 * output, barrier, copy every peer's reduced chunk into the output. Barriers are per
 * block (block b of every rank), through the INBOUND counters.
 *
 * allreduce_twoshot_zc (zero copy, registered buffers): barrier; rank r reduces chunk r
 * straight from every rank's registered input (peer_input[p], L2-only loads over NVLink)
 * and stores the result into every rank's registered output (peer_output[p], peer
 * stores); barrier (so every rank's output is complete when its kernel ends, and no peer
 * still reads its input). One pass, no staging, any size. input/output must be 16-byte
 * aligned and at the same offset of every rank's registered buffer.
 *
 * Any count; input/output need only element alignment (16-byte aligned ones take the
 * vector path). In place when input == output. */
typedef struct OxcclAllreduceArgs {
  const void* input;
  void* output;
  void* scratch[OXCCL_ALLREDUCE_MAX_RANKS];
  uint64_t count;             /* elements */
  uint64_t packet_offset;     /* byte offset of the packet region in every scratch */
  uint64_t packet_half_bytes; /* bytes of one parity half */
  uint64_t data_offset;       /* byte offset of the staging region */
  uint64_t data_bytes;        /* bytes of each staging buffer, a multiple of 16 */
  uint64_t timeout_ns;        /* bound of every wait; 0 = wait forever */
  /* The communicator's host words as the device sees them (OXCCL_HOST_WORDS above): a
   * non-zero abort word ends every wait with OXCCL_ALLREDUCE_ERR_ABORTED, read only by a
   * wait that has lasted 1 ms (Deadline::kAbortCheckNs); failures are mirrored into the
   * failure word. Null: neither. */
  const uint64_t* abort_flag;
  uint32_t rank;
  uint32_t world_size;
  uint32_t dtype; /* OXCCL_DTYPE_* */
  uint32_t op;    /* OXCCL_OP_* */
  uint32_t accum; /* OXCCL_ACCUM_* */
  uint32_t root;  /* broadcast: the rank whose input every rank gets; 0 otherwise */
  /* allreduce_twoshot_zc only (null otherwise): every rank's input / output as mapped in
   * this process (index = rank; [rank] is input / output itself). */
  const void* peer_input[OXCCL_ALLREDUCE_MAX_RANKS];
  void* peer_output[OXCCL_ALLREDUCE_MAX_RANKS];
} OxcclAllreduceArgs;

OXCCL_STATIC_ASSERT(sizeof(OxcclAllreduceArgs) == 288, "OxcclAllreduceArgs");

/* The all_to_all_v kernels (alltoallv_oneshot_ll, alltoallv_direct in
 * kernels/src/device/alltoall.cu; host stand-ins in collectives/src/algorithms/all_to_all_v/):
 * the scratch kernels' block plus the call's layout, in bytes, index = peer rank. Chunks are
 * byte ranges at any byte offset (the caller's displacements times the element size); data
 * only moves, so dtype, op and accum are unused. base.count is the bytes this rank sends in
 * all (the sum of send_bytes; informational, the kernels read the arrays).
 *   send_offset[p], send_bytes[p]   what this rank sends to rank p, in its input
 *   recv_offset[p], recv_bytes[p]   what this rank receives from rank p, in its output
 *   remote_offset[p]                where this rank's chunk lands in rank p's output (p's
 *                                   recv_offset[rank]); alltoallv_direct only
 * alltoallv_oneshot_ll: every rank has a slot of packet_half_bytes / world_size (rounded
 * down to 16 bytes) in every peer's current half; a chunk of B bytes needs
 * 2 * ceil(B / 16) * 16 bytes of it. A zero-byte chunk still sends one acknowledgement
 * packet (ll16_ack), so every rank hears from every peer every call.
 * alltoallv_direct: barrier; SM stores of every chunk into peer_output[p] + remote_offset[p];
 * barrier. peer_output must hold every rank's output as mapped here. */
typedef struct OxcclAlltoallvArgs {
  OxcclAllreduceArgs base;
  uint64_t send_offset[OXCCL_ALLREDUCE_MAX_RANKS];
  uint64_t send_bytes[OXCCL_ALLREDUCE_MAX_RANKS];
  uint64_t recv_offset[OXCCL_ALLREDUCE_MAX_RANKS];
  uint64_t recv_bytes[OXCCL_ALLREDUCE_MAX_RANKS];
  uint64_t remote_offset[OXCCL_ALLREDUCE_MAX_RANKS];
} OxcclAlltoallvArgs;

OXCCL_STATIC_ASSERT(sizeof(OxcclAlltoallvArgs) == 608, "OxcclAlltoallvArgs");

/* ---- PortChannel kernels (allreduce_port, reducescatter_port, allgather_port in
 * kernels/src/device/allreduce_port.cu; host stand-ins in
 * collectives/src/algorithms/port_channel/host.rs) -----------------------------------------
 * Every rank owns one scratch allocation registered for its transports, same layout:
 *   [0, PORT_SYNC_BYTES)                      sync area: ERROR (as SYNC_ERROR above)
 *   [send_offset, +S*world*chunk_bytes)       send[slot][s]: what leaves this rank, the
 *                                             proxy's source (s = p: reduce-scatter's chunk
 *                                             for peer p; s = 0: allreduce, all-gather)
 *   [recv_offset, +S*world*chunk_bytes)       recv[slot][rank r]: rank r's chunk, written
 *                                             by r's proxy
 * (S = OXCCL_PORT_ROUND_SLOTS.) A call moves its bytes in rounds of round_bytes (at most
 * one slot, so a call of a few slots still has several rounds to pipeline); round k
 * (global round g = *rounds + k) uses slot g % S. A
 * call stages round 0 in send[slot] and one thread per peer p pushes put_with_signal
 * (send[slot][s] -> p.recv[slot][rank]); then per round k: stage round k + 1, wait for
 * every peer's signal of round k, push round k + 1 to each peer as soon as its round k
 * landed, then reduce (or copy, all-gather) every rank's chunk of round k in rank order
 * into the output. Why three slots suffice: a peer sends round k only after it reduced
 * round k - 2 and received my round k - 1 (so my round k - 2 has left my send slot); my
 * push of round k + 1, made after its round k landed, therefore overwrites its recv slot
 * of round k - 2, which it is done reading, and I restage send slot k - 2 only after every
 * peer's round k - 1 landed. With two slots the push of k + 1 would overwrite the recv
 * slot of round k - 1, which the peer may still be reducing. For all-gather `count` is
 * one rank's input, for reduce-scatter one rank's output. */
#define OXCCL_PORT_ROUND_SLOTS 3
#define OXCCL_PORT_ALLREDUCE_SYNC_BYTES 4096
#define OXCCL_PORT_ALLREDUCE_SYNC_ERROR 8

typedef struct OxcclPortAllreduceArgs {
  const void* input;
  void* output;
  void* scratch;                    /* this rank's scratch (layout above) */
  const OxcclPortChannel* channels; /* [world_size] in device memory; [rank] unused */
  uint64_t count;                   /* elements */
  uint64_t chunk_bytes;             /* bytes of one slot, a multiple of 16 */
  uint64_t send_offset;
  uint64_t recv_offset;
  uint64_t timeout_ns; /* bound of every wait; 0 = the semaphores' spin limit only */
  const uint64_t* abort_flag; /* as in OxcclAllreduceArgs; null: none */
  uint32_t rank;
  uint32_t world_size;
  uint32_t dtype; /* OXCCL_DTYPE_* */
  uint32_t op;    /* OXCCL_OP_* */
  uint32_t accum; /* OXCCL_ACCUM_* */
  uint32_t round_bytes; /* bytes of one round of this call: a multiple of 16, at most
                           chunk_bytes (the slot); 0 = chunk_bytes */
  uint64_t* rounds; /* rounds this rank's port kernels completed, advanced by them. Device
                       memory even where the scratch is pinned host memory (TCP peers): no
                       one else reads it, and a call would cross PCIe twice for it. */
} OxcclPortAllreduceArgs;

OXCCL_STATIC_ASSERT(sizeof(OxcclPortAllreduceArgs) == 112, "OxcclPortAllreduceArgs");

#endif /* OXCCL_ABI_ALLREDUCE_H_ */
