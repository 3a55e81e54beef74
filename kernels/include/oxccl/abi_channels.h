/* oxccl/abi_channels.h: channel structs and channel-kernel argument blocks.
 *
 * Included by abi.h inside its extern "C" block (so bindgen sees it through abi.h); the
 * rules of abi.h hold here too: fixed-width fields, explicit padding, one argument block
 * per kernel, layouts asserted below and in Rust (channels crate tests).
 */
#ifndef OXCCL_ABI_CHANNELS_H_
#define OXCCL_ABI_CHANNELS_H_

/* ---- PortChannel trigger encoding (proxy protocol) -------------------------------------
 * fst: [63:61] kind bits (DATA | FLAG | SYNC, never 0, so fst != 0 marks a full slot)
 *      [60:52] semaphore id (9 bits)   [51:42] dst memory id (10 bits)
 *      [41:32] src memory id (10 bits) [31:0]  size in bytes
 * snd: [63:32] dst offset              [31:0]  src offset
 * A put larger than OXCCL_TRIGGER_MAX_SIZE is split into several triggers by the producer. */
enum {
  OXCCL_TRIGGER_DATA = 1,
  OXCCL_TRIGGER_FLAG = 2,
  OXCCL_TRIGGER_SYNC = 4,
  OXCCL_TRIGGER_KIND_SHIFT = 61,
  OXCCL_TRIGGER_SEMAPHORE_SHIFT = 52,
  OXCCL_TRIGGER_DST_MEMORY_SHIFT = 42,
  OXCCL_TRIGGER_SRC_MEMORY_SHIFT = 32,
  OXCCL_TRIGGER_MAX_SEMAPHORES = 512,
  OXCCL_TRIGGER_MAX_MEMORIES = 1024
};
/* Largest size (and offset + 1) one trigger carries: 2^32 - 1 bytes, rounded down to 16. */
#define OXCCL_TRIGGER_MAX_SIZE 0xfffffff0u

/* ---- SwitchChannel ---------------------------------------------------------------------- */

/* SwitchChannel device handle: a multicast address over the members' buffers (NVLS). */
typedef struct OxcclSwitchChannel {
  void* multicast; /* multicast mapping: multimem.ld_reduce / multimem.st go here */
  void* local;     /* this GPU's bound buffer (unicast view of the same bytes) */
  uint64_t bytes;  /* bytes of the object each member bound */
  uint64_t _pad0;
} OxcclSwitchChannel;

/* ---- Kernel argument blocks: channels --------------------------------------------------- */

/* Operations of channel_memory_op (one thread block or a grid cooperates on each). */
enum {
  OXCCL_MEMORY_OP_PUT = 1,              /* local[src..+bytes] -> remote[dst..] */
  OXCCL_MEMORY_OP_GET = 2,              /* remote[src..+bytes] -> local[dst..] */
  OXCCL_MEMORY_OP_PUT_PACKETS_LL16 = 3, /* local[src..+bytes] -> remote_packets[packet_offset..] */
  OXCCL_MEMORY_OP_GET_PACKETS_LL16 = 4, /* local_packets[packet_offset..] -> local[dst..+bytes] */
  OXCCL_MEMORY_OP_PUT_PACKETS_LL8 = 5,
  OXCCL_MEMORY_OP_GET_PACKETS_LL8 = 6,
  OXCCL_MEMORY_OP_SIGNAL = 7,           /* `iterations` signals (release) */
  OXCCL_MEMORY_OP_RELAXED_SIGNAL = 8,   /* `iterations` relaxed signals */
  OXCCL_MEMORY_OP_WAIT = 9,             /* waits for `iterations` signals */
  OXCCL_MEMORY_OP_PINGPONG = 10         /* `iterations` round trips; initiator signals first */
};

/* channel_memory_op. PUT with signal_after != 0: every block signals once after its share
 * (the receiver waits for gridDim.x signals). PINGPONG writes the time of the timed round
 * trips (all but the first) in nanoseconds to *elapsed_ns. Waits that time out write
 * OXCCL_WAIT_TIMEOUT to *status (else OXCCL_WAIT_OK); status/elapsed_ns may be null. */
typedef struct OxcclMemoryChannelArgs {
  OxcclMemoryChannel channel;
  uint64_t dst_offset;
  uint64_t src_offset;
  uint64_t bytes;
  uint64_t packet_offset;
  uint32_t op;
  uint32_t flag;
  uint32_t iterations;
  uint32_t initiator;
  uint32_t signal_after;
  uint32_t _pad0;
  uint32_t* status;
  uint64_t* elapsed_ns;
  uint64_t _pad1;
} OxcclMemoryChannelArgs;

/* Operations of channel_port_op (thread 0 of block 0 pushes; the others return). */
enum {
  OXCCL_PORT_OP_PUT = 1,             /* put, split into triggers of at most `chunk` bytes */
  OXCCL_PORT_OP_SIGNAL = 2,
  OXCCL_PORT_OP_PUT_WITH_SIGNAL = 3,
  OXCCL_PORT_OP_PUT_WITH_SIGNAL_AND_FLUSH = 4,
  OXCCL_PORT_OP_FLUSH = 5,
  OXCCL_PORT_OP_WAIT = 6,            /* waits for `iterations` signals */
  OXCCL_PORT_OP_PINGPONG = 7
};

/* channel_port_op; status and elapsed_ns as for channel_memory_op. */
typedef struct OxcclPortChannelArgs {
  OxcclPortChannel channel;
  uint64_t dst_offset;
  uint64_t src_offset;
  uint64_t bytes;
  uint64_t chunk;
  uint32_t op;
  uint32_t iterations;
  uint32_t initiator;
  uint32_t _pad0;
  uint32_t* status;
  uint64_t* elapsed_ns;
} OxcclPortChannelArgs;

/* Operations of channel_switch_op (NVLS, sm_90; absent on HIP). */
enum { OXCCL_SWITCH_OP_REDUCE = 1, OXCCL_SWITCH_OP_BROADCAST = 2 };

/* channel_switch_op: REDUCE sums `count` f32 at byte `offset` over every member into `out`;
 * BROADCAST stores `count` f32 from `out` at byte `offset` of every member. `offset` and
 * the buffers must be 16-byte aligned and count a multiple of 4. */
typedef struct OxcclSwitchChannelArgs {
  OxcclSwitchChannel channel;
  uint64_t offset;
  uint64_t count;
  void* out;
  uint32_t op;
  uint32_t dtype;
} OxcclSwitchChannelArgs;

OXCCL_STATIC_ASSERT(sizeof(OxcclSwitchChannel) == 32, "OxcclSwitchChannel");
OXCCL_STATIC_ASSERT(sizeof(OxcclMemoryChannelArgs) == 144, "OxcclMemoryChannelArgs");
OXCCL_STATIC_ASSERT(sizeof(OxcclPortChannelArgs) == 144, "OxcclPortChannelArgs");
OXCCL_STATIC_ASSERT(sizeof(OxcclSwitchChannelArgs) == 64, "OxcclSwitchChannelArgs");

#endif /* OXCCL_ABI_CHANNELS_H_ */
