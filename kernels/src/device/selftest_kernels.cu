// Self-test kernels: number-format conversions and the reductions (mixed precision, and
// the integers' and f64's own-type reducer of the collective kernels), run on the GPU and
// compared bit for bit with the host reference (kernels/src/selftest.rs).
#include "oxccl/abi.h"
#include "oxccl/allreduce_device.hpp"
#include "oxccl/number_formats.hpp"
#include "oxccl/reduce.hpp"
#include "oxccl/reducers.hpp"
#include "oxccl/vector.hpp"

OXCCL_GLOBAL void oxccl_selftest_decode(OxcclSelftestDecodeArgs args) {
  const uint64_t stride = oxccl::thread_count();
  const uint64_t first = oxccl::thread_index();
  oxccl::dispatch_dtype(args.dtype, [&]<typename Fmt>() OXCCL_INLINE_LAMBDA {
    const auto* in = static_cast<const typename Fmt::Storage*>(args.input);
    for (uint64_t i = first; i < args.count; i += stride) args.output[i] = Fmt::decode(in[i]);
  });
}

OXCCL_GLOBAL void oxccl_selftest_encode(OxcclSelftestEncodeArgs args) {
  const uint64_t stride = oxccl::thread_count();
  const uint64_t first = oxccl::thread_index();
  oxccl::dispatch_dtype(args.dtype, [&]<typename Fmt>() OXCCL_INLINE_LAMBDA {
    auto* out = static_cast<typename Fmt::Storage*>(args.output);
    for (uint64_t i = first; i < args.count; i += stride) out[i] = Fmt::encode(args.input[i]);
  });
}

namespace {

// One (format, accumulator, op) combination, unit by unit with the collective kernels'
// tail handling (the last unit zero-padded on load and stored only inside the buffer; its
// lanes are independent). The inputs are read as they are folded (`reduce16` takes a
// loader), so no run-time-indexed array of them is kept (local memory or scratch).
// Out of line on CUDA: one function per combination keeps each kernel small for ptxas.
// Inlined on HIP (OXCCL_DEVICE_OUTLINED), where a call needs a stack in scratch; so that
// no gfx942 function holds all 110 combinations (over 300,000 lines of LLVM IR, beyond
// what the backend compiles in reasonable time), there is one kernel per element format.
template <typename Fmt, oxccl::Acc A, uint32_t Op>
OXCCL_DEVICE_OUTLINED void reduce_body(const OxcclSelftestReduceArgs& args) {
  const uint32_t n = args.num_inputs;
  const uint64_t total = args.count * sizeof(typename Fmt::Storage);
  const uint64_t stride = oxccl::thread_count();
  for (uint64_t u = oxccl::thread_index(); u < (total + 15) / 16; u += stride) {
    const auto input = [&](uint32_t k) OXCCL_INLINE_LAMBDA {
      return oxccl::allreduce::load_unit(args.inputs[k], u * 16, total);
    };
    oxccl::allreduce::store_unit(args.output, u * 16, oxccl::reduce16<Fmt, A, Op>(input, n), total);
  }
}

// Integers and f64: the collective kernels' own-type reducer, unit by unit (the tail unit
// zero-padded, as above).
template <typename Reducer>
OXCCL_DEVICE_OUTLINED void own_type_body(const OxcclSelftestReduceArgs& args, const Reducer reduce,
                                         uint64_t total) {
  const uint32_t n = args.num_inputs;
  const uint64_t stride = oxccl::thread_count();
  for (uint64_t u = oxccl::thread_index(); u < (total + 15) / 16; u += stride) {
    auto s = reduce.first(oxccl::allreduce::load_unit(args.inputs[0], u * 16, total));
    for (uint32_t k = 1; k < n; ++k) reduce.add(s, oxccl::allreduce::load_unit(args.inputs[k], u * 16, total));
    oxccl::allreduce::store_unit(args.output, u * 16, reduce.finish(s, n), total);
  }
}

OXCCL_DEVICE_INLINE bool inputs_ok(const OxcclSelftestReduceArgs& args) {
  return args.num_inputs != 0 && args.num_inputs <= OXCCL_SELFTEST_MAX_INPUTS;
}

// The reduce kernel of format `Fmt`: every op and accumulator. A block of another data
// type (or a bad input count) is left alone: nothing is written.
template <typename Fmt>
OXCCL_DEVICE_INLINE void reduce_format(const OxcclSelftestReduceArgs& args) {
  if (!inputs_ok(args) || args.dtype != Fmt::kCode) return;
  oxccl::dispatch_op(args.op, [&]<uint32_t Op>() OXCCL_INLINE_LAMBDA {
    oxccl::dispatch_acc(oxccl::resolve_accum<Fmt>(args.accum), [&]<oxccl::Acc A>() OXCCL_INLINE_LAMBDA {
      // f32 and f16 never resolve to Acc::Element (it is Acc::F32 / Acc::F16 for them).
      if constexpr (A != oxccl::Acc::Element || sizeof(typename Fmt::Storage) == 1 ||
                    Fmt::kCode == OXCCL_DTYPE_BF16) {
        reduce_body<Fmt, A, Op>(args);
      }
    });
  });
}

}  // namespace

// The reduce self-test: one kernel per element format (kernels/src/selftest.rs,
// `reduce_kernel`, picks it by data type), and one for the types reduced in their own type.
OXCCL_GLOBAL void oxccl_selftest_reduce_own_type(const OXCCL_GRID_CONSTANT OxcclSelftestReduceArgs param) {
  const OxcclSelftestReduceArgs& args = oxccl::kernel_args(param);
  if (!inputs_ok(args)) return;
  oxccl::allreduce::dispatch_own_type(args.dtype, args.op, [&]<typename W>(auto reducer) OXCCL_INLINE_LAMBDA {
    own_type_body(args, reducer, args.count * sizeof(typename W::Storage));
  });
}

OXCCL_GLOBAL void oxccl_selftest_reduce_f32(const OXCCL_GRID_CONSTANT OxcclSelftestReduceArgs param) {
  reduce_format<oxccl::F32>(oxccl::kernel_args(param));
}

OXCCL_GLOBAL void oxccl_selftest_reduce_f16(const OXCCL_GRID_CONSTANT OxcclSelftestReduceArgs param) {
  reduce_format<oxccl::F16>(oxccl::kernel_args(param));
}

OXCCL_GLOBAL void oxccl_selftest_reduce_bf16(const OXCCL_GRID_CONSTANT OxcclSelftestReduceArgs param) {
  reduce_format<oxccl::Bf16>(oxccl::kernel_args(param));
}

OXCCL_GLOBAL void oxccl_selftest_reduce_fp8_e4m3(const OXCCL_GRID_CONSTANT OxcclSelftestReduceArgs param) {
  reduce_format<oxccl::Fp8E4m3>(oxccl::kernel_args(param));
}

OXCCL_GLOBAL void oxccl_selftest_reduce_fp8_e5m2(const OXCCL_GRID_CONSTANT OxcclSelftestReduceArgs param) {
  reduce_format<oxccl::Fp8E5m2>(oxccl::kernel_args(param));
}

OXCCL_GLOBAL void oxccl_selftest_reduce_fp8_e4m3_fnuz(const OXCCL_GRID_CONSTANT OxcclSelftestReduceArgs param) {
  reduce_format<oxccl::Fp8E4m3Fnuz>(oxccl::kernel_args(param));
}

OXCCL_GLOBAL void oxccl_selftest_reduce_fp8_e5m2_fnuz(const OXCCL_GRID_CONSTANT OxcclSelftestReduceArgs param) {
  reduce_format<oxccl::Fp8E5m2Fnuz>(oxccl::kernel_args(param));
}

OXCCL_GLOBAL void oxccl_selftest_reduce_fp8_e4m3b15(const OXCCL_GRID_CONSTANT OxcclSelftestReduceArgs param) {
  reduce_format<oxccl::Fp8E4m3b15>(oxccl::kernel_args(param));
}
