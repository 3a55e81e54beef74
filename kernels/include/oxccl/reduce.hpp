// oxccl/reduce.hpp: element-wise reduction of 16-byte vectors with an accumulation type.
//
// Each element is widened to the accumulation type (decode to f32, round to the
// accumulator), combined in it (every step rounded to the accumulator), and rounded to the
// element type once at the end. Arithmetic runs in f32 and is then rounded to the
// accumulator: for f16/bf16/fp8 accumulators that is the correctly rounded operation (f32
// holds more than twice their precision plus two bits). The host reference is
// kernels/src/reduce.rs; results match it bit for bit.
#ifndef OXCCL_REDUCE_HPP_
#define OXCCL_REDUCE_HPP_

#include "abi.h"
#include "number_formats.hpp"
#include "vector.hpp"

namespace oxccl {

/// Where partial results live.
enum class Acc { F32, F16, Element };

/// Resolves an accumulation code (OXCCL_ACCUM_*) for element type `Fmt`, as
/// AccumType::resolve and Accumulator::new do on the host.
template <typename Fmt>
OXCCL_HOST_DEVICE_INLINE Acc resolve_accum(uint32_t accum) {
  if (accum == OXCCL_ACCUM_F32) return Acc::F32;
  if (accum == OXCCL_ACCUM_F16) return Acc::F16;
  if (accum == OXCCL_ACCUM_AUTO) {
    if (Fmt::kCode == OXCCL_DTYPE_FP8_E4M3B15) return Acc::F32;
    if (Fmt::kCode == OXCCL_DTYPE_FP8_E4M3 || Fmt::kCode == OXCCL_DTYPE_FP8_E5M2 ||
        Fmt::kCode == OXCCL_DTYPE_FP8_E4M3_FNUZ || Fmt::kCode == OXCCL_DTYPE_FP8_E5M2_FNUZ)
      return Acc::F16;
  }
  // Native (or Auto for f32/f16/bf16): the element type itself.
  if (Fmt::kCode == OXCCL_DTYPE_F32) return Acc::F32;
  if (Fmt::kCode == OXCCL_DTYPE_F16) return Acc::F16;
  return Acc::Element;
}

/// Rounds an f32 to the accumulator's precision.
template <typename Fmt, Acc A>
OXCCL_DEVICE_INLINE float acc_round(float x) {
  if constexpr (A == Acc::F32) {
    return x;
  } else if constexpr (A == Acc::F16) {
    return F16::decode(F16::encode(x));
  } else {
    return Fmt::decode(Fmt::encode(x));
  }
}

/// `a op b` in f32. Min/max keep `a` on ties and unordered inputs (as the host reference).
template <uint32_t Op>
OXCCL_DEVICE_INLINE float apply_op(float a, float b) {
  if constexpr (Op == OXCCL_OP_SUM || Op == OXCCL_OP_AVG) {
    return a + b;
  } else if constexpr (Op == OXCCL_OP_PROD) {
    return a * b;
  } else if constexpr (Op == OXCCL_OP_MIN) {
    return b < a ? b : a;
  } else {
    return b > a ? b : a;
  }
}

/// Elements of `Fmt` in one 16-byte vector.
template <typename Fmt>
struct alignas(16) Lanes {
  static constexpr int kCount = 16 / sizeof(typename Fmt::Storage);
  typename Fmt::Storage e[kCount];
};

/// Accumulator values for one vector.
template <typename Fmt>
struct AccLanes {
  float v[Lanes<Fmt>::kCount];
};

/// Widens the elements of a 16-byte vector into accumulator values.
template <typename Fmt, Acc A>
OXCCL_DEVICE_INLINE AccLanes<Fmt> widen16(const Vec16& in) {
  const Lanes<Fmt> lanes = bit_cast<Lanes<Fmt>>(in);
  AccLanes<Fmt> out;
#pragma unroll
  for (int i = 0; i < Lanes<Fmt>::kCount; ++i) out.v[i] = acc_round<Fmt, A>(Fmt::decode(lanes.e[i]));
  return out;
}

/// acc = acc op x, lane by lane, each lane rounded to the accumulator.
template <typename Fmt, Acc A, uint32_t Op>
OXCCL_DEVICE_INLINE void combine(AccLanes<Fmt>& acc, const AccLanes<Fmt>& x) {
#pragma unroll
  for (int i = 0; i < Lanes<Fmt>::kCount; ++i)
    acc.v[i] = acc_round<Fmt, A>(apply_op<Op>(acc.v[i], x.v[i]));
}

/// Finishes a reduction of `n` inputs (Avg divides) and rounds to the element type.
template <typename Fmt, Acc A, uint32_t Op>
OXCCL_DEVICE_INLINE Vec16 narrow16(AccLanes<Fmt> acc, uint32_t n) {
  Lanes<Fmt> out;
#pragma unroll
  for (int i = 0; i < Lanes<Fmt>::kCount; ++i) {
    float v = acc.v[i];
    if constexpr (Op == OXCCL_OP_AVG) v = acc_round<Fmt, A>(v / static_cast<float>(n));
    out.e[i] = Fmt::encode(v);
  }
  return bit_cast<Vec16>(out);
}

/// Reduces `n` 16-byte vectors (n >= 1): `input(k)` returns vector k, and is called once
/// per k in order (k = 0, 1, ..., n - 1). Streaming, so no array of the inputs is kept:
/// an array indexed by a run-time k lives in local memory (CUDA) or scratch (HIP). One
/// loop takes every input, the first as the start value, so widen16 and combine appear
/// once each in the code (each is 16 lanes of the software fp8 codec on AMD).
template <typename Fmt, Acc A, uint32_t Op, typename Input>
OXCCL_DEVICE_INLINE Vec16 reduce16(Input&& input, uint32_t n) {
  AccLanes<Fmt> acc{};
  for (uint32_t k = 0; k < n; ++k) {
    const AccLanes<Fmt> x = widen16<Fmt, A>(input(k));
    if (k == 0) {
      acc = x;
    } else {
      combine<Fmt, A, Op>(acc, x);
    }
  }
  return narrow16<Fmt, A, Op>(acc, n);
}

/// Calls `f.template operator()<Op>()` for an op code; false for an unknown code.
template <typename F>
OXCCL_DEVICE_INLINE bool dispatch_op(uint32_t op, F&& f) {
  switch (op) {
    case OXCCL_OP_SUM: f.template operator()<OXCCL_OP_SUM>(); return true;
    case OXCCL_OP_PROD: f.template operator()<OXCCL_OP_PROD>(); return true;
    case OXCCL_OP_MIN: f.template operator()<OXCCL_OP_MIN>(); return true;
    case OXCCL_OP_MAX: f.template operator()<OXCCL_OP_MAX>(); return true;
    case OXCCL_OP_AVG: f.template operator()<OXCCL_OP_AVG>(); return true;
    default: return false;
  }
}

/// Calls `f.template operator()<A>()` for a resolved accumulator.
template <typename F>
OXCCL_DEVICE_INLINE void dispatch_acc(Acc a, F&& f) {
  switch (a) {
    case Acc::F32: f.template operator()<Acc::F32>(); break;
    case Acc::F16: f.template operator()<Acc::F16>(); break;
    default: f.template operator()<Acc::Element>(); break;
  }
}

}  // namespace oxccl

#endif  // OXCCL_REDUCE_HPP_
