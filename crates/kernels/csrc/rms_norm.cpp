// RMSNorm on the CPU as one autograd function with a hand-written
// backward, for colo's model: `y = bf16(x · rstd) · w` with rstd =
// 1 / sqrt(mean(x²) + eps) computed in float32, exactly the formula of
// libtorch's `rms_norm` (and transformers' `Qwen2RMSNorm`), which on the
// CPU is a composite of ~8 element-wise ops forward and ~16 backward, each
// a pass over the activations with float32 temporaries. Here the forward
// is one read of x and one write of y per row; the backward one read of
// x and dy and one write of dx, with the weight's gradient summed in
// float32 over fixed blocks of rows (so the result does not depend on the
// thread count).
//
// Contract
// - `x` is (..., h), `w` is (h), both float32 or both bfloat16, on the
//   CPU; the Rust side checks this and the shim's checks repeat it.
// - The result is a new at::Tensor (owned by the caller, freed by tch's
//   `at_free`), with a grad_fn when x or w requires grad.
// - Errors come back as a nonzero status and a message in `err`
//   (`shim_error.h`); nothing throws into Rust. Errors in the backward are raised by libtorch's
//   autograd engine, which tch reports as an error of `backward`.
#include "bf16_bits.h"
#include "shim_error.h"
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cmath>
#include <cstdint>
#include <exception>
#include <vector>

namespace {

using colo_shim::narrow;
using colo_shim::rounded;
using colo_shim::widen;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Rows of the weight gradient's partial sums: fixed, not per thread.
constexpr int64_t kRowBlock = 64;

template <typename S>
__attribute__((always_inline)) inline void forward_row(const S* x, const float* w, S* y,
                                                       float* rstd, int64_t h, float eps) {
  float ss = 0.f;
#pragma omp simd reduction(+ : ss)
  for (int64_t j = 0; j < h; ++j) {
    float v = widen(x[j]);
    ss += v * v;
  }
  float r = 1.f / std::sqrt(ss / static_cast<float>(h) + eps);
  *rstd = r;
#pragma omp simd
  for (int64_t j = 0; j < h; ++j) narrow(rounded<S>(widen(x[j]) * r) * w[j], &y[j]);
}

// dn = dy · w (rounded to the storage kind, as autograd's product is);
// dx = r · dn − x · r³ · Σ(dn · x) / h; the weight's gradient gets
// dy · bf16(x · r), summed in float32.
template <typename S>
__attribute__((always_inline)) inline void backward_row(const S* x, const S* dy, const float* w,
                                                        float r, S* dx, float* dw, int64_t h) {
  float dot = 0.f;
#pragma omp simd reduction(+ : dot)
  for (int64_t j = 0; j < h; ++j) dot += rounded<S>(widen(dy[j]) * w[j]) * widen(x[j]);
  float c = r * r * r * dot / static_cast<float>(h);
#pragma omp simd
  for (int64_t j = 0; j < h; ++j) {
    float xj = widen(x[j]), g = widen(dy[j]);
    narrow(r * rounded<S>(g * w[j]) - xj * c, &dx[j]);
    dw[j] += g * rounded<S>(xj * r);
  }
}

// Each kernel compiled for AVX-512, AVX2 and baseline x86-64, picked at
// load time by the CPU (GCC's function multi-versioning).
#define COLO_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))

template <typename S>
COLO_CLONES void forward_rows(const S* x, const float* w, S* y, float* rstd, int64_t begin,
                              int64_t end, int64_t h, float eps) {
  for (int64_t i = begin; i < end; ++i) forward_row(x + i * h, w, y + i * h, rstd + i, h, eps);
}

template <typename S>
COLO_CLONES void backward_rows(const S* x, const S* dy, const float* w, const float* rstd,
                               S* dx, float* dw, int64_t begin, int64_t end, int64_t h) {
  for (int64_t i = begin; i < end; ++i)
    backward_row(x + i * h, dy + i * h, w, rstd[i], dx + i * h, dw, h);
}

template <typename S>
void run_forward(const at::Tensor& x, const at::Tensor& wf, at::Tensor& y, at::Tensor& rstd,
                 int64_t h, float eps) {
  const S* xp = reinterpret_cast<const S*>(x.data_ptr());
  S* yp = reinterpret_cast<S*>(y.data_ptr());
  const float* wp = wf.data_ptr<float>();
  float* rp = rstd.data_ptr<float>();
  at::parallel_for(0, rstd.numel(), kRowBlock, [&](int64_t b, int64_t e) {
    forward_rows<S>(xp, wp, yp, rp, b, e, h, eps);
  });
}

template <typename S>
void run_backward(const at::Tensor& x, const at::Tensor& dy, const at::Tensor& wf,
                  const at::Tensor& rstd, at::Tensor& dx, at::Tensor& partial, int64_t h) {
  const S* xp = reinterpret_cast<const S*>(x.data_ptr());
  const S* gp = reinterpret_cast<const S*>(dy.data_ptr());
  S* dxp = reinterpret_cast<S*>(dx.data_ptr());
  const float* wp = wf.data_ptr<float>();
  const float* rp = rstd.data_ptr<float>();
  float* pp = partial.data_ptr<float>();
  int64_t rows = rstd.numel();
  at::parallel_for(0, partial.size(0), 1, [&](int64_t b, int64_t e) {
    for (int64_t blk = b; blk < e; ++blk) {
      int64_t r0 = blk * kRowBlock, r1 = std::min(rows, r0 + kRowBlock);
      backward_rows<S>(xp, gp, wp, rp, dxp, pp + blk * h, r0, r1, h);
    }
  });
}

struct RmsNormFn : public torch::autograd::Function<RmsNormFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w,
                            double eps) {
    int64_t h = w.numel();
    at::Tensor xc = x.contiguous();
    at::Tensor wf = w.to(at::kFloat).contiguous();
    at::Tensor y = at::empty_like(xc);
    at::Tensor rstd = at::empty({xc.numel() / h}, xc.options().dtype(at::kFloat));
    if (xc.scalar_type() == at::kFloat)
      run_forward<float>(xc, wf, y, rstd, h, static_cast<float>(eps));
    else
      run_forward<uint16_t>(xc, wf, y, rstd, h, static_cast<float>(eps));
    ctx->save_for_backward({xc, w, rstd});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &w = saved[1], &rstd = saved[2];
    int64_t h = w.numel(), rows = rstd.numel();
    at::Tensor dy = grads[0].to(x.scalar_type()).contiguous();
    at::Tensor wf = w.to(at::kFloat).contiguous();
    at::Tensor dx = at::empty_like(x);
    int64_t blocks = (rows + kRowBlock - 1) / kRowBlock;
    at::Tensor partial = at::zeros({std::max<int64_t>(blocks, 1), h}, wf.options());
    if (x.scalar_type() == at::kFloat)
      run_backward<float>(x, dy, wf, rstd, dx, partial, h);
    else
      run_backward<uint16_t>(x, dy, wf, rstd, dx, partial, h);
    return {dx, partial.sum(0).to(w.scalar_type()), at::Tensor()};
  }
};

}  // namespace

extern "C" int colo_torch_rms_norm(const at::Tensor* x, const at::Tensor* w, double eps,
                                   at::Tensor** out, char* err, size_t len) {
  return colo_shim::guarded(err, len, [&] {
    COLO_CHECK(x->device().is_cpu() && w->device().is_cpu(), "CPU tensors only");
    COLO_CHECK(x->scalar_type() == w->scalar_type() &&
                   (x->scalar_type() == at::kFloat || x->scalar_type() == at::kBFloat16),
               "x and w both float32 or both bfloat16, got ", x->scalar_type(), " and ",
               w->scalar_type());
    COLO_CHECK(w->dim() == 1 && x->dim() >= 1 && x->size(-1) == w->size(0) && w->numel() > 0,
               "x ", x->sizes(), " does not end in w's size ", w->sizes());
    *out = new at::Tensor(RmsNormFn::apply(*x, *w, eps));
  });
}
