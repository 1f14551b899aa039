// Rotary position embedding on the CPU as one autograd function, for
// colo's attention: `y = x · cos + swap_halves(x) · sin` per head, with
// the sign of rotate_half folded into the `sin` table (colo-model's
// `RopeTables`). libtorch runs it as a concatenation (the swapped
// halves), two products and a sum, and a layout copy when the heads go
// first: four or five passes forward, as many backward. Here it is one
// pass each way, writing straight into the layout attention reads.
//
// The arithmetic is libtorch's, rounding where its ops round: in bfloat16
// y = bf16(bf16(x · c) + bf16(x' · s)) with x' the swapped halves;
// backward dx = bf16(bf16(dy · c) + swap(bf16(dy · s))).
//
// Contract
// - `x` is (b, s, n, d) — n heads of d (even) — float32 or bfloat16 on the
//   CPU, any strides with adjacent elements within a head (else copied);
//   `cos` and `sin` are (b or 1, s, d) in x's kind, likewise.
// - The result is (b, n, s, d): contiguous in that order when
//   `heads_major`, otherwise the transposed view of a contiguous (b, s, n,
//   d). It is a new at::Tensor owned by the caller, with a grad_fn when x
//   requires grad (the tables get no gradient).
// - Errors come back as a nonzero status and a message in `err`.
#include "bf16_bits.h"
#include "shim_error.h"
#include "vec_math.h"
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cstdint>
#include <exception>

namespace {

using colo_shim::load;
using colo_shim::narrow;
using colo_shim::rounded;
using colo_shim::store;
using colo_shim::widen;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr int64_t kMaxHead = 1024;

// Element strides of a (b, s, n, d) tensor (d's is 1), and of a (B, s, d)
// table (B's 0 when it is shared by every row).
struct Strides4 {
  int64_t b, s, n;
};
struct Strides3 {
  int64_t b, s;
};

// One head: y[j] = x[j]·c[j] + x[p(j)]·s[j], p swapping the halves. The
// `dir` form serves the backward too: there dx[k] = dy[k]·c[k] +
// (dy·s)[p(k)], i.e. the partner's product with the partner's sine.
template <typename S>
__attribute__((always_inline)) inline void rotate(const float* x, const float* c,
                                                  const float* sn, float* y, int64_t d,
                                                  bool backward) {
  int64_t h = d / 2;
  if (!backward) {
#pragma omp simd
    for (int64_t j = 0; j < h; ++j)
      y[j] = rounded<S>(x[j] * c[j]) + rounded<S>(x[j + h] * sn[j]);
#pragma omp simd
    for (int64_t j = h; j < d; ++j)
      y[j] = rounded<S>(x[j] * c[j]) + rounded<S>(x[j - h] * sn[j]);
  } else {
#pragma omp simd
    for (int64_t j = 0; j < h; ++j)
      y[j] = rounded<S>(x[j] * c[j]) + rounded<S>(x[j + h] * sn[j + h]);
#pragma omp simd
    for (int64_t j = h; j < d; ++j)
      y[j] = rounded<S>(x[j] * c[j]) + rounded<S>(x[j - h] * sn[j - h]);
  }
}

#define COLO_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))

// Rows (b·s positions) [begin, end) of `in` (b, s, n, d) to `out`, whose
// strides are given the same way; tables as above.
template <typename S>
COLO_CLONES void rotate_rows(const S* in, Strides4 is, const S* cos, const S* sin, Strides3 ts,
                             S* out, Strides4 os, int64_t s, int64_t n, int64_t d,
                             int64_t begin, int64_t end, bool backward) {
  float cb[kMaxHead], sb[kMaxHead], xb[kMaxHead], yb[kMaxHead];
  for (int64_t r = begin; r < end; ++r) {
    int64_t bi = r / s, si = r % s;
    load(cos + bi * ts.b + si * ts.s, cb, d);
    load(sin + bi * ts.b + si * ts.s, sb, d);
    for (int64_t hi = 0; hi < n; ++hi) {
      load(in + bi * is.b + si * is.s + hi * is.n, xb, d);
      rotate<S>(xb, cb, sb, yb, d, backward);
      store(yb, out + bi * os.b + si * os.s + hi * os.n, d);
    }
  }
}

Strides4 strides4(const at::Tensor& t) { return {t.stride(0), t.stride(1), t.stride(2)}; }

Strides3 table_strides(const at::Tensor& t) {
  return {t.size(0) == 1 ? 0 : t.stride(0), t.stride(1)};
}

at::Tensor unit_last(const at::Tensor& t) { return t.stride(-1) == 1 ? t : t.contiguous(); }

// `in` (b, s, n, d) rotated into `out` (b, s, n, d), both viewed with
// their own strides.
void run(const at::Tensor& in, const at::Tensor& cos, const at::Tensor& sin, at::Tensor& out,
         bool backward) {
  int64_t b = in.size(0), s = in.size(1), n = in.size(2), d = in.size(3);
  at::parallel_for(0, b * s, 8, [&](int64_t lo, int64_t hi) {
    if (in.scalar_type() == at::kFloat)
      rotate_rows<float>(in.data_ptr<float>(), strides4(in), cos.data_ptr<float>(),
                         sin.data_ptr<float>(), table_strides(cos), out.data_ptr<float>(),
                         strides4(out), s, n, d, lo, hi, backward);
    else
      rotate_rows<uint16_t>(
          reinterpret_cast<const uint16_t*>(in.data_ptr()), strides4(in),
          reinterpret_cast<const uint16_t*>(cos.data_ptr()),
          reinterpret_cast<const uint16_t*>(sin.data_ptr()), table_strides(cos),
          reinterpret_cast<uint16_t*>(out.data_ptr()), strides4(out), s, n, d, lo, hi, backward);
  });
}

// An empty (b, n, s, d) tensor and its (b, s, n, d) view, laid out heads
// first or positions first.
std::pair<at::Tensor, at::Tensor> output(const at::Tensor& x, bool heads_major) {
  int64_t b = x.size(0), s = x.size(1), n = x.size(2), d = x.size(3);
  if (heads_major) {
    at::Tensor y = at::empty({b, n, s, d}, x.options());
    return {y, y.transpose(1, 2)};
  }
  at::Tensor y = at::empty({b, s, n, d}, x.options());
  return {y.transpose(1, 2), y};
}

struct RopeFn : public torch::autograd::Function<RopeFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& cos,
                            const at::Tensor& sin, bool heads_major) {
    at::Tensor xi = unit_last(x), c = unit_last(cos), sn = unit_last(sin);
    auto [y, y_seq] = output(xi, heads_major);
    run(xi, c, sn, y_seq, false);
    ctx->save_for_backward({c, sn});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor &c = saved[0], &sn = saved[1];
    // dy is (b, n, s, d); read it as (b, s, n, d) whatever its strides.
    at::Tensor dy = unit_last(grads[0].to(c.scalar_type())).transpose(1, 2);
    at::Tensor dx = at::empty(dy.sizes(), dy.options().memory_format(at::MemoryFormat::Contiguous));
    run(dy, c, sn, dx, true);
    return {dx, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

extern "C" int colo_torch_rope(const at::Tensor* x, const at::Tensor* cos, const at::Tensor* sin,
                               int heads_major, at::Tensor** out, char* err, size_t len) {
  return colo_shim::guarded(err, len, [&] {
    COLO_CHECK(x->device().is_cpu() && cos->device().is_cpu() && sin->device().is_cpu(),
               "CPU tensors only");
    COLO_CHECK((x->scalar_type() == at::kFloat || x->scalar_type() == at::kBFloat16) &&
                   cos->scalar_type() == x->scalar_type() &&
                   sin->scalar_type() == x->scalar_type(),
               "x and the tables all float32 or all bfloat16, got ", x->scalar_type(), ", ",
               cos->scalar_type(), " and ", sin->scalar_type());
    COLO_CHECK(x->dim() == 4 && x->size(3) % 2 == 0 && x->size(3) <= kMaxHead,
               "x must be (batch, seq, heads, head_dim) with an even head_dim of at most ",
               kMaxHead, ", got ", x->sizes());
    COLO_CHECK(cos->dim() == 3 && cos->sizes() == sin->sizes() &&
                   (cos->size(0) == 1 || cos->size(0) == x->size(0)) &&
                   cos->size(1) == x->size(1) && cos->size(2) == x->size(3),
               "tables ", cos->sizes(), " and ", sin->sizes(), " do not fit x ", x->sizes());
    COLO_CHECK(!cos->requires_grad() && !sin->requires_grad(), "the tables take no gradient");
    *out = new at::Tensor(RopeFn::apply(*x, *cos, *sin, heads_major != 0));
  });
}
