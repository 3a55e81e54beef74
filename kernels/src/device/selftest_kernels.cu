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

// One (format, accumulator, op) combination. Not inlined: one function per combination
// keeps the kernel small, so register allocation (and compile time) stays linear in the
// number of combinations instead of handling all 110 in one body.
template <typename Fmt, oxccl::Acc A, uint32_t Op>
__device__ __noinline__ void reduce_body(const OxcclSelftestReduceArgs& args) {
  using S = typename Fmt::Storage;
  constexpr uint64_t kLanes = oxccl::Lanes<Fmt>::kCount;
  const uint32_t n = args.num_inputs;
  const uint64_t stride = oxccl::thread_count();
  const uint64_t first = oxccl::thread_index();
  const uint64_t vectors = args.count / kLanes;
  for (uint64_t v = first; v < vectors; v += stride) {
    oxccl::Vec16 in[OXCCL_SELFTEST_MAX_INPUTS];
    for (uint32_t k = 0; k < n; ++k) {
      in[k] = oxccl::load16(static_cast<const S*>(args.inputs[k]) + v * kLanes);
    }
    oxccl::store16(static_cast<S*>(args.output) + v * kLanes, oxccl::reduce16<Fmt, A, Op>(in, n));
  }
  for (uint64_t i = vectors * kLanes + first; i < args.count; i += stride) {
    S in[OXCCL_SELFTEST_MAX_INPUTS];
    for (uint32_t k = 0; k < n; ++k) in[k] = static_cast<const S*>(args.inputs[k])[i];
    static_cast<S*>(args.output)[i] = oxccl::reduce1<Fmt, A, Op>(in, n);
  }
}

// Integers and f64: the collective kernels' own-type reducer, unit by unit (the tail unit
// zero-padded; its lanes are independent).
template <typename Reducer>
__device__ __noinline__ void own_type_body(const OxcclSelftestReduceArgs& args, const Reducer reduce,
                                           uint64_t total) {
  const uint32_t n = args.num_inputs;
  const uint64_t stride = oxccl::thread_count();
  for (uint64_t u = oxccl::thread_index(); u < (total + 15) / 16; u += stride) {
    auto s = reduce.first(oxccl::allreduce::load_unit(args.inputs[0], u * 16, total));
    for (uint32_t k = 1; k < n; ++k) reduce.add(s, oxccl::allreduce::load_unit(args.inputs[k], u * 16, total));
    oxccl::allreduce::store_unit(args.output, u * 16, reduce.finish(s, n), total);
  }
}

}  // namespace

OXCCL_GLOBAL void oxccl_selftest_reduce(const OXCCL_GRID_CONSTANT OxcclSelftestReduceArgs param) {
  const OxcclSelftestReduceArgs& args = oxccl::kernel_args(param);
  if (args.num_inputs == 0 || args.num_inputs > OXCCL_SELFTEST_MAX_INPUTS) return;
  const bool own_type = oxccl::allreduce::dispatch_own_type(args.dtype, args.op, [&]<typename W>(auto reducer) OXCCL_INLINE_LAMBDA {
    own_type_body(args, reducer, args.count * sizeof(typename W::Storage));
  });
  if (own_type) return;
  oxccl::dispatch_dtype(args.dtype, [&]<typename Fmt>() OXCCL_INLINE_LAMBDA {
    oxccl::dispatch_op(args.op, [&]<uint32_t Op>() OXCCL_INLINE_LAMBDA {
      oxccl::dispatch_acc(oxccl::resolve_accum<Fmt>(args.accum), [&]<oxccl::Acc A>() OXCCL_INLINE_LAMBDA {
        // f32 and f16 never resolve to Acc::Element (it is Acc::F32 / Acc::F16 for them).
        if constexpr (A != oxccl::Acc::Element || sizeof(typename Fmt::Storage) == 1 ||
                      Fmt::kCode == OXCCL_DTYPE_BF16) {
          reduce_body<Fmt, A, Op>(args);
        }
      });
    });
  });
}
