// libtorch's fused AdamW (`torch._fused_adamw_`, what `torch.optim.AdamW(
// fused=True)` runs) for colo's trainer, which tch does not expose: one
// vectorised pass over each parameter, its gradient and its two moments,
// where the same update as separate tensor ops takes eight passes and two
// temporaries (BENCHMARKS.md, "CPU kernels": with the bf16 copy of the
// masters 48 ms against 21 ms, the fused pass alone 14 ms, for 12.6 M
// float32 parameters on one thread).
//
// Contract
// - `params`, `grads`, `exp_avgs`, `exp_avg_sqs` each point to `n` valid
//   at::Tensor objects (tch's tensors are at::Tensor*), index i of each
//   belonging together: same shape, dtype and device, contiguous. The Rust
//   side checks this before the call: libtorch's CPU kernel does not, and
//   walks every parameter's elements through the other tensors' pointers.
// - `step` is the update's number (1 for the first), the same for every
//   tensor; `grad_scale` divides the gradients first (libtorch's meaning;
//   colo passes 1 / the clipping coefficient), 1.0 for none.
// - The grads may be overwritten (with the unscaled values).
// - Errors (libtorch's checks) come back as a nonzero status and a message
//   in `err`; nothing throws into Rust.
#include "shim_error.h"
#include <ATen/ATen.h>

#include <cstring>
#include <exception>
#include <vector>

namespace {


std::vector<at::Tensor> list(const at::Tensor* const* ts, size_t n) {
  std::vector<at::Tensor> out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) out.push_back(*ts[i]);
  return out;
}

}  // namespace

extern "C" int colo_torch_fused_adamw(const at::Tensor* const* params,
                                      const at::Tensor* const* grads,
                                      const at::Tensor* const* exp_avgs,
                                      const at::Tensor* const* exp_avg_sqs, size_t n,
                                      double step, double lr, double beta1, double beta2,
                                      double weight_decay, double eps, double grad_scale,
                                      char* err, size_t len) {
  return colo_shim::guarded(err, len, [&] {
    if (n == 0) return;
    auto p = list(params, n), g = list(grads, n), m = list(exp_avgs, n), v = list(exp_avg_sqs, n);
    auto options = at::TensorOptions().dtype(at::kFloat).device(p[0].device());
    std::vector<at::Tensor> steps(n, at::scalar_tensor(step, options));
    std::optional<at::Tensor> scale;
    if (grad_scale != 1.0) scale = at::scalar_tensor(grad_scale, options);
    at::_fused_adamw_(p, g, m, v, {}, steps, lr, beta1, beta2, weight_decay, eps,
                      /*amsgrad=*/false, /*maximize=*/false, scale, std::nullopt);
  });
}
