// oxccl/number_formats.hpp: every element format as a traits struct with
//   using Storage = ...;                 // the element's bits
//   static float decode(Storage);        // exact widening to f32
//   static Storage encode(float);        // rounding, special values as documented
// bit-identical to the host reference in kernels/src/formats/ (checked by the GPU
// self-test) and documented in docs/number-formats.md.
//
// Hardware conversions are used where they exist and match the reference: f16 everywhere,
// bf16 and OCP fp8 (satfinite) on NVIDIA. The rest is integer code: bf16 and every fp8 on
// AMD (gfx942's native fp8 instructions are FNUZ-only and not in every toolchain), and fp8
// e4m3b15 everywhere (it exists only in software).
#ifndef OXCCL_NUMBER_FORMATS_HPP_
#define OXCCL_NUMBER_FORMATS_HPP_

#include "abi.h"
#include "platform.hpp"

#if defined(OXCCL_DEVICE_CUDA)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#endif

namespace oxccl {

// ---- f32 ------------------------------------------------------------------------------
struct F32 {
  using Storage = uint32_t;
  static constexpr int kCode = OXCCL_DTYPE_F32;
  OXCCL_DEVICE_INLINE static float decode(uint32_t b) { return bit_cast<float>(b); }
  OXCCL_DEVICE_INLINE static uint32_t encode(float x) { return bit_cast<uint32_t>(x); }
};

// ---- f16: round to nearest even, overflow to infinity ------------------------------------
struct F16 {
  using Storage = uint16_t;
  static constexpr int kCode = OXCCL_DTYPE_F16;
#if defined(OXCCL_DEVICE_CUDA)
  OXCCL_DEVICE_INLINE static float decode(uint16_t b) {
    return __half2float(bit_cast<__half>(b));
  }
  OXCCL_DEVICE_INLINE static uint16_t encode(float x) {
    return bit_cast<uint16_t>(__float2half_rn(x));
  }
#else
  // _Float16 conversions are v_cvt_f32_f16 / v_cvt_f16_f32 (round to nearest even).
  OXCCL_DEVICE_INLINE static float decode(uint16_t b) {
    return static_cast<float>(bit_cast<_Float16>(b));
  }
  OXCCL_DEVICE_INLINE static uint16_t encode(float x) {
    return bit_cast<uint16_t>(static_cast<_Float16>(x));
  }
#endif
};

// ---- bf16: upper half of f32, round to nearest even ----------------------------------------
struct Bf16 {
  using Storage = uint16_t;
  static constexpr int kCode = OXCCL_DTYPE_BF16;
  OXCCL_DEVICE_INLINE static float decode(uint16_t b) {
    return bit_cast<float>(static_cast<uint32_t>(b) << 16);
  }
#if defined(OXCCL_DEVICE_CUDA)
  OXCCL_DEVICE_INLINE static uint16_t encode(float x) {
    return bit_cast<uint16_t>(__float2bfloat16_rn(x));
  }
#else
  OXCCL_DEVICE_INLINE static uint16_t encode(float x) {
    const uint32_t bits = bit_cast<uint32_t>(x);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);
    return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
  }
#endif
};

// ---- fp8: one software codec for OCP and FNUZ ----------------------------------------------
// Encode rounds once from f32 to nearest even and saturates (finite and infinite inputs
// beyond the largest finite value become it, sign kept). NaN becomes 0x7f (OCP) or 0x80
// (FNUZ). FNUZ has no -0: negative values rounding to zero become 0x00.
enum class Fp8Specials { OcpE4m3, Ieee, Fnuz };

template <int ExpBits, int Bias, Fp8Specials Sp>
struct SoftFp8 {
  static constexpr int kManBits = 7 - ExpBits;
  static constexpr int kMinExp = 1 - Bias;
  static constexpr uint32_t kMaxCode =
      Sp == Fp8Specials::OcpE4m3 ? 0x7eu
      : Sp == Fp8Specials::Fnuz  ? 0x7fu
                                 : ((((1u << ExpBits) - 2u) << kManBits) | ((1u << kManBits) - 1u));
  static constexpr uint8_t kNanCode = Sp == Fp8Specials::Fnuz ? 0x80 : 0x7f;

  OXCCL_DEVICE_INLINE static float decode(uint8_t code) {
    const uint32_t mag = code & 0x7fu;
    const int exp_field = static_cast<int>(mag >> kManBits);
    const uint32_t man = mag & ((1u << kManBits) - 1u);
    const uint32_t sign = static_cast<uint32_t>(code & 0x80u) << 24;
    if (Sp == Fp8Specials::Fnuz && code == 0x80) return bit_cast<float>(0x7fc00000u);
    if (Sp == Fp8Specials::OcpE4m3 && mag == 0x7f) return bit_cast<float>(0x7fc00000u);
    if (Sp == Fp8Specials::Ieee && exp_field == (1 << ExpBits) - 1) {
      return bit_cast<float>(man != 0 ? 0x7fc00000u : (sign | 0x7f800000u));
    }
    if (mag == 0) return bit_cast<float>(sign);
    // Every fp8 value is an f32 normal: build the f32 pattern directly.
    int e;
    uint32_t m;
    if (exp_field == 0) {
      // Subnormal: normalise the mantissa (its top bit becomes the implicit one).
      const int lead = 31 - __builtin_clz(man);  // position of the top set bit
      e = kMinExp - (kManBits - lead);
      m = (man << (kManBits - lead)) & ((1u << kManBits) - 1u);
    } else {
      e = exp_field - Bias;
      m = man;
    }
    return bit_cast<float>(sign | (static_cast<uint32_t>(e + 127) << 23) | (m << (23 - kManBits)));
  }

  OXCCL_DEVICE_INLINE static uint8_t encode(float x) {
    const uint32_t bits = bit_cast<uint32_t>(x);
    const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
    const uint32_t abs = bits & 0x7fffffffu;
    if (abs > 0x7f800000u) return kNanCode;
    uint32_t mag = abs == 0x7f800000u ? kMaxCode : round_magnitude(abs);
    if (mag > kMaxCode) mag = kMaxCode;
    if (Sp == Fp8Specials::Fnuz && mag == 0) return 0;
    return static_cast<uint8_t>(sign | mag);
  }

  // |x| (finite f32 bits) to a code, round to nearest even; may exceed kMaxCode.
  OXCCL_DEVICE_INLINE static uint32_t round_magnitude(uint32_t abs) {
    const int exp_field = static_cast<int>(abs >> 23);
    if (exp_field == 0) return 0;
    const int e = exp_field - 127;
    if (e > (1 << ExpBits) - Bias) return 0xff;
    const uint32_t sig = (abs & 0x7fffffu) | 0x800000u;
    const int target = e > kMinExp ? e : kMinExp;
    const uint32_t shift = static_cast<uint32_t>(23 - kManBits + (target - e));
    if (shift > 24) return 0;
    uint32_t q = sig >> shift;
    const uint32_t rem = sig & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    const uint32_t code = (static_cast<uint32_t>(target - kMinExp) << kManBits) + q;
    return code > 0xffu ? 0xffu : code;
  }
};

struct Fp8E4m3 {
  using Storage = uint8_t;
  static constexpr int kCode = OXCCL_DTYPE_FP8_E4M3;
  using Soft = SoftFp8<4, 7, Fp8Specials::OcpE4m3>;
#if defined(OXCCL_DEVICE_CUDA)
  OXCCL_DEVICE_INLINE static float decode(uint8_t b) {
    return __half2float(__half(__nv_cvt_fp8_to_halfraw(b, __NV_E4M3)));
  }
  OXCCL_DEVICE_INLINE static uint8_t encode(float x) {
    return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
  }
#else
  OXCCL_DEVICE_INLINE static float decode(uint8_t b) { return Soft::decode(b); }
  OXCCL_DEVICE_INLINE static uint8_t encode(float x) { return Soft::encode(x); }
#endif
};

struct Fp8E5m2 {
  using Storage = uint8_t;
  static constexpr int kCode = OXCCL_DTYPE_FP8_E5M2;
  using Soft = SoftFp8<5, 15, Fp8Specials::Ieee>;
#if defined(OXCCL_DEVICE_CUDA)
  OXCCL_DEVICE_INLINE static float decode(uint8_t b) {
    return __half2float(__half(__nv_cvt_fp8_to_halfraw(b, __NV_E5M2)));
  }
  OXCCL_DEVICE_INLINE static uint8_t encode(float x) {
    return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E5M2);
  }
#else
  OXCCL_DEVICE_INLINE static float decode(uint8_t b) { return Soft::decode(b); }
  OXCCL_DEVICE_INLINE static uint8_t encode(float x) { return Soft::encode(x); }
#endif
};

struct Fp8E4m3Fnuz {
  using Storage = uint8_t;
  static constexpr int kCode = OXCCL_DTYPE_FP8_E4M3_FNUZ;
  using Soft = SoftFp8<4, 8, Fp8Specials::Fnuz>;
  OXCCL_DEVICE_INLINE static float decode(uint8_t b) { return Soft::decode(b); }
  OXCCL_DEVICE_INLINE static uint8_t encode(float x) { return Soft::encode(x); }
};

struct Fp8E5m2Fnuz {
  using Storage = uint8_t;
  static constexpr int kCode = OXCCL_DTYPE_FP8_E5M2_FNUZ;
  using Soft = SoftFp8<5, 16, Fp8Specials::Fnuz>;
  OXCCL_DEVICE_INLINE static float decode(uint8_t b) { return Soft::decode(b); }
  OXCCL_DEVICE_INLINE static uint8_t encode(float x) { return Soft::encode(x); }
};

// ---- fp8 e4m3b15 (software; bit-compatible with MSCCL++'s __fp8_e4m3b15) -----------------
// Decode: byte into the upper byte of an f16 pattern, exponent+mantissa shifted right by
// one, sign kept; all 256 codes finite, 0x7f/0xff = +/-1.875. Encode: f32 -> f16 (RNE),
// clamp the magnitude to 1.875 (0x3F80; NaN/Inf saturate), double, add 0x80, upper byte.
struct Fp8E4m3b15 {
  using Storage = uint8_t;
  static constexpr int kCode = OXCCL_DTYPE_FP8_E4M3B15;
  OXCCL_DEVICE_INLINE static uint16_t to_f16_bits(uint8_t b) {
    const uint16_t h = static_cast<uint16_t>(b) << 8;
    return static_cast<uint16_t>((h & 0x8000u) | ((h & 0x7f00u) >> 1));
  }
  OXCCL_DEVICE_INLINE static uint8_t from_f16_bits(uint16_t h) {
    uint32_t mag = h & 0x7fffu;
    if (mag > 0x3f80u) mag = 0x3f80u;
    return static_cast<uint8_t>(((h & 0x8000u) | (mag * 2u + 0x80u)) >> 8);
  }
  OXCCL_DEVICE_INLINE static float decode(uint8_t b) { return F16::decode(to_f16_bits(b)); }
  OXCCL_DEVICE_INLINE static uint8_t encode(float x) { return from_f16_bits(F16::encode(x)); }
};

/// Calls `f.template operator()<Format>()` with the format for a data type code; returns
/// false for an unknown code.
template <typename F>
OXCCL_DEVICE_INLINE bool dispatch_dtype(uint32_t dtype, F&& f) {
  switch (dtype) {
    case OXCCL_DTYPE_F32: f.template operator()<F32>(); return true;
    case OXCCL_DTYPE_F16: f.template operator()<F16>(); return true;
    case OXCCL_DTYPE_BF16: f.template operator()<Bf16>(); return true;
    case OXCCL_DTYPE_FP8_E4M3: f.template operator()<Fp8E4m3>(); return true;
    case OXCCL_DTYPE_FP8_E5M2: f.template operator()<Fp8E5m2>(); return true;
    case OXCCL_DTYPE_FP8_E4M3_FNUZ: f.template operator()<Fp8E4m3Fnuz>(); return true;
    case OXCCL_DTYPE_FP8_E5M2_FNUZ: f.template operator()<Fp8E5m2Fnuz>(); return true;
    case OXCCL_DTYPE_FP8_E4M3B15: f.template operator()<Fp8E4m3b15>(); return true;
    default: return false;
  }
}

}  // namespace oxccl

#endif  // OXCCL_NUMBER_FORMATS_HPP_
