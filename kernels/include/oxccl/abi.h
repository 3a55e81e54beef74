/* oxccl/abi.h: every struct that crosses the boundary between Rust and device code.
 *
 * This header is the single source of truth. Device code includes it; Rust gets the same
 * structs through bindgen (kernels/build.rs) and asserts sizes and alignments in tests.
 *
 * Rules:
 * - Plain C: fixed-width integers and pointers only (64-bit pointers on every target).
 * - No implicit padding: where alignment would insert some, an explicit `_padN` field is
 *   there instead, so every byte of a struct is initialised when Rust builds it and the
 *   byte image passed to a launch is fully defined.
 * - Every kernel takes exactly one parameter: its argument block, by value. Kernel names
 *   are given next to their argument block.
 * - Codes for data types, reduce ops and accumulation types are the HAL's
 *   (`DataType::code`, `ReduceOp::code`, `AccumType::code`).
 */
#ifndef OXCCL_ABI_H_
#define OXCCL_ABI_H_

#include <stdint.h>

#ifdef __cplusplus
#define OXCCL_STATIC_ASSERT(cond, msg) static_assert(cond, msg)
#define OXCCL_ALIGNOF(t) alignof(t)
#else
#define OXCCL_STATIC_ASSERT(cond, msg) _Static_assert(cond, msg)
#define OXCCL_ALIGNOF(t) _Alignof(t)
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Codes (mirror oxccl_hal::{DataType, ReduceOp, AccumType}::code) ------------------ */
enum {
  OXCCL_DTYPE_F32 = 0,
  OXCCL_DTYPE_F16 = 1,
  OXCCL_DTYPE_BF16 = 2,
  OXCCL_DTYPE_FP8_E4M3 = 3,
  OXCCL_DTYPE_FP8_E5M2 = 4,
  OXCCL_DTYPE_FP8_E4M3_FNUZ = 5,
  OXCCL_DTYPE_FP8_E5M2_FNUZ = 6,
  OXCCL_DTYPE_FP8_E4M3B15 = 7,
  /* Reduced in their own type (integers wrap), no accumulation choice. */
  OXCCL_DTYPE_I8 = 8,
  OXCCL_DTYPE_U8 = 9,
  OXCCL_DTYPE_I32 = 10,
  OXCCL_DTYPE_U32 = 11,
  OXCCL_DTYPE_I64 = 12,
  OXCCL_DTYPE_U64 = 13,
  OXCCL_DTYPE_F64 = 14,
  OXCCL_DTYPE_COUNT = 15
};
enum { OXCCL_OP_SUM = 0, OXCCL_OP_PROD = 1, OXCCL_OP_MIN = 2, OXCCL_OP_MAX = 3, OXCCL_OP_AVG = 4 };
enum { OXCCL_ACCUM_AUTO = 0, OXCCL_ACCUM_NATIVE = 1, OXCCL_ACCUM_F16 = 2, OXCCL_ACCUM_F32 = 3 };

/* Result codes written by waiting kernels. */
enum { OXCCL_WAIT_PENDING = 0, OXCCL_WAIT_OK = 1, OXCCL_WAIT_TIMEOUT = 2 };

/* ---- LL packets ----------------------------------------------------------------------- */

/* LL16: 16 bytes written with one 16-byte store: two 4-byte data words, each followed by
 * a copy of the flag. A reader that sees both flags equal to the expected value knows both
 * data words are from the same store (16-byte stores are single transactions). */
typedef struct __attribute__((aligned(16))) OxcclLL16Packet {
  uint32_t data1;
  uint32_t flag1;
  uint32_t data2;
  uint32_t flag2;
} OxcclLL16Packet;

/* LL8: 8 bytes written with one 8-byte store: 4 bytes of data and the flag. */
typedef struct __attribute__((aligned(8))) OxcclLL8Packet {
  uint32_t data;
  uint32_t flag;
} OxcclLL8Packet;

/* ---- Semaphores ----------------------------------------------------------------------- */

/* Device-to-device semaphore, one direction pair between this GPU and a peer.
 * signal(): release-add 1 to `remote_inbound` (the peer's `inbound`).
 * wait():   `*expected_inbound += 1`, then acquire-poll `inbound` until it reaches it. */
typedef struct OxcclDeviceSemaphore {
  uint64_t* inbound;          /* local counter that the peer signals */
  uint64_t* remote_inbound;   /* the peer's counter that this GPU signals (mapped peer memory) */
  uint64_t* expected_inbound; /* local: how many signals have been waited for so far */
  uint64_t max_spins;         /* polls before a wait reports a timeout; 0 = wait forever */
} OxcclDeviceSemaphore;

/* Host-to-device semaphore: the host (proxy) signals `inbound` (host-visible memory or
 * device memory written through a mapping); the device waits on it like above. */
typedef struct OxcclHostDeviceSemaphore {
  uint64_t* inbound;
  uint64_t* expected_inbound;
  uint64_t max_spins;
  uint64_t _pad0;
} OxcclHostDeviceSemaphore;

/* ---- Channels ------------------------------------------------------------------------- */

/* MemoryChannel device handle: direct loads/stores into a peer's registered buffer. */
typedef struct OxcclMemoryChannel {
  OxcclDeviceSemaphore semaphore;
  void* remote;        /* peer's buffer, mapped here (put/get destination/source) */
  void* local;         /* this GPU's registered buffer */
  void* remote_packets; /* peer's packet (scratch) buffer, for packet put */
  void* local_packets;  /* this GPU's packet buffer, for packet get */
} OxcclMemoryChannel;

/* One trigger pushed by a GPU thread into a PortChannel's FIFO: two 64-bit words whose
 * encoding belongs to the proxy (offsets, size, memory ids, kind). `fst == 0` means
 * "slot empty", so encodings never produce 0 there. */
typedef struct __attribute__((aligned(16))) OxcclProxyTrigger {
  uint64_t fst;
  uint64_t snd;
} OxcclProxyTrigger;

/* FIFO in host-visible memory between GPU threads (producers) and the proxy (consumer). */
typedef struct OxcclFifo {
  OxcclProxyTrigger* triggers; /* ring of `size` slots */
  uint64_t* head;              /* device memory, two words: [0] next slot to claim (atomic
                                  add), [1] the last tail a producer read (a cache) */
  uint64_t* tail;              /* host-visible: slots the proxy has consumed */
  uint32_t size;               /* number of slots (a power of two) */
  uint32_t _pad0;
} OxcclFifo;

/* PortChannel device handle: the GPU asks the proxy to move data (copy engine / RDMA). */
typedef struct OxcclPortChannel {
  OxcclFifo fifo;
  OxcclHostDeviceSemaphore semaphore;
  uint32_t semaphore_id;
  uint32_t dst_memory_id;
  uint32_t src_memory_id;
  uint32_t _pad0;
} OxcclPortChannel;

/* ---- Kernel argument blocks: transport tests ----------------------------------------- */

/* oxccl_test_signal: one thread does a system-scope release add of `value` onto *flag
 * (the fire-and-forget `red.release.sys` / `global_atomic_add_x2 sc1` path). */
typedef struct OxcclSignalArgs {
  uint64_t* flag;
  uint64_t value;
} OxcclSignalArgs;

/* oxccl_test_wait: one thread acquire-polls *flag until it is >= expected, at most
 * `max_spins` polls (0 = no bound); writes OXCCL_WAIT_OK or OXCCL_WAIT_TIMEOUT to *result. */
typedef struct OxcclWaitArgs {
  uint64_t* flag;
  uint64_t expected;
  uint64_t max_spins;
  uint32_t* result;
} OxcclWaitArgs;

/* oxccl_copy (collectives' copy lane): grid-stride copy of `bytes` bytes from src to dst,
 * any alignment, the ranges not overlapping.
 * oxccl_test_store16: grid-stride copy of `bytes` bytes from src to dst with 16-byte loads
 * and stores (the tail in smaller units). dst and src must be 16-byte aligned. */
typedef struct OxcclCopyArgs {
  void* dst;
  const void* src;
  uint64_t bytes;
} OxcclCopyArgs;

/* oxccl_test_fill_pattern: data[i] = pattern(seed, i) for i < count.
 * oxccl_test_check_pattern: adds the number of i with data[i] != pattern(seed, i) to
 * *mismatches (atomically; the caller zeroes it). */
typedef struct OxcclPatternArgs {
  uint32_t* data;
  uint64_t count;
  uint32_t seed;
  uint32_t _pad0;
  uint64_t* mismatches;
} OxcclPatternArgs;

/* ---- Kernel argument blocks: number-format and reduction self-tests ------------------ */

/* oxccl_selftest_decode: output[i] = decode(dtype, input element i) as f32, i < count. */
typedef struct OxcclSelftestDecodeArgs {
  const void* input;
  float* output;
  uint64_t count;
  uint32_t dtype;
  uint32_t _pad0;
} OxcclSelftestDecodeArgs;

/* oxccl_selftest_encode: output element i = encode(dtype, input[i]), i < count. */
typedef struct OxcclSelftestEncodeArgs {
  const float* input;
  void* output;
  uint64_t count;
  uint32_t dtype;
  uint32_t _pad0;
} OxcclSelftestEncodeArgs;

#define OXCCL_SELFTEST_MAX_INPUTS 8

/* oxccl_selftest_reduce: output[i] = reduce(op, accum; inputs[0][i], ..., inputs[n-1][i])
 * for i < count, through the 16-byte vector path of reduce.hpp (the tail element-wise).
 * Every buffer must be 16-byte aligned. */
typedef struct OxcclSelftestReduceArgs {
  const void* inputs[OXCCL_SELFTEST_MAX_INPUTS];
  void* output;
  uint64_t count;
  uint32_t num_inputs;
  uint32_t dtype;
  uint32_t op;
  uint32_t accum;
} OxcclSelftestReduceArgs;

/* ---- Kernel argument block: the PreMulSum pre-multiply --------------------------------- */

/* oxccl_scale (src/device/scale.cu): output element i = scalar * input element i, i < count,
 * every element type: float formats multiply in f32 and round once to the type (the product
 * of two elements is exact in f32), f64 in f64, integers wrap. The scalar is one element of
 * `dtype`: read from `scalar` in device memory when the kernel runs (NCCL's
 * ncclScalarDevice) when that is not NULL, else `scalar_bits` (its bit pattern in the low
 * bytes). In place (input == output) is allowed; otherwise the buffers must not overlap. */
typedef struct OxcclScaleArgs {
  const void* input;
  void* output;
  const void* scalar;
  uint64_t scalar_bits;
  uint64_t count;
  uint32_t dtype;
  uint32_t _pad0;
} OxcclScaleArgs;

#include "abi_channels.h"

/* ---- Layout checks (Rust asserts the same numbers) ----------------------------------- */
OXCCL_STATIC_ASSERT(sizeof(void*) == 8, "oxccl needs 64-bit pointers");
OXCCL_STATIC_ASSERT(sizeof(OxcclLL16Packet) == 16 && OXCCL_ALIGNOF(OxcclLL16Packet) == 16, "LL16");
OXCCL_STATIC_ASSERT(sizeof(OxcclLL8Packet) == 8 && OXCCL_ALIGNOF(OxcclLL8Packet) == 8, "LL8");
OXCCL_STATIC_ASSERT(sizeof(OxcclDeviceSemaphore) == 32, "OxcclDeviceSemaphore");
OXCCL_STATIC_ASSERT(sizeof(OxcclHostDeviceSemaphore) == 32, "OxcclHostDeviceSemaphore");
OXCCL_STATIC_ASSERT(sizeof(OxcclMemoryChannel) == 64, "OxcclMemoryChannel");
OXCCL_STATIC_ASSERT(sizeof(OxcclProxyTrigger) == 16, "OxcclProxyTrigger");
OXCCL_STATIC_ASSERT(sizeof(OxcclFifo) == 32, "OxcclFifo");
OXCCL_STATIC_ASSERT(sizeof(OxcclPortChannel) == 80, "OxcclPortChannel");
OXCCL_STATIC_ASSERT(sizeof(OxcclSignalArgs) == 16, "OxcclSignalArgs");
OXCCL_STATIC_ASSERT(sizeof(OxcclWaitArgs) == 32, "OxcclWaitArgs");
OXCCL_STATIC_ASSERT(sizeof(OxcclCopyArgs) == 24, "OxcclCopyArgs");
OXCCL_STATIC_ASSERT(sizeof(OxcclPatternArgs) == 32, "OxcclPatternArgs");
OXCCL_STATIC_ASSERT(sizeof(OxcclSelftestDecodeArgs) == 32, "OxcclSelftestDecodeArgs");
OXCCL_STATIC_ASSERT(sizeof(OxcclSelftestEncodeArgs) == 32, "OxcclSelftestEncodeArgs");
OXCCL_STATIC_ASSERT(sizeof(OxcclSelftestReduceArgs) == 96, "OxcclSelftestReduceArgs");
OXCCL_STATIC_ASSERT(sizeof(OxcclScaleArgs) == 48, "OxcclScaleArgs");

#include "abi_allreduce.h"

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* OXCCL_ABI_H_ */
