/*
 * C test of liboxccl_nccl on the host backend (no GPU): compiled against
 * nccl-api/include/nccl.h and linked against liboxccl_nccl.so by ci/nccl-api-test.sh,
 * run with OXCCL_BACKEND=host. Covers the life cycle, error codes and strings, bad
 * arguments, the unique id, real allreduces across forked processes and across threads
 * (ncclCommInitAll) checked against a reference computed here, splits, groups (inits,
 * splits and allreduces of several ranks driven from one thread, and failing groups),
 * non-blocking communicators, PreMulSum operators (allreduce, reduce-scatter and reduce
 * across processes, and their bad uses), and calls that must be forwarded to a real NCCL
 * that is absent.
 */
#define _GNU_SOURCE
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "nccl.h"

static int failures = 0;
static const char* who = "main";

#define CHECK(cond, ...)                                                   \
  do {                                                                     \
    if (!(cond)) {                                                         \
      fprintf(stderr, "[%s] FAIL %s:%d: %s: ", who, __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                        \
      fprintf(stderr, " (last error: %s)\n", ncclGetLastError(NULL));      \
      failures++;                                                          \
    }                                                                      \
  } while (0)

#define EXPECT(call, code) \
  do { ncclResult_t r_ = (call); CHECK(r_ == (code), "%s returned %d, expected %d", #call, (int)r_, (int)(code)); } while (0)
#define OK(call) EXPECT(call, ncclSuccess)

/* Per thread: the ncclCommInitAll test fills inputs and references on two threads at once. */
static _Thread_local uint64_t rng_state;
static uint64_t next_u64(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return rng_state;
}

/* The input of `rank` for a test: small integers (exact in fp32 sums) plus a fraction. */
static void fill(float* x, size_t n, int rank, int salt) {
  rng_state = 0x9e3779b97f4a7c15ull ^ ((uint64_t)rank << 32) ^ (uint64_t)salt * 7919u ^ n;
  for (size_t i = 0; i < n; i++) x[i] = (float)((int64_t)(next_u64() % 2001) - 1000) / 8.0f;
}

static int last_error_contains(const char* needle) {
  const char* e = ncclGetLastError(NULL);
  return e && strstr(e, needle) != NULL;
}

/* Small integers in bf16 and fp16 (exact, and so are their sums over a few ranks). */
static uint16_t bf16_of(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return (uint16_t)(u >> 16);
}
static uint16_t fp16_of_int(int k) {
  if (k == 0) return 0;
  uint16_t sign = k < 0 ? 0x8000 : 0;
  unsigned m = (unsigned)(k < 0 ? -k : k);
  int e = 0;
  while ((m >> e) > 1) e++;
  /* 10 mantissa bits hold integers below 2048 exactly. */
  return (uint16_t)(sign | ((e + 15) << 10) | (((m << 10) >> e) & 0x3ff));
}

/* Half-precision allreduce (sum) of small integers, checked exactly. */
static void half_suite(ncclComm_t comm, int rank, int nranks) {
  size_t n = 70001;
  uint16_t* b = malloc(n * 2);
  uint16_t* h = malloc(n * 2);
  for (size_t i = 0; i < n; i++) {
    int k = (int)((i * 7 + (size_t)rank * 13) % 17) - 8;
    b[i] = bf16_of((float)k);
    h[i] = fp16_of_int(k);
  }
  OK(ncclAllReduce(b, b, n, ncclBfloat16, ncclSum, comm, NULL));
  OK(ncclAllReduce(h, h, n, ncclFloat16, ncclSum, comm, NULL));
  size_t bad_b = 0, bad_h = 0;
  for (size_t i = 0; i < n; i++) {
    int sum = 0;
    for (int r = 0; r < nranks; r++) sum += (int)((i * 7 + (size_t)r * 13) % 17) - 8;
    bad_b += b[i] != bf16_of((float)sum);
    bad_h += h[i] != fp16_of_int(sum);
  }
  CHECK(bad_b == 0, "bf16 sum: %zu of %zu wrong", bad_b, n);
  CHECK(bad_h == 0, "fp16 sum: %zu of %zu wrong", bad_h, n);
  free(b);
  free(h);
}

static const size_t COUNTS[] = {1, 3, 1000, 12345, (1u << 20) + 7};
#define NCOUNTS (sizeof(COUNTS) / sizeof(COUNTS[0]))

/* Allreduces of every count, in and out of place, sum/max/avg, checked against the inputs
 * of every rank computed here (rank order, as oxccl reduces). */
static void allreduce_suite(ncclComm_t comm, int rank, int nranks, int salt) {
  for (size_t ci = 0; ci < NCOUNTS; ci++) {
    size_t n = COUNTS[ci];
    float* in = malloc(n * sizeof(float));
    float* out = malloc(n * sizeof(float));
    float* peer = malloc(n * sizeof(float));
    float* sum = calloc(n, sizeof(float));
    float* max = malloc(n * sizeof(float));
    for (int r = 0; r < nranks; r++) {
      fill(peer, n, r, salt + (int)ci);
      for (size_t i = 0; i < n; i++) {
        sum[i] = r == 0 ? peer[i] : sum[i] + peer[i];
        max[i] = r == 0 ? peer[i] : fmaxf(max[i], peer[i]);
      }
    }
    fill(in, n, rank, salt + (int)ci);
    OK(ncclAllReduce(in, out, n, ncclFloat32, ncclSum, comm, NULL));
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += out[i] != sum[i];
    CHECK(bad == 0, "sum of %zu floats: %zu wrong", n, bad);
    /* In place. */
    memcpy(out, in, n * sizeof(float));
    OK(ncclAllReduce(out, out, n, ncclFloat32, ncclMax, comm, NULL));
    bad = 0;
    for (size_t i = 0; i < n; i++) bad += out[i] != max[i];
    CHECK(bad == 0, "in-place max of %zu floats: %zu wrong", n, bad);
    OK(ncclAllReduce(in, out, n, ncclFloat32, ncclAvg, comm, NULL));
    bad = 0;
    for (size_t i = 0; i < n; i++) bad += fabsf(out[i] - sum[i] / nranks) > 1e-5f * (1.0f + fabsf(sum[i]));
    CHECK(bad == 0, "avg of %zu floats: %zu wrong", n, bad);
    free(in); free(out); free(peer); free(sum); free(max);
  }
}

/* Integer and f64 allreduces, served by oxccl: sums wrap (int32 near its limits, uint8),
 * max and min compare with the type's sign, the integer average truncates toward zero, and
 * f64 sums of values below f32's precision are exact. References computed here. */
static void integer_suite(ncclComm_t comm, int rank, int nranks) {
  static const size_t N[] = {1, 3, 1001, 12345};
  for (size_t ci = 0; ci < 4; ci++) {
    size_t n = N[ci];
    int32_t* i32 = malloc(n * sizeof(int32_t));
    int32_t* i32_sum = malloc(n * sizeof(int32_t));
    int32_t* i32_avg = malloc(n * sizeof(int32_t));
    int64_t* i64 = malloc(n * sizeof(int64_t));
    int64_t* i64_max = malloc(n * sizeof(int64_t));
    uint8_t* u8 = malloc(n);
    uint8_t* u8_sum = malloc(n);
    double* f64 = malloc(n * sizeof(double));
    double* f64_sum = malloc(n * sizeof(double));
    for (int r = 0; r <= nranks; r++) {
      /* r == nranks: this rank's own input, last, into the send buffers. */
      int me = r == nranks ? rank : r;
      rng_state = 0x51afd7ed558ccd1dull ^ ((uint64_t)me << 36) ^ (uint64_t)ci * 1299709u ^ n;
      for (size_t i = 0; i < n; i++) {
        uint64_t h = next_u64();
        int32_t a = (int32_t)(uint32_t)h; /* the whole range: sums wrap */
        int64_t b = (int64_t)h;
        uint8_t c = (uint8_t)(h >> 40);
        double d = (double)(int64_t)(h >> 11) / 9007199254740992.0; /* 53-bit fractions */
        if (r == nranks) {
          i32[i] = a; i64[i] = b; u8[i] = c; f64[i] = d;
        } else if (r == 0) {
          i32_sum[i] = a; i64_max[i] = b; u8_sum[i] = c; f64_sum[i] = d;
        } else {
          i32_sum[i] = (int32_t)((uint32_t)i32_sum[i] + (uint32_t)a);
          i64_max[i] = b > i64_max[i] ? b : i64_max[i];
          u8_sum[i] = (uint8_t)(u8_sum[i] + c);
          f64_sum[i] += d;
        }
      }
    }
    for (size_t i = 0; i < n; i++) i32_avg[i] = i32_sum[i] / nranks;
    int32_t* o32 = malloc(n * sizeof(int32_t));
    OK(ncclAllReduce(i32, o32, n, ncclInt32, ncclSum, comm, NULL));
    CHECK(memcmp(o32, i32_sum, n * sizeof(int32_t)) == 0, "int32 sum of %zu", n);
    OK(ncclAllReduce(i32, o32, n, ncclInt32, ncclAvg, comm, NULL));
    CHECK(memcmp(o32, i32_avg, n * sizeof(int32_t)) == 0, "int32 avg of %zu", n);
    OK(ncclAllReduce(i64, i64, n, ncclInt64, ncclMax, comm, NULL)); /* in place */
    CHECK(memcmp(i64, i64_max, n * sizeof(int64_t)) == 0, "in-place int64 max of %zu", n);
    OK(ncclAllReduce(u8, u8, n, ncclUint8, ncclSum, comm, NULL));
    CHECK(memcmp(u8, u8_sum, n) == 0, "uint8 sum of %zu", n);
    OK(ncclAllReduce(f64, f64, n, ncclFloat64, ncclSum, comm, NULL));
    CHECK(memcmp(f64, f64_sum, n * sizeof(double)) == 0, "float64 sum of %zu", n);
    free(i32); free(i32_sum); free(i32_avg); free(i64); free(i64_max);
    free(u8); free(u8_sum); free(f64); free(f64_sum); free(o32);
  }
}

/* Bytes of `rank`'s all-gather input (never all zero, different per rank and call). */
static void fill_bytes(unsigned char* x, size_t n, int rank, int salt) {
  rng_state = 0x2545f4914f6cdd1dull ^ ((uint64_t)rank << 40) ^ (uint64_t)salt * 104729u ^ n;
  for (size_t i = 0; i < n; i++) x[i] = (unsigned char)(next_u64() | 1);
}

/* All-gathers of types of every size, counts that are not powers of two, out of place and
 * in place (sendbuff = recvbuff + rank * count), the output poisoned first; every slot
 * compared byte for byte with that rank's input computed here. */
static void allgather_suite(ncclComm_t comm, int rank, int nranks) {
  static const ncclDataType_t TYPES[] = {ncclInt8, ncclFloat16, ncclInt32, ncclFloat64};
  static const size_t SIZES[] = {1, 2, 4, 8};
  static const size_t GATHER_COUNTS[] = {1, 3, 1001, 12345};
  int salt = 0;
  for (size_t t = 0; t < 4; t++) {
    for (size_t ci = 0; ci < 4; ci++) {
      size_t n = GATHER_COUNTS[ci], bytes = n * SIZES[t];
      unsigned char* in = malloc(bytes);
      unsigned char* out = malloc(bytes * nranks);
      unsigned char* want = malloc(bytes);
      for (int in_place = 0; in_place < 2; in_place++) {
        salt++;
        memset(out, 0xa5, bytes * nranks);
        unsigned char* send = in_place ? out + (size_t)rank * bytes : in;
        fill_bytes(send, bytes, rank, salt);
        OK(ncclAllGather(send, out, n, TYPES[t], comm, NULL));
        size_t bad = 0;
        for (int r = 0; r < nranks; r++) {
          fill_bytes(want, bytes, r, salt);
          bad += memcmp(out + (size_t)r * bytes, want, bytes) != 0;
        }
        CHECK(bad == 0, "all-gather of %zu x %zu bytes (in place %d): %zu slots wrong", n, SIZES[t], in_place, bad);
      }
      free(in); free(out); free(want);
    }
  }
  /* Another rank's slot as the input overlaps without being in place. */
  if (nranks > 1) {
    float* x = calloc(4 * (size_t)nranks, sizeof(float));
    EXPECT(ncclAllGather(x + 4 * ((rank + 1) % nranks), x, 4, ncclFloat32, comm, NULL), ncclInvalidArgument);
    CHECK(last_error_contains("not in place"), "overlap error names the in-place rule");
    free(x);
  }
}

/* Reduce-scatters of fp32 (sum out of place, max in place: recvbuff = sendbuff + rank *
 * count) at counts that are not powers of two, checked against this rank's chunk of every
 * rank's input computed here, reduced in rank order. */
static void reducescatter_suite(ncclComm_t comm, int rank, int nranks) {
  static const size_t RS_COUNTS[] = {1, 3, 1001, 12345};
  for (size_t ci = 0; ci < 4; ci++) {
    size_t n = RS_COUNTS[ci], all = n * (size_t)nranks;
    float* in = malloc(all * sizeof(float));
    float* out = malloc(n * sizeof(float));
    float* peer = malloc(all * sizeof(float));
    float* sum = malloc(n * sizeof(float));
    float* max = malloc(n * sizeof(float));
    for (int r = 0; r < nranks; r++) {
      fill(peer, all, r, 500 + (int)ci);
      for (size_t i = 0; i < n; i++) {
        float v = peer[(size_t)rank * n + i];
        sum[i] = r == 0 ? v : sum[i] + v;
        max[i] = r == 0 ? v : fmaxf(max[i], v);
      }
    }
    fill(in, all, rank, 500 + (int)ci);
    for (size_t i = 0; i < n; i++) out[i] = -1e30f;
    OK(ncclReduceScatter(in, out, n, ncclFloat32, ncclSum, comm, NULL));
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += out[i] != sum[i];
    CHECK(bad == 0, "reduce-scatter sum of %zu floats: %zu wrong", n, bad);
    float* own = in + (size_t)rank * n;
    OK(ncclReduceScatter(in, own, n, ncclFloat32, ncclMax, comm, NULL));
    bad = 0;
    for (size_t i = 0; i < n; i++) bad += own[i] != max[i];
    CHECK(bad == 0, "in-place reduce-scatter max of %zu floats: %zu wrong", n, bad);
    free(in); free(out); free(peer); free(sum); free(max);
  }
}

/* All-to-alls of 1- and 8-byte types at counts that are not powers of two, the output
 * poisoned first: slot r must be chunk `rank` of rank r's input, computed here. */
static void alltoall_suite(ncclComm_t comm, int rank, int nranks) {
  static const ncclDataType_t TYPES[] = {ncclUint8, ncclInt64};
  static const size_t SIZES[] = {1, 8};
  static const size_t A2A_COUNTS[] = {1, 3, 1001, 12345};
  int salt = 900;
  for (size_t t = 0; t < 2; t++) {
    for (size_t ci = 0; ci < 4; ci++) {
      size_t n = A2A_COUNTS[ci], bytes = n * SIZES[t], total = bytes * (size_t)nranks;
      unsigned char* in = malloc(total);
      unsigned char* out = malloc(total);
      unsigned char* want = malloc(total);
      salt++;
      fill_bytes(in, total, rank, salt);
      memset(out, 0xa5, total);
      OK(ncclAlltoAll(in, out, n, TYPES[t], comm, NULL));
      size_t bad = 0;
      for (int r = 0; r < nranks; r++) {
        fill_bytes(want, total, r, salt);
        bad += memcmp(out + (size_t)r * bytes, want + (size_t)rank * bytes, bytes) != 0;
      }
      CHECK(bad == 0, "all-to-all of %zu x %zu bytes: %zu slots wrong", n, SIZES[t], bad);
      free(in); free(out); free(want);
    }
  }
}

/* Broadcasts from every root, out of place (the other ranks pass a NULL sendbuff, which
 * NCCL ignores) and in place (ncclBcast), of 2- and 8-byte types at odd counts, the output
 * poisoned first, checked against the root's input computed here. */
static void broadcast_suite(ncclComm_t comm, int rank, int nranks) {
  static const size_t BC_COUNTS[] = {1, 1001, 12345};
  int salt = 1300;
  for (int root = 0; root < nranks; root++) {
    for (size_t ci = 0; ci < 3; ci++) {
      size_t n = BC_COUNTS[ci], bytes = n * 8;
      unsigned char* in = malloc(bytes);
      unsigned char* out = malloc(bytes);
      unsigned char* want = malloc(bytes);
      salt++;
      fill_bytes(want, bytes, root, salt);
      memcpy(in, want, bytes);
      memset(out, 0xa5, bytes);
      OK(ncclBroadcast(rank == root ? in : NULL, out, n, ncclFloat64, root, comm, NULL));
      CHECK(memcmp(out, want, bytes) == 0, "broadcast of %zu doubles from root %d", n, root);
      if (rank == root) memcpy(out, want, bytes); else memset(out, 0xa5, bytes);
      OK(ncclBcast(out, 4 * n, ncclFloat16, root, comm, NULL));
      CHECK(memcmp(out, want, bytes) == 0, "in-place bcast of %zu halves from root %d", 4 * n, root);
      free(in); free(out); free(want);
    }
  }
}

/* Reduces to every root of floats at counts that are not powers of two: a sum out of place
 * (the root's output poisoned first; the other ranks pass a NULL recvbuff, or a poisoned
 * one that must stay as it was) and a max in place on the root, checked against the
 * reduction computed here (small multiples of 1/8: exact in any order). */
static void reduce_suite(ncclComm_t comm, int rank, int nranks) {
  static const size_t RD_COUNTS[] = {1, 3, 1001, 12345};
  for (int root = 0; root < nranks; root++) {
    for (size_t ci = 0; ci < 4; ci++) {
      size_t n = RD_COUNTS[ci];
      int salt = 1700 + 10 * root + (int)ci;
      float* in = malloc(n * sizeof(float));
      float* out = malloc(n * sizeof(float));
      float* peer = malloc(n * sizeof(float));
      float* sum = malloc(n * sizeof(float));
      float* max = malloc(n * sizeof(float));
      for (int r = 0; r < nranks; r++) {
        fill(peer, n, r, salt);
        for (size_t i = 0; i < n; i++) {
          sum[i] = r == 0 ? peer[i] : sum[i] + peer[i];
          max[i] = r == 0 ? peer[i] : fmaxf(max[i], peer[i]);
        }
      }
      fill(in, n, rank, salt);
      for (size_t i = 0; i < n; i++) out[i] = -1e30f;
      int null_out = rank != root && ci % 2 == 1;
      OK(ncclReduce(in, null_out ? NULL : out, n, ncclFloat32, ncclSum, root, comm, NULL));
      size_t bad = 0;
      for (size_t i = 0; i < n; i++) bad += out[i] != (rank == root ? sum[i] : -1e30f);
      CHECK(bad == 0, "reduce sum of %zu floats to root %d: %zu wrong", n, root, bad);
      OK(ncclReduce(in, in, n, ncclFloat32, ncclMax, root, comm, NULL));
      fill(peer, n, rank, salt);
      bad = 0;
      for (size_t i = 0; i < n; i++) bad += in[i] != (rank == root ? max[i] : peer[i]);
      CHECK(bad == 0, "in-place reduce max of %zu floats to root %d: %zu wrong", n, root, bad);
      free(in); free(out); free(peer); free(sum); free(max);
    }
  }
}

/* ---- PreMulSum ------------------------------------------------------------------------- */

static int pm_is_int(ncclDataType_t t) { return t == ncclInt32 || t == ncclUint8; }
static size_t pm_size(ncclDataType_t t) {
  return t == ncclUint8 ? 1 : t == ncclBfloat16 ? 2 : t == ncclFloat64 ? 8 : 4;
}

/* Element i of buffer `p` as a double (float types) or as its zero-extended bits (ints). */
static double pm_get(ncclDataType_t t, const void* p, size_t i) {
  const unsigned char* b = (const unsigned char*)p + i * pm_size(t);
  if (t == ncclFloat32) { float f; memcpy(&f, b, 4); return f; }
  if (t == ncclBfloat16) { uint16_t h; memcpy(&h, b, 2); uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f; }
  if (t == ncclFloat64) { double d; memcpy(&d, b, 8); return d; }
  return 0;
}
static uint64_t pm_get_int(ncclDataType_t t, const void* p, size_t i) {
  const unsigned char* b = (const unsigned char*)p + i * pm_size(t);
  if (t == ncclUint8) return b[0];
  uint32_t u; memcpy(&u, b, 4); return u;
}
static void pm_put(ncclDataType_t t, void* p, size_t i, double v, uint64_t bits) {
  unsigned char* b = (unsigned char*)p + i * pm_size(t);
  if (t == ncclFloat32) { float f = (float)v; memcpy(b, &f, 4); }
  else if (t == ncclBfloat16) { uint16_t h = bf16_of((float)v); memcpy(b, &h, 2); }
  else if (t == ncclFloat64) memcpy(b, &v, 8);
  else if (t == ncclUint8) b[0] = (unsigned char)bits;
  else { uint32_t u = (uint32_t)bits; memcpy(b, &u, 4); }
}

/* `rank`'s input: multiples of 1/8 (fp32, fp64) or small integers (bf16), so every product
 * and sum below is exact; the whole range (int32, uint8), so they wrap. */
static void pm_fill(ncclDataType_t t, void* p, size_t n, int rank, int salt) {
  rng_state = 0x6a09e667f3bcc909ull ^ ((uint64_t)rank << 36) ^ (uint64_t)salt * 104723u ^ n;
  for (size_t i = 0; i < n; i++) {
    uint64_t h = next_u64();
    pm_put(t, p, i, t == ncclBfloat16 ? (double)((int)(h % 17) - 8) : (double)((int)(h % 2001) - 1000) / 8.0,
           t == ncclUint8 ? (h >> 40) : h);
  }
}

/* `rank`'s scalar, different on every rank, negative on some. */
static void pm_scalar(ncclDataType_t t, int rank, void* out) {
  double v = (rank % 2 ? -1.0 : 1.0) * (rank + 1) * (t == ncclBfloat16 ? 1.0 : 0.5);
  pm_put(t, out, 0, v, t == ncclUint8 ? (uint64_t)(7 + 2 * rank) : (uint64_t)(uint32_t)(3 - 5 * rank));
}

/* PreMulSum allreduce, reduce-scatter and reduce (every root in turn) of fp32 and int32
 * (scalar on the host, ncclScalarHostImmediate) and bf16, uint8 and fp64 (scalar in memory,
 * ncclScalarDevice: host memory on the host backend, read when the call runs; set after the
 * operator was made), in and out of place, outputs poisoned first, counts that are not
 * powers of two; checked against every rank's input times its scalar, summed here. */
static void premul_suite(ncclComm_t comm, int rank, int nranks) {
  static const ncclDataType_t TYPES[] = {ncclFloat32, ncclInt32, ncclBfloat16, ncclUint8, ncclFloat64};
  static const size_t PM_COUNTS[] = {1, 1001, 12345};
  int salt = 2100;
  for (size_t ti = 0; ti < 5; ti++) {
    ncclDataType_t t = TYPES[ti];
    size_t sz = pm_size(t);
    int device = ti >= 2;
    unsigned char scalar[8] = {0}, mine[8] = {0};
    pm_scalar(t, rank, mine);
    if (!device) memcpy(scalar, mine, sz);
    ncclRedOp_t op = ncclSum;
    OK(ncclRedOpCreatePreMulSum(&op, scalar, t, device ? ncclScalarDevice : ncclScalarHostImmediate, comm));
    CHECK(op >= ncclNumOps, "PreMulSum op %d", (int)op);
    if (device) memcpy(scalar, mine, sz); /* read when the calls run */
    else memset(scalar, 0, sizeof scalar); /* read at creation: changing it changes nothing */
    for (int coll = 0; coll < 3; coll++) {
      for (size_t ci = 0; ci < 3; ci++) {
        size_t n = PM_COUNTS[ci], in_n = coll == 1 ? n * (size_t)nranks : n;
        int in_place = (salt++) % 2, root = salt % nranks;
        unsigned char* all = malloc(in_n * sz * (size_t)nranks);
        unsigned char* in = malloc(in_n * sz);
        unsigned char* out = malloc(in_n * sz);
        unsigned char* want = malloc(n * sz);
        unsigned char* s = malloc(8 * (size_t)nranks);
        for (int r = 0; r < nranks; r++) {
          pm_fill(t, all + (size_t)r * in_n * sz, in_n, r, salt);
          pm_scalar(t, r, s + 8 * r);
        }
        size_t from = coll == 1 ? (size_t)rank * n : 0;
        for (size_t i = 0; i < n; i++) {
          double acc = 0;
          uint64_t iacc = 0;
          for (int r = 0; r < nranks; r++) {
            const unsigned char* x = all + (size_t)r * in_n * sz;
            if (pm_is_int(t)) iacc += pm_get_int(t, x, from + i) * pm_get_int(t, s + 8 * r, 0);
            else acc += pm_get(t, x, from + i) * pm_get(t, s + 8 * r, 0);
          }
          pm_put(t, want, i, acc, iacc);
        }
        memcpy(in, all + (size_t)rank * in_n * sz, in_n * sz);
        memset(out, 0xa5, in_n * sz);
        unsigned char* result;
        const char* what = coll == 0 ? "allreduce" : coll == 1 ? "reduce-scatter" : "reduce";
        if (coll == 0) {
          result = in_place ? in : out;
          OK(ncclAllReduce(in, result, n, t, op, comm, NULL));
        } else if (coll == 1) {
          result = in_place ? in + (size_t)rank * n * sz : out;
          OK(ncclReduceScatter(in, result, n, t, op, comm, NULL));
        } else {
          result = in_place ? in : out;
          OK(ncclReduce(in, rank == root || ci != 1 ? result : NULL, n, t, op, root, comm, NULL));
        }
        if (coll < 2 || rank == root) {
          CHECK(memcmp(result, want, n * sz) == 0, "PreMulSum %s of %zu x type %d (in place %d, rank %d)", what, n, (int)t,
                in_place, rank);
        } else if (!in_place) {
          size_t touched = 0;
          for (size_t i = 0; i < n * sz; i++) touched += out[i] != 0xa5;
          CHECK(touched == 0, "PreMulSum reduce wrote %zu bytes of a non-root's output", touched);
        }
        if (!in_place || (coll == 2 && rank != root))
          CHECK(memcmp(in, all + (size_t)rank * in_n * sz, in_n * sz) == 0, "PreMulSum %s changed the input", what);
        free(all); free(in); free(out); free(want); free(s);
      }
    }
    /* The operator belongs to its type. */
    float f[4] = {1, 2, 3, 4};
    if (t != ncclFloat32) {
      EXPECT(ncclAllReduce(f, f, 4, ncclFloat32, op, comm, NULL), ncclInvalidArgument);
      CHECK(last_error_contains("made for"), "wrong datatype named");
    }
    OK(ncclRedOpDestroy(op, comm));
    EXPECT(ncclAllReduce(f, f, 4, t, op, comm, NULL), ncclInvalidArgument);
    CHECK(last_error_contains("destroyed"), "destroyed operator named");
  }
}

/* One rank of a job of `nranks` forked processes. */
static int child(ncclUniqueId id, int rank, int nranks) {
  char name[32];
  snprintf(name, sizeof name, "rank %d/%d", rank, nranks);
  who = name;
  ncclComm_t comm = NULL;
  OK(ncclCommInitRank(&comm, nranks, id, rank));
  if (!comm) return 1;
  int v = -1;
  OK(ncclCommCount(comm, &v));
  CHECK(v == nranks, "count %d", v);
  OK(ncclCommUserRank(comm, &v));
  CHECK(v == rank, "rank %d", v);
  allreduce_suite(comm, rank, nranks, 100);
  half_suite(comm, rank, nranks);
  integer_suite(comm, rank, nranks);

  /* Split: even and odd ranks; the last rank of an odd-sized job opts out. */
  int color = (nranks % 2 == 1 && rank == nranks - 1) ? NCCL_SPLIT_NOCOLOR : rank % 2;
  ncclComm_t sub = (ncclComm_t)0x1;
  OK(ncclCommSplit(comm, color, -rank, &sub, NULL));
  if (color == NCCL_SPLIT_NOCOLOR) {
    CHECK(sub == NULL, "NOCOLOR gave a communicator");
  } else if (sub) {
    int members = 0;
    for (int r = 0; r < nranks; r++)
      if (!(nranks % 2 == 1 && r == nranks - 1) && r % 2 == color) members++;
    OK(ncclCommCount(sub, &v));
    CHECK(v == members, "split count %d, expected %d", v, members);
    int subrank = -1;
    OK(ncclCommUserRank(sub, &subrank));
    /* key = -rank: the highest parent rank is sub-rank 0. */
    CHECK(subrank == members - 1 - rank / 2, "split rank %d (parent %d)", subrank, rank);
    size_t n = 4097;
    float* x = malloc(n * sizeof(float));
    float ref = 0;
    for (int r = 0; r < nranks; r++)
      if (!(nranks % 2 == 1 && r == nranks - 1) && r % 2 == color) ref += (float)(r + 1);
    for (size_t i = 0; i < n; i++) x[i] = (float)(rank + 1);
    OK(ncclAllReduce(x, x, n, ncclFloat32, ncclSum, sub, NULL));
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += x[i] != ref;
    CHECK(bad == 0, "split allreduce: %zu wrong (x[0] = %g, expected %g)", bad, x[0], ref);
    free(x);
    OK(ncclCommDestroy(sub));
  }

  allgather_suite(comm, rank, nranks);
  reducescatter_suite(comm, rank, nranks);
  alltoall_suite(comm, rank, nranks);
  broadcast_suite(comm, rank, nranks);
  reduce_suite(comm, rank, nranks);
  premul_suite(comm, rank, nranks);

  /* Windows: collective; the same length on every rank, else an error on every rank. */
  float* wbuf = NULL;
  OK(ncclMemAlloc((void**)&wbuf, 1 << 16));
  ncclWindow_t win = NULL;
  OK(ncclCommWindowRegister(comm, wbuf, 1 << 16, &win, 0));
  CHECK(win != NULL, "no window handle");
  for (int i = 0; i < 1000; i++) wbuf[i] = (float)(rank + i);
  OK(ncclAllReduce(wbuf, wbuf, 1000, ncclFloat32, ncclSum, comm, NULL));
  {
    size_t bad = 0;
    for (int i = 0; i < 1000; i++) bad += wbuf[i] != (float)(nranks * i + nranks * (nranks - 1) / 2);
    CHECK(bad == 0, "allreduce in a window: %zu wrong", bad);
  }
  OK(ncclCommWindowDeregister(comm, win));
  EXPECT(ncclCommWindowDeregister(comm, win), ncclInvalidArgument);
  ncclWindow_t win2 = NULL;
  EXPECT(ncclCommWindowRegister(comm, wbuf, 1024 + 16 * rank, &win2, 0), ncclInvalidArgument);
  CHECK(last_error_contains("different lengths"), "window length mismatch names the reason");
  OK(ncclMemFree(wbuf));

  /* Forwarded without a real NCCL. */
  float a[4] = {0}, b[16] = {0};
  EXPECT(ncclGather(a, b, 4, ncclFloat32, 0, comm, NULL), ncclInvalidUsage);
  CHECK(last_error_contains("real NCCL"), "forwarding error names the reason");
  /* An int32 reduce is served: the sum wraps like NCCL's. */
  int32_t ia[4] = {rank + 1, -(rank + 1), INT32_MAX, 7}, ib[4] = {0};
  OK(ncclReduce(ia, ib, 4, ncclInt32, ncclSum, 0, comm, NULL));
  if (rank == 0) {
    int32_t tri = nranks * (nranks + 1) / 2;
    int32_t wrapped = (int32_t)((uint32_t)INT32_MAX * (uint32_t)nranks);
    CHECK(ib[0] == tri && ib[1] == -tri && ib[2] == wrapped && ib[3] == 7 * nranks,
          "int32 reduce: %d %d %d %d", ib[0], ib[1], ib[2], ib[3]);
  }

  OK(ncclCommFinalize(comm));
  if (rank == 0)
    OK(ncclCommAbort(comm));
  else
    OK(ncclCommDestroy(comm));
  return failures ? 1 : 0;
}

static int run_job(int nranks) {
  ncclUniqueId id;
  OK(ncclGetUniqueId(&id));
  pid_t pids[8];
  for (int r = 0; r < nranks; r++) {
    pids[r] = fork();
    if (pids[r] == 0) _exit(child(id, r, nranks));
  }
  int bad = 0;
  for (int r = 0; r < nranks; r++) {
    int status = 0;
    waitpid(pids[r], &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      fprintf(stderr, "[main] FAIL: rank %d of %d exited with status %d\n", r, nranks, status);
      bad++;
    }
  }
  failures += bad;
  return bad;
}

struct thread_arg {
  ncclComm_t comm;
  int rank, nranks;
};

static void* thread_rank(void* p) {
  struct thread_arg* a = p;
  allreduce_suite(a->comm, a->rank, a->nranks, 300);
  half_suite(a->comm, a->rank, a->nranks);
  return NULL;
}


static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Polls a communicator's state until it is no longer ncclInProgress (60 s at most). */
static ncclResult_t wait_ready(ncclComm_t comm) {
  ncclResult_t state = ncclInProgress;
  double until = now_s() + 60.0;
  while (now_s() < until) {
    if (ncclCommGetAsyncError(comm, &state) != ncclSuccess) return ncclInternalError;
    if (state != ncclInProgress) return state;
    usleep(1000);
  }
  return ncclInProgress;
}

/* Allreduces on `n` ranks of one job driven from this thread: every call inside one group
 * (a sum out of place and an in-place max per rank, so each communicator has two queued
 * calls in order; an int32 sum too), checked against the reference computed here. */
static void grouped_allreduces(ncclComm_t* comms, const int* ranks, int n, int nranks, size_t count, int salt) {
  float* in[8];
  float* out[8];
  float* mx[8];
  int32_t* iv[8];
  float* peer = malloc(count * sizeof(float));
  float* sum = malloc(count * sizeof(float));
  float* max = malloc(count * sizeof(float));
  int32_t* isum = calloc(count, sizeof(int32_t));
  for (int r = 0; r < nranks; r++) {
    fill(peer, count, r, salt);
    for (size_t i = 0; i < count; i++) {
      sum[i] = r == 0 ? peer[i] : sum[i] + peer[i];
      max[i] = r == 0 ? peer[i] : fmaxf(max[i], peer[i]);
      isum[i] = (int32_t)((uint32_t)isum[i] + (uint32_t)(i * 2654435761u + (size_t)r * 40503u));
    }
  }
  for (int k = 0; k < n; k++) {
    in[k] = malloc(count * sizeof(float));
    out[k] = malloc(count * sizeof(float));
    mx[k] = malloc(count * sizeof(float));
    iv[k] = malloc(count * sizeof(int32_t));
    fill(in[k], count, ranks[k], salt);
    memcpy(mx[k], in[k], count * sizeof(float));
    for (size_t i = 0; i < count; i++) {
      out[k][i] = -1e30f;
      iv[k][i] = (int32_t)(uint32_t)(i * 2654435761u + (size_t)ranks[k] * 40503u);
    }
  }
  OK(ncclGroupStart());
  for (int k = 0; k < n; k++) {
    OK(ncclAllReduce(in[k], out[k], count, ncclFloat32, ncclSum, comms[k], NULL));
    OK(ncclAllReduce(mx[k], mx[k], count, ncclFloat32, ncclMax, comms[k], NULL));
    OK(ncclAllReduce(iv[k], iv[k], count, ncclInt32, ncclSum, comms[k], NULL));
  }
  /* Queued, not run: the outputs are untouched until ncclGroupEnd. */
  size_t early = 0;
  for (int k = 0; k < n; k++) early += out[k][0] != -1e30f;
  CHECK(early == 0, "%zu grouped allreduces ran before ncclGroupEnd", early);
  OK(ncclGroupEnd());
  for (int k = 0; k < n; k++) {
    size_t bad_sum = 0, bad_max = 0, bad_int = 0;
    for (size_t i = 0; i < count; i++) {
      bad_sum += out[k][i] != sum[i];
      bad_max += mx[k][i] != max[i];
      bad_int += iv[k][i] != isum[i];
    }
    CHECK(bad_sum == 0 && bad_max == 0 && bad_int == 0,
          "grouped allreduces of %zu on rank %d/%d: %zu sum, %zu max, %zu int32 wrong", count,
          ranks[k], nranks, bad_sum, bad_max, bad_int);
    free(in[k]); free(out[k]); free(mx[k]); free(iv[k]);
  }
  free(peer); free(sum); free(max); free(isum);
}

/* Ranks `first`..`first + n - 1` of a job of `nranks`, initialised by this thread in one
 * group (the handles are written at the calls, ready after ncclGroupEnd), then grouped
 * allreduces, a grouped split and grouped allreduces on its halves. */
struct grouped_arg {
  ncclUniqueId id;
  int first, n, nranks;
};

static void* grouped_ranks(void* p) {
  struct grouped_arg* a = p;
  ncclComm_t comms[8] = {0};
  int ranks[8];
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  OK(ncclGroupStart());
  for (int k = 0; k < a->n; k++) {
    ranks[k] = a->first + k;
    if (k % 2 == 0)
      OK(ncclCommInitRank(&comms[k], a->nranks, a->id, ranks[k]));
    else
      OK(ncclCommInitRankConfig(&comms[k], a->nranks, a->id, ranks[k], &config));
    CHECK(comms[k] != NULL, "grouped init wrote no handle for rank %d", ranks[k]);
  }
  ncclResult_t state = ncclSuccess;
  if (comms[0]) {
    OK(ncclCommGetAsyncError(comms[0], &state));
    CHECK(state == ncclInProgress, "a grouped communicator before ncclGroupEnd reports %d", (int)state);
  }
  OK(ncclGroupEnd());
  for (int k = 0; k < a->n; k++) {
    if (!comms[k]) return NULL;
    int v = -1;
    OK(ncclCommGetAsyncError(comms[k], &state));
    CHECK(state == ncclSuccess, "grouped communicator %d state %d", ranks[k], (int)state);
    OK(ncclCommUserRank(comms[k], &v));
    CHECK(v == ranks[k], "grouped rank %d, expected %d", v, ranks[k]);
    OK(ncclCommCount(comms[k], &v));
    CHECK(v == a->nranks, "grouped count %d", v);
  }
  static const size_t GC[] = {1, 1001, 65537};
  for (int c = 0; c < 3; c++) grouped_allreduces(comms, ranks, a->n, a->nranks, GC[c], 2100 + c);

  /* A grouped split: even and odd ranks, reversed order within each; the last rank of an
   * odd-sized job opts out (its handle is NULL at once, and it still takes part). */
  ncclComm_t subs[8];
  int colors[8];
  for (int k = 0; k < a->n; k++) {
    subs[k] = (ncclComm_t)0x1;
    colors[k] = (a->nranks % 2 == 1 && ranks[k] == a->nranks - 1) ? NCCL_SPLIT_NOCOLOR : ranks[k] % 2;
  }
  OK(ncclGroupStart());
  for (int k = 0; k < a->n; k++) OK(ncclCommSplit(comms[k], colors[k], -ranks[k], &subs[k], NULL));
  for (int k = 0; k < a->n; k++)
    CHECK((subs[k] == NULL) == (colors[k] == NCCL_SPLIT_NOCOLOR), "grouped split handle of rank %d at the call", ranks[k]);
  OK(ncclGroupEnd());
  for (int k = 0; k < a->n; k++) {
    int members = 0, v = -1, sr = -1;
    for (int r = 0; r < a->nranks; r++)
      members += !(a->nranks % 2 == 1 && r == a->nranks - 1) && r % 2 == colors[k];
    if (colors[k] == NCCL_SPLIT_NOCOLOR) {
      CHECK(subs[k] == NULL, "NOCOLOR gave rank %d a communicator", ranks[k]);
      continue;
    }
    CHECK(subs[k] != NULL, "grouped split gave rank %d no communicator", ranks[k]);
    if (!subs[k]) continue;
    OK(ncclCommCount(subs[k], &v));
    CHECK(v == members, "grouped split count %d, expected %d", v, members);
    OK(ncclCommUserRank(subs[k], &sr));
    CHECK(sr == members - 1 - ranks[k] / 2, "grouped split rank %d (parent %d)", sr, ranks[k]);
  }
  /* One allreduce on every half at once, from this thread: sum of (parent rank + 1). */
  size_t cnt = 4097;
  float* x[8];
  OK(ncclGroupStart());
  for (int k = 0; k < a->n; k++) {
    x[k] = malloc(cnt * sizeof(float));
    for (size_t i = 0; i < cnt; i++) x[k][i] = (float)(ranks[k] + 1);
    if (subs[k]) OK(ncclAllReduce(x[k], x[k], cnt, ncclFloat32, ncclSum, subs[k], NULL));
  }
  OK(ncclGroupEnd());
  for (int k = 0; k < a->n; k++) {
    float ref = (float)(ranks[k] + 1); /* NOCOLOR: untouched */
    if (subs[k]) {
      ref = 0;
      for (int r = 0; r < a->nranks; r++)
        if (!(a->nranks % 2 == 1 && r == a->nranks - 1) && r % 2 == colors[k]) ref += (float)(r + 1);
    }
    size_t bad = 0;
    for (size_t i = 0; i < cnt; i++) bad += x[k][i] != ref;
    CHECK(bad == 0, "grouped split allreduce on rank %d: %zu wrong (%g, expected %g)", ranks[k], bad, x[k][0], ref);
    free(x[k]);
    if (subs[k]) OK(ncclCommDestroy(subs[k]));
  }
  for (int k = 0; k < a->n; k++) OK(ncclCommDestroy(comms[k]));
  return NULL;
}

/* Grouped init and calls: all ranks of a job from this thread, then a job of four ranks
 * driven by two threads (two ranks each, each thread in its own group). */
static void grouped_tests(void) {
  for (int nranks = 2; nranks <= 3; nranks++) {
    struct grouped_arg a = {.first = 0, .n = nranks, .nranks = nranks};
    OK(ncclGetUniqueId(&a.id));
    grouped_ranks(&a);
  }
  struct grouped_arg halves[2] = {{.first = 0, .n = 2, .nranks = 4}, {.first = 2, .n = 2, .nranks = 4}};
  OK(ncclGetUniqueId(&halves[0].id));
  halves[1].id = halves[0].id;
  pthread_t t[2];
  for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, grouped_ranks, &halves[i]);
  for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);

  /* A bad rank inside a group: refused at the call, and the group fails as a whole; the
   * other handle of the group then answers every call with that failure. */
  ncclUniqueId id;
  OK(ncclGetUniqueId(&id));
  ncclComm_t c0 = NULL, c1 = NULL;
  OK(ncclGroupStart());
  OK(ncclCommInitRank(&c0, 2, id, 0));
  EXPECT(ncclCommInitRank(&c1, 2, id, 5), ncclInvalidArgument);
  EXPECT(ncclGroupEnd(), ncclInvalidArgument);
  CHECK(last_error_contains("rank 5"), "the group's error names the bad rank");
  CHECK(c0 != NULL, "no handle for the good init");
  if (c0) {
    ncclResult_t state = ncclSuccess;
    OK(ncclCommGetAsyncError(c0, &state));
    CHECK(state == ncclInvalidArgument, "failed group member state %d", (int)state);
    CHECK(last_error_contains("initialisation failed"), "async error leaves the init's failure");
    int v;
    EXPECT(ncclCommCount(c0, &v), ncclInvalidArgument);
    CHECK(last_error_contains("rank 5"), "a call on it names the group's failure");
    float f[4] = {0};
    EXPECT(ncclAllReduce(f, f, 4, ncclFloat32, ncclSum, c0, NULL), ncclInvalidArgument);
    OK(ncclCommDestroy(c0));
  }

  /* A collective inside a group is queued: an out-of-place one writes nothing before
   * ncclGroupEnd; a bad call inside the group fails it, and nothing of it runs. */
  ncclComm_t one = NULL;
  OK(ncclGetUniqueId(&id));
  OK(ncclCommInitRank(&one, 1, id, 0));
  if (one) {
    float in[8] = {1, 2, 3, 4, 5, 6, 7, 8}, o[8];
    for (int i = 0; i < 8; i++) o[i] = -1.0f;
    OK(ncclGroupStart());
    OK(ncclGroupStart()); /* nested: only the outermost end runs the group */
    OK(ncclAllReduce(in, o, 8, ncclFloat32, ncclSum, one, NULL));
    EXPECT(ncclCommDestroy(one), ncclInvalidUsage); /* it takes part in the open group */
    CHECK(last_error_contains("ncclGroupEnd first"), "destroy inside the group says why");
    OK(ncclGroupEnd());
    CHECK(o[0] == -1.0f, "the queued allreduce ran before the outermost ncclGroupEnd");
    OK(ncclGroupEnd());
    CHECK(o[0] == 1.0f && o[7] == 8.0f, "the queued allreduce did not run at ncclGroupEnd");
    for (int i = 0; i < 8; i++) o[i] = -1.0f;
    OK(ncclGroupStart());
    OK(ncclAllReduce(in, o, 8, ncclFloat32, ncclSum, one, NULL));
    EXPECT(ncclAllReduce(in, o, 8, (ncclDataType_t)42, ncclSum, one, NULL), ncclInvalidArgument);
    EXPECT(ncclGroupEnd(), ncclInvalidArgument);
    CHECK(last_error_contains("nothing of the group was run"), "failed group message");
    CHECK(o[0] == -1.0f, "a call of a failed group ran");
    OK(ncclCommDestroy(one));
  }
}

/* Non-blocking init of two ranks from this thread: rank 0 returns ncclInProgress and stays
 * so until rank 1 joins (a blocking init here); calls on it meanwhile are refused without
 * blocking. Then two ranks that both claim rank 0: the init refused by the bootstrap root
 * reports its error through ncclCommGetAsyncError and every call, and aborting the other
 * (still waiting for rank 1) returns at once. */
static void nonblocking_tests(void) {
  ncclUniqueId id;
  OK(ncclGetUniqueId(&id));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  config.commName = "oxccl-nonblocking-test";
  ncclComm_t a = NULL, b = NULL;
  EXPECT(ncclCommInitRankConfig(&a, 2, id, 0, &config), ncclInProgress);
  CHECK(a != NULL, "non-blocking init wrote no handle");
  if (!a) return;
  ncclResult_t state = ncclSuccess;
  OK(ncclCommGetAsyncError(a, &state));
  CHECK(state == ncclInProgress, "rank 0 without rank 1 reports %d", (int)state);
  float x[16];
  for (int i = 0; i < 16; i++) x[i] = (float)i;
  EXPECT(ncclAllReduce(x, x, 16, ncclFloat32, ncclSum, a, NULL), ncclInvalidArgument);
  CHECK(last_error_contains("not ready"), "a call on an initialising communicator says why");
  int v;
  EXPECT(ncclCommUserRank(a, &v), ncclInvalidArgument);
  OK(ncclCommInitRank(&b, 2, id, 1)); /* blocking: completes with rank 0's background init */
  CHECK(wait_ready(a) == ncclSuccess, "non-blocking rank 0 did not become ready");
  if (b) {
    int ranks[2] = {0, 1};
    ncclComm_t comms[2] = {a, b};
    grouped_allreduces(comms, ranks, 2, 2, 12345, 2500);
    OK(ncclCommDestroy(b));
  }
  OK(ncclCommUserRank(a, &v));
  CHECK(v == 0, "non-blocking rank %d", v);
  OK(ncclCommDestroy(a));

  ncclComm_t d[2] = {NULL, NULL};
  OK(ncclGetUniqueId(&id));
  for (int i = 0; i < 2; i++) EXPECT(ncclCommInitRankConfig(&d[i], 2, id, 0, &config), ncclInProgress);
  if (!d[0] || !d[1]) {
    CHECK(0, "non-blocking inits wrote no handles");
    return;
  }
  int failed = -1;
  double until = now_s() + 60.0;
  while (failed < 0 && now_s() < until) {
    for (int i = 0; i < 2 && failed < 0; i++) {
      OK(ncclCommGetAsyncError(d[i], &state));
      if (state != ncclInProgress) failed = i;
    }
    usleep(1000);
  }
  CHECK(failed >= 0, "neither of two rank-0 inits finished");
  if (failed >= 0) {
    CHECK(state == ncclRemoteError, "a duplicate rank's init ended with %d", (int)state);
    CHECK(last_error_contains("initialisation failed") && last_error_contains("twice"),
          "the async error's message names the failure");
    EXPECT(ncclAllReduce(x, x, 16, ncclFloat32, ncclSum, d[failed], NULL), ncclRemoteError);
    CHECK(last_error_contains("arrived twice"), "a call on a failed communicator names why");
    OK(ncclCommDestroy(d[failed]));
    double t0 = now_s();
    OK(ncclCommAbort(d[1 - failed])); /* still initialising: released when its init ends */
    CHECK(now_s() - t0 < 1.0, "aborting an initialising communicator waited %.1f s", now_s() - t0);
  }
}

/* In a child process (it shortens the bootstrap timeout): a group whose inits fail at
 * ncclGroupEnd (two ranks of one id that disagree on its size) beside one that would
 * succeed (one rank of another id): ncclGroupEnd returns the failure, and all three
 * handles answer with it. */
static int deferred_failure_child(void) {
  who = "deferred group failure";
  setenv("OXCCL_BOOTSTRAP_TIMEOUT", "2", 1);
  ncclUniqueId x, y;
  OK(ncclGetUniqueId(&x));
  OK(ncclGetUniqueId(&y));
  ncclComm_t c[3] = {NULL, NULL, NULL};
  OK(ncclGroupStart());
  OK(ncclCommInitRank(&c[0], 1, x, 0));
  OK(ncclCommInitRank(&c[1], 2, y, 0));
  OK(ncclCommInitRank(&c[2], 3, y, 1));
  ncclResult_t r = ncclGroupEnd();
  CHECK(r != ncclSuccess, "a group with mismatched world sizes succeeded");
  CHECK(last_error_contains("world size") || last_error_contains("never arrived"),
        "the group's error says what failed");
  for (int i = 0; i < 3; i++) {
    if (!c[i]) {
      CHECK(0, "no handle %d", i);
      continue;
    }
    ncclResult_t state = ncclSuccess;
    OK(ncclCommGetAsyncError(c[i], &state));
    CHECK(state != ncclSuccess && state != ncclInProgress, "member %d of a failed group: %d", i, (int)state);
    int v;
    CHECK(ncclCommCount(c[i], &v) != ncclSuccess, "member %d of a failed group answered", i);
    CHECK(last_error_contains("initialisation failed"), "member %d's failure", i);
    OK(ncclCommDestroy(c[i]));
  }
  return failures ? 1 : 0;
}

static void deferred_failure_test(void) {
  pid_t pid = fork();
  if (pid == 0) _exit(deferred_failure_child());
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    fprintf(stderr, "[main] FAIL: the deferred group failure test exited with status %d\n", status);
    failures++;
  }
}

static void single_process_tests(void) {
  int version = 0;
  OK(ncclGetVersion(&version));
  CHECK(version >= 22800, "version %d", version);
  EXPECT(ncclGetVersion(NULL), ncclInvalidArgument);
  CHECK(last_error_contains("NULL"), "NULL version pointer named");

  for (int c = 0; c <= ncclNumResults; c++) {
    const char* s = ncclGetErrorString((ncclResult_t)c);
    CHECK(s && *s, "no string for code %d", c);
  }
  CHECK(strcmp(ncclGetErrorString(ncclSuccess), "no error") == 0, "success string");

  /* Bad communicators. */
  int v = 0;
  EXPECT(ncclCommCount(NULL, &v), ncclInvalidArgument);
  CHECK(last_error_contains("comm is NULL"), "null comm message");
  uint64_t fake[16] = {0};
  EXPECT(ncclCommCount((ncclComm_t)fake, &v), ncclInvalidArgument);
  CHECK(last_error_contains("not a communicator"), "bad magic message");
  float x[8] = {0};
  EXPECT(ncclAllReduce(x, x, 8, ncclFloat32, ncclSum, NULL, NULL), ncclInvalidArgument);
  EXPECT(ncclCommFinalize(NULL), ncclInvalidArgument);
  OK(ncclCommDestroy(NULL)); /* as NCCL */
  EXPECT(ncclGetUniqueId(NULL), ncclInvalidArgument);

  /* Bad init arguments. */
  ncclUniqueId id;
  OK(ncclGetUniqueId(&id));
  ncclComm_t comm = NULL;
  EXPECT(ncclCommInitRank(&comm, 0, id, 0), ncclInvalidArgument);
  EXPECT(ncclCommInitRank(&comm, 2, id, 2), ncclInvalidArgument);
  EXPECT(ncclCommInitRank(&comm, 1, id, -1), ncclInvalidArgument);
  EXPECT(ncclCommInitRank(NULL, 1, id, 0), ncclInvalidArgument);
  ncclUniqueId junk;
  memset(&junk, 0x5a, sizeof junk);
  EXPECT(ncclCommInitRank(&comm, 1, junk, 0), ncclInvalidArgument);
  CHECK(last_error_contains("unique id"), "junk id message");

  /* One rank, with a non-blocking config: ncclInProgress (or done at once), then polled. */
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclResult_t nb = ncclCommInitRankConfig(&comm, 1, id, 0, &config);
  CHECK(nb == ncclInProgress || nb == ncclSuccess, "non-blocking init returned %d", (int)nb);
  CHECK(comm != NULL, "no communicator");
  if (!comm) return;
  CHECK(wait_ready(comm) == ncclSuccess, "non-blocking one-rank init did not become ready");
  OK(ncclCommCount(comm, &v));
  CHECK(v == 1, "count %d", v);
  OK(ncclCommUserRank(comm, &v));
  CHECK(v == 0, "rank %d", v);
  v = -1;
  OK(ncclCommCuDevice(comm, &v));
  CHECK(v >= 0, "device %d", v);
  ncclResult_t async = ncclInternalError;
  OK(ncclCommGetAsyncError(comm, &async));
  CHECK(async == ncclSuccess, "async error %d", (int)async);
  EXPECT(ncclCommCount(comm, NULL), ncclInvalidArgument);

  /* Bad allreduce arguments. */
  EXPECT(ncclAllReduce(x, x, 8, (ncclDataType_t)99, ncclSum, comm, NULL), ncclInvalidArgument);
  CHECK(last_error_contains("datatype 99"), "bad dtype message");
  EXPECT(ncclAllReduce(x, x, 8, (ncclDataType_t)-1, ncclSum, comm, NULL), ncclInvalidArgument);
  EXPECT(ncclAllReduce(x, x, SIZE_MAX / 2, ncclFloat32, ncclSum, comm, NULL), ncclInvalidArgument);
  CHECK(last_error_contains("overflow"), "overflow message");
  EXPECT(ncclAllReduce(NULL, x, 8, ncclFloat32, ncclSum, comm, NULL), ncclInvalidArgument);
  EXPECT(ncclAllReduce(x, NULL, 8, ncclFloat32, ncclSum, comm, NULL), ncclInvalidArgument);
  EXPECT(ncclAllReduce(x, x, 8, ncclFloat32, (ncclRedOp_t)-3, comm, NULL), ncclInvalidArgument);
  OK(ncclAllReduce(NULL, NULL, 0, ncclFloat32, ncclSum, comm, NULL));

  /* Served with one rank: the output is the input. */
  allreduce_suite(comm, 0, 1, 200);
  half_suite(comm, 0, 1);

  integer_suite(comm, 0, 1);
  /* An operator past the built-in ones that ncclRedOpCreatePreMulSum did not make on this
     communicator: an invalid argument (as NCCL answers one it did not make). */
  EXPECT(ncclAllReduce(x, x, 8, ncclFloat32, (ncclRedOp_t)5, comm, NULL), ncclInvalidArgument);
  CHECK(last_error_contains("op 5"), "unknown operator named");
  OK(ncclBroadcast(x, x, 8, ncclFloat32, 0, comm, NULL)); /* one rank: in place, a no-op */
  EXPECT(ncclBroadcast(x, x, 8, ncclFloat32, 1, comm, NULL), ncclInvalidArgument);
  CHECK(last_error_contains("root 1"), "bad root named");
  OK(ncclReduce(x, x, 8, ncclFloat32, ncclSum, 0, comm, NULL)); /* one rank: in place, a no-op */
  EXPECT(ncclReduce(x, x, 8, ncclFloat32, ncclSum, 1, comm, NULL), ncclInvalidArgument);
  CHECK(last_error_contains("root 1"), "bad reduce root named");
  EXPECT(ncclReduce(x, NULL, 8, ncclFloat32, ncclSum, 0, comm, NULL), ncclInvalidArgument);
  CHECK(last_error_contains("ncclReduce"), "NULL root recvbuff refused");
  EXPECT(ncclSend(x, 8, ncclFloat32, 0, comm, NULL), ncclInvalidUsage);
  CHECK(last_error_contains("real NCCL"), "forwarding error names the reason");
  EXPECT(ncclRecv(x, 8, ncclFloat32, 0, comm, NULL), ncclInvalidUsage);
  OK(ncclReduceScatter(x, x, 8, ncclFloat32, ncclSum, comm, NULL)); /* one rank: in place, a no-op */
  int32_t ints[8] = {5, -7, 1, 2, 3, 4, 5, 6};
  OK(ncclReduceScatter(ints, ints, 8, ncclInt32, ncclSum, comm, NULL)); /* one rank: a no-op */
  CHECK(ints[0] == 5 && ints[1] == -7, "one-rank int32 reduce-scatter changed its input");
  /* PreMulSum on one rank: the output is the input times the scalar; then its bad uses. */
  ncclRedOp_t op = ncclSum;
  float scalar = 2.0f, y[8];
  for (int i = 0; i < 8; i++) x[i] = (float)i - 3.0f;
  OK(ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat32, ncclScalarHostImmediate, comm));
  CHECK(op >= ncclNumOps, "PreMulSum op %d", (int)op);
  OK(ncclAllReduce(x, y, 8, ncclFloat32, op, comm, NULL));
  for (int i = 0; i < 8; i++) CHECK(y[i] == 2.0f * x[i], "one-rank PreMulSum element %d: %g", i, y[i]);
  OK(ncclGroupStart()); /* a served PreMulSum call inside a group runs at ncclGroupEnd */
  OK(ncclReduce(x, y, 8, ncclFloat32, op, 0, comm, NULL));
  OK(ncclGroupEnd());
  for (int i = 0; i < 8; i++) CHECK(y[i] == 2.0f * x[i], "grouped one-rank PreMulSum element %d: %g", i, y[i]);
  EXPECT(ncclAllReduce(x, y, 8, ncclBfloat16, op, comm, NULL), ncclInvalidArgument);
  CHECK(last_error_contains("made for fp32"), "wrong datatype named");
  EXPECT(ncclRedOpCreatePreMulSum(NULL, &scalar, ncclFloat32, ncclScalarHostImmediate, comm), ncclInvalidArgument);
  EXPECT(ncclRedOpCreatePreMulSum(&op, NULL, ncclFloat32, ncclScalarHostImmediate, comm), ncclInvalidArgument);
  EXPECT(ncclRedOpCreatePreMulSum(&op, &scalar, (ncclDataType_t)99, ncclScalarDevice, comm), ncclInvalidArgument);
  EXPECT(ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat32, (ncclScalarResidence_t)5, comm), ncclInvalidArgument);
  EXPECT(ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat32, ncclScalarDevice, NULL), ncclInvalidArgument);
  EXPECT(ncclRedOpDestroy(ncclSum, comm), ncclInvalidArgument);
  EXPECT(ncclRedOpDestroy(op, NULL), ncclInvalidArgument);
  ncclComm_t other = NULL;
  OK(ncclCommSplit(comm, 0, 0, &other, NULL));
  if (other) {
    EXPECT(ncclAllReduce(x, y, 8, ncclFloat32, op, other, NULL), ncclInvalidArgument);
    CHECK(last_error_contains("another communicator"), "another communicator's operator named");
    EXPECT(ncclRedOpDestroy(op, other), ncclInvalidArgument);
    OK(ncclCommDestroy(other));
  }
  OK(ncclRedOpDestroy(op, comm));
  EXPECT(ncclReduceScatter(x, y, 8, ncclFloat32, op, comm, NULL), ncclInvalidArgument);
  CHECK(last_error_contains("destroyed"), "destroyed operator named");
  EXPECT(ncclRedOpDestroy(op, comm), ncclInvalidArgument);

  /* Groups. */
  OK(ncclGroupStart());
  OK(ncclAllReduce(x, x, 8, ncclFloat32, ncclSum, comm, NULL));
  OK(ncclGroupEnd());
  EXPECT(ncclGroupEnd(), ncclInvalidUsage);

  /* Memory and registration. */
  void* mem = NULL;
  OK(ncclMemAlloc(&mem, 1 << 20));
  CHECK(mem != NULL, "ncclMemAlloc gave NULL");
  void* handle = NULL;
  OK(ncclCommRegister(comm, mem, 1 << 20, &handle));
  CHECK(handle != NULL, "no registration handle");
  OK(ncclAllReduce(mem, mem, (1 << 20) / 4, ncclFloat32, ncclSum, comm, NULL));
  OK(ncclCommDeregister(comm, handle));
  EXPECT(ncclCommDeregister(comm, handle), ncclInvalidArgument);
  CHECK(last_error_contains("not a live registration"), "double deregister names the reason");
  EXPECT(ncclCommDeregister(comm, (void*)0x1234), ncclInvalidArgument);
  EXPECT(ncclCommRegister(comm, NULL, 16, &handle), ncclInvalidArgument);
  OK(ncclMemFree(mem));
  EXPECT(ncclMemAlloc(NULL, 16), ncclInvalidArgument);

  /* Split of one rank. */
  ncclComm_t sub = NULL;
  OK(ncclCommSplit(comm, NCCL_SPLIT_NOCOLOR, 0, &sub, NULL));
  CHECK(sub == NULL, "NOCOLOR gave a communicator");
  OK(ncclCommSplit(comm, 3, 0, &sub, NULL));
  CHECK(sub != NULL, "split gave no communicator");
  if (sub) {
    OK(ncclCommCount(sub, &v));
    CHECK(v == 1, "split count %d", v);
    OK(ncclCommDestroy(sub));
  }
  EXPECT(ncclCommSplit(comm, -7, 0, &sub, NULL), ncclInvalidArgument);

  OK(ncclCommFinalize(comm));
  OK(ncclCommDestroy(comm));

  /* ncclCommInitAll: one process, two ranks on threads. */
  ncclComm_t comms[2] = {NULL, NULL};
  int devs[2] = {0, 1};
  OK(ncclCommInitAll(comms, 2, devs));
  if (comms[0] && comms[1]) {
    pthread_t t[2];
    struct thread_arg args[2] = {{comms[0], 0, 2}, {comms[1], 1, 2}};
    for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, thread_rank, &args[i]);
    for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
    /* One thread releases both ranks in turn (as nccl-tests does): teardown is local. */
    OK(ncclCommFinalize(comms[0]));
    OK(ncclCommDestroy(comms[0]));
    OK(ncclCommDestroy(comms[1]));
  } else {
    CHECK(0, "ncclCommInitAll gave no communicators");
  }
  EXPECT(ncclCommInitAll(comms, 0, devs), ncclInvalidArgument);
}

int main(void) {
  setvbuf(stdout, NULL, _IONBF, 0);
  /* The multi-process jobs first, while this process has no communicator threads. */
  int jobs[] = {2, 3};
  for (int j = 0; j < 2; j++) {
    printf("api_test: %d processes\n", jobs[j]);
    run_job(jobs[j]);
  }
  printf("api_test: a group failing at ncclGroupEnd (child process)\n");
  deferred_failure_test();
  printf("api_test: single-process tests\n");
  single_process_tests();
  printf("api_test: grouped inits and calls\n");
  grouped_tests();
  printf("api_test: non-blocking communicators\n");
  nonblocking_tests();
  if (failures) {
    printf("api_test: %d FAILURES\n", failures);
    return 1;
  }
  printf("api_test: all passed\n");
  return 0;
}
