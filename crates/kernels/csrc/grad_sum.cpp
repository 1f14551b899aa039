// The lanes' gradients of one parameter summed into its float32
// accumulator in one pass, for colo-train's optimizer step on the CPU:
// acc = ((acc or 0) + g0) + g1 + …, each term widened to float32 and
// added in this order, the same float32 additions as `acc.copy_(g0)`
// (or `acc.add_(g0)`) then `acc.add_(g1)`… give, bit for bit, where
// those take a pass over the accumulator per lane (a bfloat16 → float32
// copy, then a read-add-write of the float32 accumulator per further
// lane).
//
// Contract
// - `acc` is float32, contiguous, on the CPU; each of the `n` (≥ 1)
//   `parts` has acc's number of elements, is contiguous, and is float32 or
//   bfloat16 (the Rust side checks this and the shim's checks repeat it).
// - `fresh`: acc's old values are not read (the first part is copied).
// - Errors come back as a nonzero status and a message in `err`.
#include "bf16_bits.h"
#include "shim_error.h"
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cstdint>
#include <vector>

namespace {

using colo_shim::widen;

// acc[b, e) += part (or = part when `first` and fresh).
template <typename S>
__attribute__((target_clones("avx512f", "avx2", "default"))) void add_part(
    float* acc, const S* part, int64_t b, int64_t e, bool copy) {
  if (copy) {
#pragma omp simd
    for (int64_t i = b; i < e; ++i) acc[i] = widen(part[i]);
  } else {
#pragma omp simd
    for (int64_t i = b; i < e; ++i) acc[i] = acc[i] + widen(part[i]);
  }
}

// Elements per block: the accumulator's block stays in the L1/L2 cache
// while every part is added to it.
constexpr int64_t kBlock = 16384;

}  // namespace

extern "C" int colo_torch_grad_sum(const at::Tensor* acc, const at::Tensor* const* parts,
                                   size_t n, int fresh, char* err, size_t len) {
  return colo_shim::guarded(err, len, [&] {
    COLO_CHECK(n >= 1, "no gradients to sum");
    COLO_CHECK(acc->device().is_cpu() && acc->scalar_type() == at::kFloat && acc->is_contiguous(),
               "the accumulator must be a contiguous float32 CPU tensor, got ",
               acc->scalar_type(), " ", acc->sizes());
    std::vector<at::Tensor> ps;
    for (size_t k = 0; k < n; ++k) {
      const at::Tensor& p = *parts[k];
      COLO_CHECK(p.device().is_cpu() && p.is_contiguous() && p.numel() == acc->numel() &&
                     (p.scalar_type() == at::kFloat || p.scalar_type() == at::kBFloat16),
                 "gradient ", k, " must be a contiguous float32 or bfloat16 CPU tensor of ",
                 acc->numel(), " elements, got ", p.scalar_type(), " ", p.sizes());
      ps.push_back(p);
    }
    float* a = acc->data_ptr<float>();
    at::parallel_for(0, acc->numel(), kBlock, [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; b += kBlock) {
        const int64_t e = b + kBlock < end ? b + kBlock : end;
        for (size_t k = 0; k < ps.size(); ++k) {
          const bool copy = k == 0 && fresh;
          if (ps[k].scalar_type() == at::kFloat)
            add_part(a, ps[k].data_ptr<float>(), b, e, copy);
          else
            add_part(a, reinterpret_cast<const uint16_t*>(ps[k].data_ptr()), b, e, copy);
        }
      }
    });
  });
}
