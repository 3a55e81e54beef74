// oxccl/reducers.hpp: the device reducers of the reducing kernels (allreduce.cu,
// reducescatter.cu): a reducer folds every rank's 16-byte unit in rank order with the
// call's op and accumulation type, bit for bit as the host reference (kernels/src/reduce.rs),
// and `run_reducing` is the prologue of `run_call` with the call's reducer chosen.
#ifndef OXCCL_REDUCERS_HPP_
#define OXCCL_REDUCERS_HPP_

#include "allreduce_device.hpp"
#include "number_formats.hpp"
#include "reduce.hpp"

namespace oxccl {
namespace allreduce {

// ---- reducers ---------------------------------------------------------------------------
// The hot combinations get a reducer with everything fixed at compile time; the rest share
// one reducer per data type that reads op and accumulator at run time (same arithmetic,
// same bits as reduce.hpp). This keeps the image (and nvcc's time) small: 2 kernels x
// (7 + 8) bodies instead of 2 x 8 x 5 x 3.

// Every reducer streams: `first` widens rank 0's vector, `add` folds in the next rank's,
// `finish` rounds once to the element type. `reduce_ranks` runs them over a per-rank array.

template <typename Fmt, Acc A, uint32_t Op>
struct StaticReducer {
  using State = AccLanes<Fmt>;
  OXCCL_DEVICE_INLINE State first(const Vec16& v) const { return widen16<Fmt, A>(v); }
  OXCCL_DEVICE_INLINE void add(State& s, const Vec16& v) const {
    combine<Fmt, A, Op>(s, widen16<Fmt, A>(v));
  }
  OXCCL_DEVICE_INLINE Vec16 finish(const State& s, uint32_t n) const {
    return narrow16<Fmt, A, Op>(s, n);
  }
};

template <typename Fmt>
OXCCL_DEVICE_INLINE float acc_round_dyn(Acc a, float x) {
  switch (a) {
    case Acc::F32: return x;
    case Acc::F16: return F16::decode(F16::encode(x));
    default: return Fmt::decode(Fmt::encode(x));
  }
}

OXCCL_DEVICE_INLINE float apply_op_dyn(uint32_t op, float a, float b) {
  switch (op) {
    case OXCCL_OP_PROD: return a * b;
    case OXCCL_OP_MIN: return b < a ? b : a;
    case OXCCL_OP_MAX: return b > a ? b : a;
    default: return a + b;  // SUM, AVG
  }
}

template <typename Fmt>
struct DynamicReducer {
  Acc acc;
  uint32_t op;
  using State = AccLanes<Fmt>;
  OXCCL_DEVICE_INLINE State first(const Vec16& v) const {
    const Lanes<Fmt> l = bit_cast<Lanes<Fmt>>(v);
    State s;
#pragma unroll
    for (int i = 0; i < Lanes<Fmt>::kCount; ++i) s.v[i] = acc_round_dyn<Fmt>(acc, Fmt::decode(l.e[i]));
    return s;
  }
  OXCCL_DEVICE_INLINE void add(State& s, const Vec16& v) const {
    const Lanes<Fmt> l = bit_cast<Lanes<Fmt>>(v);
#pragma unroll
    for (int i = 0; i < Lanes<Fmt>::kCount; ++i) {
      const float x = acc_round_dyn<Fmt>(acc, Fmt::decode(l.e[i]));
      s.v[i] = acc_round_dyn<Fmt>(acc, apply_op_dyn(op, s.v[i], x));
    }
  }
  OXCCL_DEVICE_INLINE Vec16 finish(const State& s, uint32_t n) const {
    Lanes<Fmt> out;
#pragma unroll
    for (int i = 0; i < Lanes<Fmt>::kCount; ++i) {
      float r = s.v[i];
      if (op == OXCCL_OP_AVG) r = acc_round_dyn<Fmt>(acc, r / static_cast<float>(n));
      out.e[i] = Fmt::encode(r);
    }
    return bit_cast<Vec16>(out);
  }
};

// ---- types reduced in their own type ----------------------------------------------------
// Integers (two's complement: sums and products wrap, as NCCL's) and f64 have no
// accumulation choice: each step is one operation of the type itself. One reducer per
// element width, with the type (signed, unsigned, f64) and op read at run time, keeps the
// image small: 3 bodies per kernel for 7 types. The host reference is the own-type path
// of kernels/src/reduce.rs.

/// The element width of a type reduced in its own type: all a body needs to know of it
/// (`sizeof(Fmt::Storage)`).
template <typename T>
struct OwnTypeWidth {
  using Storage = T;
};

template <typename T> struct SignedOf;
template <> struct SignedOf<uint8_t> { using Type = int8_t; };
template <> struct SignedOf<uint32_t> { using Type = int32_t; };
template <> struct SignedOf<uint64_t> { using Type = int64_t; };

/// How the bits of an own-type element are read.
enum class OwnKind : uint32_t { Unsigned, Signed, F64 };

OXCCL_DEVICE_INLINE OwnKind own_kind(uint32_t dtype) {
  if (dtype == OXCCL_DTYPE_I8 || dtype == OXCCL_DTYPE_I32 || dtype == OXCCL_DTYPE_I64) return OwnKind::Signed;
  if (dtype == OXCCL_DTYPE_F64) return OwnKind::F64;
  return OwnKind::Unsigned;
}

/// `a op b` in the element's own type (Avg combines as a sum). Min/max keep `a` on ties
/// and, for f64, on unordered inputs (as the f32 path and the host reference).
template <typename T>
OXCCL_DEVICE_INLINE T own_apply(OwnKind kind, uint32_t op, T a, T b) {
  using S = typename SignedOf<T>::Type;
  if constexpr (sizeof(T) == 8) {
    if (kind == OwnKind::F64) {
      const double x = bit_cast<double>(a), y = bit_cast<double>(b);
      double r;
      switch (op) {
        case OXCCL_OP_PROD: r = x * y; break;
        case OXCCL_OP_MIN: r = y < x ? y : x; break;
        case OXCCL_OP_MAX: r = y > x ? y : x; break;
        default: r = x + y; break;
      }
      return bit_cast<T>(r);
    }
  }
  switch (op) {
    // Unsigned arithmetic wraps, and its bits are those of the signed wrap.
    case OXCCL_OP_PROD: return static_cast<T>(a * b);
    case OXCCL_OP_MIN:
      if (kind == OwnKind::Signed) return static_cast<S>(b) < static_cast<S>(a) ? b : a;
      return b < a ? b : a;
    case OXCCL_OP_MAX:
      if (kind == OwnKind::Signed) return static_cast<S>(b) > static_cast<S>(a) ? b : a;
      return b > a ? b : a;
    default: return static_cast<T>(a + b);
  }
}

/// The average of `n` ranks from their (wrapped) sum: integers divide truncating toward
/// zero, as NCCL's integer average; f64 divides.
template <typename T>
OXCCL_DEVICE_INLINE T own_average(OwnKind kind, T sum, uint32_t n) {
  using S = typename SignedOf<T>::Type;
  if constexpr (sizeof(T) == 8) {
    if (kind == OwnKind::F64) return bit_cast<T>(bit_cast<double>(sum) / static_cast<double>(n));
  }
  if (kind == OwnKind::Signed) {
    // In 64 bits, so the smallest value of a narrower type divides without overflow.
    return static_cast<T>(static_cast<S>(static_cast<int64_t>(static_cast<S>(sum)) / static_cast<int64_t>(n)));
  }
  return static_cast<T>(sum / static_cast<T>(n));
}

template <typename T>
struct OwnTypeReducer {
  OwnKind kind;
  uint32_t op;
  struct State {
    T e[16 / sizeof(T)];
  };
  static constexpr int kLanes = 16 / sizeof(T);
  OXCCL_DEVICE_INLINE State first(const Vec16& v) const { return bit_cast<State>(v); }
  OXCCL_DEVICE_INLINE void add(State& s, const Vec16& v) const {
    const State x = bit_cast<State>(v);
#pragma unroll
    for (int i = 0; i < kLanes; ++i) s.e[i] = own_apply<T>(kind, op, s.e[i], x.e[i]);
  }
  OXCCL_DEVICE_INLINE Vec16 finish(State s, uint32_t n) const {
    if (op == OXCCL_OP_AVG) {
#pragma unroll
      for (int i = 0; i < kLanes; ++i) s.e[i] = own_average<T>(kind, s.e[i], n);
    }
    return bit_cast<Vec16>(s);
  }
};

/// Calls `body.template operator()<OwnTypeWidth<T>>(reducer)` for a type reduced in its
/// own type; false for any other code.
template <typename Body>
OXCCL_DEVICE_INLINE bool dispatch_own_type(uint32_t dtype, uint32_t op, Body&& body) {
  const OwnKind kind = own_kind(dtype);
  switch (dtype) {
    case OXCCL_DTYPE_I8:
    case OXCCL_DTYPE_U8:
      body.template operator()<OwnTypeWidth<uint8_t>>(OwnTypeReducer<uint8_t>{kind, op});
      return true;
    case OXCCL_DTYPE_I32:
    case OXCCL_DTYPE_U32:
      body.template operator()<OwnTypeWidth<uint32_t>>(OwnTypeReducer<uint32_t>{kind, op});
      return true;
    case OXCCL_DTYPE_I64:
    case OXCCL_DTYPE_U64:
    case OXCCL_DTYPE_F64:
      body.template operator()<OwnTypeWidth<uint64_t>>(OwnTypeReducer<uint64_t>{kind, op});
      return true;
    default: return false;
  }
}

/// `in[r]` for a run-time `r` (below OXCCL_ALLREDUCE_MAX_RANKS) as a chain of selects
/// between constant-index elements: the array stays in registers (a run-time index would
/// put it in scratch on gfx942, local memory on CUDA).
OXCCL_DEVICE_INLINE Vec16 rank_unit(const Vec16 (&in)[OXCCL_ALLREDUCE_MAX_RANKS], uint32_t r) {
  Vec16 v = in[0];
#pragma unroll
  for (uint32_t i = 1; i < OXCCL_ALLREDUCE_MAX_RANKS; ++i) {
    if (r == i) v = in[i];
  }
  return v;
}

/// Reduces `n` ranks' vectors in rank order.
///
/// CUDA: every index is a constant once the loop is unrolled, so the array stays in
/// registers: a per-rank array indexed at run time lives in local memory, which cost 0.4 us
/// per call at 1 KB and 1.2 us at 64 KB in 512-thread blocks on H200s (ci/gpu/probe). Fill
/// it the same way (`r < n`, `r == rank` tests in an unrolled loop).
///
/// HIP: the ranks are folded in a loop that is not unrolled, each rank's vector picked by
/// `rank_unit`, so the array stays in VGPRs there too. clang gives up `#pragma unroll` when
/// the unrolled loop is too large (the run-time-op reducers of fp8 types; the array then
/// went to scratch on gfx942), and every gfx942 kernel is one function (a call needs a
/// scratch stack) holding the bodies of all 18 reducers of `dispatch_all`: with the ranks
/// unrolled (by templates) a reducing kernel was 120,000-250,000 lines of LLVM IR and the
/// gfx942 backend's superlinear passes (SDWA peephole, structurizer, memory clauses,
/// register coalescer) did not finish the image in 84 minutes. Same order, same bits.
template <typename Reducer>
OXCCL_DEVICE_INLINE Vec16 reduce_ranks(const Reducer& reduce, const Vec16 (&in)[OXCCL_ALLREDUCE_MAX_RANKS],
                                       uint32_t n) {
  typename Reducer::State s = reduce.first(in[0]);
#if defined(OXCCL_DEVICE_HIP)
#pragma nounroll
  for (uint32_t r = 1; r < n; ++r) reduce.add(s, rank_unit(in, r));
#else
#pragma unroll
  for (uint32_t r = 1; r < OXCCL_ALLREDUCE_MAX_RANKS; ++r) {
    if (r < n) reduce.add(s, in[r]);
  }
#endif
  return reduce.finish(s, n);
}

/// Calls `body.template operator()<Fmt>(reducer)` with the reducer for the call's types,
/// forced inline (`dispatch_all` lets nvcc choose).
template <typename Body>
__device__ __forceinline__ void dispatch_all_inlined(const OxcclAllreduceArgs& a, Body&& body) {
  if (dispatch_own_type(a.dtype, a.op, body)) return;
  dispatch_dtype(a.dtype, [&]<typename Fmt>() OXCCL_INLINE_LAMBDA {
    const Acc acc = resolve_accum<Fmt>(a.accum);
    if (a.op == OXCCL_OP_SUM) {
      if constexpr (Fmt::kCode == OXCCL_DTYPE_F32) {
        if (acc == Acc::F32) return body.template operator()<Fmt>(StaticReducer<Fmt, Acc::F32, OXCCL_OP_SUM>{});
      } else if constexpr (Fmt::kCode == OXCCL_DTYPE_F16) {
        if (acc == Acc::F16) return body.template operator()<Fmt>(StaticReducer<Fmt, Acc::F16, OXCCL_OP_SUM>{});
      } else if constexpr (Fmt::kCode == OXCCL_DTYPE_BF16) {
        if (acc == Acc::Element) return body.template operator()<Fmt>(StaticReducer<Fmt, Acc::Element, OXCCL_OP_SUM>{});
        if (acc == Acc::F32) return body.template operator()<Fmt>(StaticReducer<Fmt, Acc::F32, OXCCL_OP_SUM>{});
      } else if constexpr (Fmt::kCode == OXCCL_DTYPE_FP8_E4M3 || Fmt::kCode == OXCCL_DTYPE_FP8_E5M2) {
        if (acc == Acc::F16) return body.template operator()<Fmt>(StaticReducer<Fmt, Acc::F16, OXCCL_OP_SUM>{});
      } else if constexpr (Fmt::kCode == OXCCL_DTYPE_FP8_E4M3B15) {
        if (acc == Acc::F32) return body.template operator()<Fmt>(StaticReducer<Fmt, Acc::F32, OXCCL_OP_SUM>{});
      }
    }
    body.template operator()<Fmt>(DynamicReducer<Fmt>{acc, a.op});
  });
}

/// Calls `body.template operator()<Fmt>(reducer)` with the reducer for the call's types.
/// Inlined on HIP (a call needs a stack in scratch on gfx942); nvcc decides on CUDA.
template <typename Body>
OXCCL_DEVICE_INLINE_ON_HIP void dispatch_all(const OxcclAllreduceArgs& a, Body&& body) {
  dispatch_all_inlined(a, body);
}

/// What every reducing kernel does around its body ([`run_call`]), with the body run for
/// the call's element format and reducer: `body.template operator()<Fmt>(reducer, call)`.
/// `kInlined`: the type dispatch is inlined into the body's caller (`dispatch_all_inlined`),
/// for a latency kernel whose dispatch nvcc made a call that spills.
template <bool kReadsEpoch, uint64_t kCounter = OXCCL_ALLREDUCE_SYNC_EPOCH, bool kInlined = false, typename Body>
__device__ __forceinline__ void run_reducing(const OxcclAllreduceArgs& a, bool kernel_ok, Body&& body) {
  run_call<kReadsEpoch, kCounter>(a, kernel_ok, [&](const CallState call) OXCCL_INLINE_LAMBDA {
    const auto typed = [&]<typename Fmt>(auto reducer) OXCCL_INLINE_LAMBDA { body.template operator()<Fmt>(reducer, call); };
    if constexpr (kInlined) {
      dispatch_all_inlined(a, typed);
    } else {
      dispatch_all(a, typed);
    }
  });
}

}  // namespace allreduce
}  // namespace oxccl

#endif  // OXCCL_REDUCERS_HPP_
