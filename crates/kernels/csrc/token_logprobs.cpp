// The loss head on the CPU as one autograd function: from logits (N, V)
// in float32 or bfloat16 and targets (N), the log-probability of each
// target and the entropy of each row, in float32:
//   lse = log Σ_j exp(x_j),  lp = x_t − lse,  H = lse − Σ_j p_j x_j.
// libtorch's way (what verl runs) is `log_softmax(logits.float())`, a
// gather and, for the entropy, `−Σ exp(lsm) · lsm`: a float32 copy of the
// logits, a float32 (N, V) log-softmax kept for the backward, and in the
// backward a zero-filled (N, V) tensor for the gather, the log-softmax's
// backward and a cast back. Here the forward reads each row twice and
// writes two floats; the backward reads it once and writes its gradient
// once, in the logits' kind; what is kept for the backward is the logits
// (already there) and two floats a row.
//
//   dlp/dx_j = [j = t] − p_j,  dH/dx_j = −p_j (x_j − E),  E = Σ p x = lse − H.
//
// Contract
// - `logits` is (..., V) float32 or bfloat16 on the CPU; `targets` has the
//   leading dims' N elements, integer, each in [0, V): checked here.
// - The results are two new at::Tensors (lp, H), each shaped like
//   `targets`, float32, owned by the caller (freed by tch's `at_free`).
// - Errors come back as a nonzero status and a message in `err`.
#include "bf16_bits.h"
#include "vec_math.h"
#include "shim_error.h"
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cmath>
#include <cstdint>
#include <exception>
#include <limits>

namespace {

using colo_shim::exp_nonpositive;
using colo_shim::load;
using colo_shim::narrow;
using colo_shim::store;
using colo_shim::widen;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;


// Rows are worked through in blocks of float32 buffers: every loop below
// is then either a conversion or float32-only arithmetic, which GCC
// vectorises for AVX-512 and AVX2 alike (loops mixing bfloat16 loads or
// stores with the exponential it does not).
constexpr int64_t kBlock = 512;

template <typename S>
__attribute__((always_inline)) inline void forward_row(const S* x, int64_t v, int64_t t,
                                                       float* lp, float* h, float* lse_out) {
  float xb[kBlock];
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t j0 = 0; j0 < v; j0 += kBlock) {
    int64_t n = std::min(kBlock, v - j0);
    load(x + j0, xb, n);
#pragma omp simd reduction(max : m)
    for (int64_t j = 0; j < n; ++j) m = std::max(m, xb[j]);
  }
  float s = 0.f, sx = 0.f;
  for (int64_t j0 = 0; j0 < v; j0 += kBlock) {
    int64_t n = std::min(kBlock, v - j0);
    load(x + j0, xb, n);
#pragma omp simd reduction(+ : s, sx)
    for (int64_t j = 0; j < n; ++j) {
      float e = exp_nonpositive(xb[j] - m);
      s += e;
      sx += e * xb[j];
    }
  }
  float lse = m + std::log(s);
  *lse_out = lse;
  *lp = widen(x[t]) - lse;
  *h = lse - sx / s;
}

template <typename S>
__attribute__((always_inline)) inline void backward_row(const S* x, int64_t v, int64_t t,
                                                        float lse, float expect, float g_lp,
                                                        float g_h, S* dx) {
  float xb[kBlock], db[kBlock];
  for (int64_t j0 = 0; j0 < v; j0 += kBlock) {
    int64_t n = std::min(kBlock, v - j0);
    load(x + j0, xb, n);
#pragma omp simd
    for (int64_t j = 0; j < n; ++j)
      db[j] = -exp_nonpositive(xb[j] - lse) * (g_lp + g_h * (xb[j] - expect));
    store(db, dx + j0, n);
  }
  narrow(widen(dx[t]) + g_lp, &dx[t]);
}

#define COLO_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))

template <typename S>
COLO_CLONES void forward_rows(const S* x, const int64_t* tg, int64_t v, float* lp, float* h,
                              float* lse, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) forward_row(x + i * v, v, tg[i], lp + i, h + i, lse + i);
}

template <typename S>
COLO_CLONES void backward_rows(const S* x, const int64_t* tg, int64_t v, const float* lse,
                               const float* expect, const float* g_lp, const float* g_h, S* dx,
                               int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i)
    backward_row(x + i * v, v, tg[i], lse[i], expect[i], g_lp ? g_lp[i] : 0.f,
                 g_h ? g_h[i] : 0.f, dx + i * v);
}

// Rows per parallel task: enough work to be worth a thread.
int64_t grain(int64_t v) { return std::max<int64_t>(1, 32768 / std::max<int64_t>(v, 1)); }

struct TokenLogprobsFn : public torch::autograd::Function<TokenLogprobsFn> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& logits,
                               const at::Tensor& targets) {
    int64_t v = logits.size(-1);
    at::Tensor x = logits.reshape({-1, v}).contiguous();
    at::Tensor tg = targets.reshape({-1}).to(at::kLong).contiguous();
    int64_t n = x.size(0);
    auto opts = x.options().dtype(at::kFloat);
    // The results in the targets' shape from the start (outputs of an
    // autograd function are better not views).
    at::Tensor lp = at::empty(targets.sizes(), opts), h = at::empty(targets.sizes(), opts);
    at::Tensor lse = at::empty({n}, opts);
    const int64_t* tp = tg.data_ptr<int64_t>();
    at::parallel_for(0, n, grain(v), [&](int64_t b, int64_t e) {
      if (x.scalar_type() == at::kFloat)
        forward_rows<float>(x.data_ptr<float>(), tp, v, lp.data_ptr<float>(),
                            h.data_ptr<float>(), lse.data_ptr<float>(), b, e);
      else
        forward_rows<uint16_t>(reinterpret_cast<const uint16_t*>(x.data_ptr()), tp, v,
                               lp.data_ptr<float>(), h.data_ptr<float>(),
                               lse.data_ptr<float>(), b, e);
    });
    ctx->set_materialize_grads(false);
    ctx->save_for_backward({x, tg, lse, lse - h.reshape({-1})});
    ctx->saved_data["shape"] = logits.sizes().vec();
    return {lp, h};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &tg = saved[1], &lse = saved[2], &expect = saved[3];
    int64_t n = x.size(0), v = x.size(1);
    at::Tensor g_lp, g_h;
    if (grads[0].defined()) g_lp = grads[0].reshape({-1}).to(at::kFloat).contiguous();
    if (grads[1].defined()) g_h = grads[1].reshape({-1}).to(at::kFloat).contiguous();
    at::Tensor dx = at::empty_like(x);
    const float* gl = g_lp.defined() ? g_lp.data_ptr<float>() : nullptr;
    const float* gh = g_h.defined() ? g_h.data_ptr<float>() : nullptr;
    const int64_t* tp = tg.data_ptr<int64_t>();
    at::parallel_for(0, n, grain(v), [&](int64_t b, int64_t e) {
      if (x.scalar_type() == at::kFloat)
        backward_rows<float>(x.data_ptr<float>(), tp, v, lse.data_ptr<float>(),
                             expect.data_ptr<float>(), gl, gh, dx.data_ptr<float>(), b, e);
      else
        backward_rows<uint16_t>(reinterpret_cast<const uint16_t*>(x.data_ptr()), tp, v,
                                lse.data_ptr<float>(), expect.data_ptr<float>(), gl, gh,
                                reinterpret_cast<uint16_t*>(dx.data_ptr()), b, e);
    });
    return {dx.view(ctx->saved_data["shape"].toIntVector()), at::Tensor()};
  }
};

}  // namespace

extern "C" int colo_torch_token_logprobs(const at::Tensor* logits, const at::Tensor* targets,
                                         at::Tensor** lp, at::Tensor** entropy, char* err,
                                         size_t len) {
  return colo_shim::guarded(err, len, [&] {
    COLO_CHECK(logits->device().is_cpu() && targets->device().is_cpu(), "CPU tensors only");
    COLO_CHECK(logits->scalar_type() == at::kFloat || logits->scalar_type() == at::kBFloat16,
               "logits must be float32 or bfloat16, got ", logits->scalar_type());
    COLO_CHECK(!at::isFloatingType(targets->scalar_type()) && targets->scalar_type() != at::kBool,
               "targets must be integers, got ", targets->scalar_type());
    COLO_CHECK(logits->dim() >= 1 && logits->size(-1) > 0 &&
                   targets->numel() * logits->size(-1) == logits->numel(),
               "logits ", logits->sizes(), " do not hold one row per target of ",
               targets->sizes());
    if (targets->numel() > 0) {
      int64_t lo = targets->min().item<int64_t>(), hi = targets->max().item<int64_t>();
      COLO_CHECK(lo >= 0 && hi < logits->size(-1), "targets in [", lo, ", ", hi,
                 "], outside the vocabulary of ", logits->size(-1));
    }
    auto out = TokenLogprobsFn::apply(*logits, *targets);
    *lp = new at::Tensor(out[0]);
    *entropy = new at::Tensor(out[1]);
  });
}
