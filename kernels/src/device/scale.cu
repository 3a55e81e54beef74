// The pre-multiply of NCCL's PreMulSum operator (ncclRedOpCreatePreMulSum): every rank
// multiplies its own input by its own scalar, then the ordinary sum runs on the products.
// The communicator launches this kernel on the caller's stream right before the sum
// (collectives/src/communicator/premul.rs). Host reference: `reduce::pre_multiply` in
// kernels/src/reduce.rs; host stand-in: kernels/src/host_kernels.rs.
//
// Arithmetic, per element type (the same as the host reference, bit for bit):
// - float formats (f32, f16, bf16, every fp8): decode both to f32, multiply, encode once with
//   the format's own rounding (number_formats.hpp, as the reducers' final rounding). The
//   product of two elements with at most 12 significant bits (f16 11, bf16 8, fp8 4 at
//   most) is exact in f32, so this is the correctly rounded product of the type; for f32 it
//   is the f32 product;
// - f64: the f64 product;
// - integers: the product in the type, wrapping (two's complement: the low bits of the
//   product are the same signed or unsigned).
//
// The scalar is read once per thread: from device memory when `scalar` is set (so a CUDA
// graph replays with the value the pointer holds at replay time), else from `scalar_bits`.
#include "oxccl/abi.h"
#include "oxccl/number_formats.hpp"

namespace oxccl {
namespace scale {

template <typename T>
OXCCL_DEVICE_INLINE T scalar_of(const OxcclScaleArgs& a) {
  return a.scalar != nullptr ? *static_cast<const T*>(a.scalar) : static_cast<T>(a.scalar_bits);
}

template <typename Fmt>
OXCCL_DEVICE_INLINE void float_body(const OxcclScaleArgs& a) {
  using S = typename Fmt::Storage;
  const float s = Fmt::decode(scalar_of<S>(a));
  const S* in = static_cast<const S*>(a.input);
  S* out = static_cast<S*>(a.output);
  const uint64_t stride = thread_count();
  for (uint64_t i = thread_index(); i < a.count; i += stride) out[i] = Fmt::encode(Fmt::decode(in[i]) * s);
}

// Unsigned storage: its wrapping product has the bits of the signed one.
template <typename T>
OXCCL_DEVICE_INLINE void integer_body(const OxcclScaleArgs& a) {
  const T s = scalar_of<T>(a);
  const T* in = static_cast<const T*>(a.input);
  T* out = static_cast<T*>(a.output);
  const uint64_t stride = thread_count();
  for (uint64_t i = thread_index(); i < a.count; i += stride) out[i] = static_cast<T>(in[i] * s);
}

OXCCL_DEVICE_INLINE void f64_body(const OxcclScaleArgs& a) {
  const double s = bit_cast<double>(scalar_of<uint64_t>(a));
  const uint64_t* in = static_cast<const uint64_t*>(a.input);
  uint64_t* out = static_cast<uint64_t*>(a.output);
  const uint64_t stride = thread_count();
  for (uint64_t i = thread_index(); i < a.count; i += stride) {
    out[i] = bit_cast<uint64_t>(bit_cast<double>(in[i]) * s);
  }
}

}  // namespace scale
}  // namespace oxccl

OXCCL_GLOBAL void oxccl_scale(const OXCCL_GRID_CONSTANT OxcclScaleArgs param) {
  const OxcclScaleArgs& args = oxccl::kernel_args(param);
  using namespace oxccl::scale;
  switch (args.dtype) {
    case OXCCL_DTYPE_I8:
    case OXCCL_DTYPE_U8: integer_body<uint8_t>(args); return;
    case OXCCL_DTYPE_I32:
    case OXCCL_DTYPE_U32: integer_body<uint32_t>(args); return;
    case OXCCL_DTYPE_I64:
    case OXCCL_DTYPE_U64: integer_body<uint64_t>(args); return;
    case OXCCL_DTYPE_F64: f64_body(args); return;
    default: oxccl::dispatch_dtype(args.dtype, [&]<typename Fmt>() OXCCL_INLINE_LAMBDA { float_body<Fmt>(args); }); return;
  }
}
