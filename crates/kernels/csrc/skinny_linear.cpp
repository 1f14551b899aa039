// Decode's matrix products on the CPU: y = x · wᵀ (+ b) in bfloat16 for a
// few rows of x (one per sequence a decode step advances) against a large
// weight w (out, in), with AVX512-BF16's pairwise dot products
// (`vdpbf16ps`) reading w once, in its own row-major layout.
//
// Why: a decode step reads every weight once for a handful of rows, so it
// is bound by memory bandwidth. libtorch's bfloat16 matmul (oneDNN's
// brgemm) first copies w's blocks into its own packed layout on each call
// (`copy_b_chunk_in_buffer` in a profile): over a Qwen2.5-0.5B decode
// step's weights (988 MB) on one core of the AVX-512 EPYC, 8 rows ran at
// 13–14 GB/s of weights against this kernel's 26–27, 16 rows at 9–12
// against 17, 32 rows alike (`cargo run --release -p colo-kernels
// --example skinny_linear`; a one-thread copy read 20 GB/s).
//
// How: each output y[i][j] is the dot product of row i of x and row j of
// w along `in`, whose bfloat16 pairs `vdpbf16ps` multiplies and adds into
// sixteen float32 partial sums; a tile of kRows rows of x by kCols rows of
// w keeps kRows · kCols such sums in registers while it walks `in` 32
// values at a time (the tail under a mask), prefetching the next kCols
// rows of w; the partial sums are added up at the end of the row. Each
// output is one tile's work in a fixed order, so the result does not
// depend on the thread count; it is rounded to bfloat16 once, after the
// bias is added in float32, as libtorch's `linear` rounds. The sums run
// in another order than oneDNN's, so the two differ by a rounding.
//
// Contract
// - x is (..., in) bfloat16 with at most kMaxRows rows (the product of
//   its leading sizes), w is (out, in) bfloat16 and contiguous, b is
//   absent or (out) bfloat16; all on the CPU, none needing a gradient
//   (decode runs without autograd: the kernel records no graph). The
//   Rust side checks this and the shim's checks repeat it.
// - Only on CPUs with AVX512-BF16 (`colo_torch_skinny_linear_supported`);
//   elsewhere the caller uses libtorch's `linear`.
// - The result is a new at::Tensor (..., out), owned by the caller.
#include "bf16_bits.h"
#include "shim_error.h"
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <cstdint>

namespace {

constexpr int64_t kMaxRows = 32;
constexpr int kRows = 4;  // rows of x a tile holds
constexpr int kCols = 4;  // rows of w a tile holds

#define COLO_BF16 __attribute__((target("avx512f,avx512bw,avx512bf16")))

// The float32 sums of one tile: rows [0, R) of x against rows [0, C) of w,
// both with row stride `k`, into out[i * ldo + j]; on the way, `lines`
// cache lines from `pf` on are prefetched each step along `in`.
template <int R, int C>
COLO_BF16 inline void tile(const uint16_t* x, const uint16_t* w, int64_t k, float* out,
                           int64_t ldo, const char* pf, int64_t lines) {
  __m512 acc[R][C];
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < C; ++j) acc[i][j] = _mm512_setzero_ps();
  for (int64_t kk = 0; kk < k; kk += 32) {
    // A full mask but for the tail, where it stops at `k`.
    __mmask32 m = k - kk >= 32 ? ~__mmask32{0} : (__mmask32{1} << (k - kk)) - 1;
    __m512bh wv[C];
#pragma GCC unroll 8
    for (int j = 0; j < C; ++j) wv[j] = (__m512bh)_mm512_maskz_loadu_epi16(m, w + j * k + kk);
    for (int64_t l = 0; l < lines; ++l, pf += 64) _mm_prefetch(pf, _MM_HINT_T0);
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i) {
      __m512bh xv = (__m512bh)_mm512_maskz_loadu_epi16(m, x + i * k + kk);
#pragma GCC unroll 8
      for (int j = 0; j < C; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], xv, wv[j]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < C; ++j) out[i * ldo + j] = _mm512_reduce_add_ps(acc[i][j]);
}

// Sums for all `rows` rows of x against the C rows of w at `w`. The next C
// rows of w (contiguous after these) are prefetched, spread evenly over
// the tiles' steps, so that memory streams them while these compute: with
// the prefetch in the first tile only, a Qwen2.5-0.5B decode step of 8
// rows ran at 22 GB/s of weights, spread at 27.
template <int C>
COLO_BF16 void columns(const uint16_t* x, int64_t rows, const uint16_t* w, int64_t k,
                       float* out, int64_t ldo) {
  const int64_t tiles = (rows + kRows - 1) / kRows, steps = (k + 31) / 32;
  const int64_t next_lines = (C * k * 2 + 63) / 64;
  const int64_t lines = (next_lines + tiles * steps - 1) / (tiles * steps);
  const char* pf = reinterpret_cast<const char*>(w + C * k);
  int64_t i = 0;
  for (; i + kRows <= rows; i += kRows, pf += lines * steps * 64)
    tile<kRows, C>(x + i * k, w, k, out + i * ldo, ldo, pf, lines);
  for (; i < rows; ++i, pf += lines * steps * 64)
    tile<1, C>(x + i * k, w, k, out + i * ldo, ldo, pf, lines);
}

// y (rows, n) = x (rows, k) · w (n, k)ᵀ + b, the columns split over
// libtorch's intra-op threads in blocks of whole tiles.
COLO_BF16 void run(const uint16_t* x, int64_t rows, const uint16_t* w, const uint16_t* b,
                   int64_t n, int64_t k, uint16_t* y) {
  const int64_t tiles = (n + kCols - 1) / kCols;
  at::parallel_for(0, tiles, 64, [&](int64_t t0, int64_t t1) {
    float sums[kMaxRows * kCols];
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t j0 = t * kCols, cols = n - j0 < kCols ? n - j0 : kCols;
      if (cols == kCols)
        columns<kCols>(x, rows, w + j0 * k, k, sums, kCols);
      else
        for (int64_t j = 0; j < cols; ++j) columns<1>(x, rows, w + (j0 + j) * k, k, sums + j, kCols);
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j) {
          float bias = b ? colo_shim::widen(b[j0 + j]) : 0.f;
          colo_shim::narrow(sums[i * kCols + j] + bias, &y[i * n + j0 + j]);
        }
    }
  });
}

}  // namespace

extern "C" int colo_torch_skinny_linear_supported() {
  return __builtin_cpu_supports("avx512bf16") ? 1 : 0;
}

extern "C" int64_t colo_torch_skinny_linear_max_rows() { return kMaxRows; }

extern "C" int colo_torch_skinny_linear(const at::Tensor* x, const at::Tensor* w,
                                        const at::Tensor* b, at::Tensor** out, char* err,
                                        size_t len) {
  return colo_shim::guarded(err, len, [&] {
    COLO_CHECK(colo_torch_skinny_linear_supported(), "this CPU has no AVX512-BF16");
    COLO_CHECK(x->device().is_cpu() && w->device().is_cpu() && (!b || b->device().is_cpu()),
               "CPU tensors only");
    COLO_CHECK(x->scalar_type() == at::kBFloat16 && w->scalar_type() == at::kBFloat16 &&
                   (!b || b->scalar_type() == at::kBFloat16),
               "x, w and b must be bfloat16, got ", x->scalar_type(), " and ", w->scalar_type());
    COLO_CHECK(w->dim() == 2 && w->is_contiguous() && x->dim() >= 1 && x->size(-1) == w->size(1),
               "w must be a contiguous (out, in) matrix and x (..., in), got x ", x->sizes(),
               " and w ", w->sizes());
    const int64_t n = w->size(0), k = w->size(1);
    COLO_CHECK(!b || (b->dim() == 1 && b->size(0) == n), "b must be (", n, "), got ", b->sizes());
    const int64_t rows = k > 0 ? x->numel() / k : 0;
    COLO_CHECK(rows <= kMaxRows, "x has ", rows, " rows, more than the kernel's ", kMaxRows);
    COLO_CHECK(!x->requires_grad() && !w->requires_grad() && (!b || !b->requires_grad()),
               "no tensor may require a gradient (the kernel records no graph)");
    at::Tensor xc = x->contiguous();
    at::Tensor bc = b ? b->contiguous() : at::Tensor();
    auto shape = x->sizes().vec();
    shape.back() = n;
    at::Tensor y = at::empty(shape, x->options());
    if (y.numel() > 0) {
      if (k == 0)
        y.copy_(b ? bc.expand(shape) : at::zeros(shape, x->options()));
      else
        run(reinterpret_cast<const uint16_t*>(xc.data_ptr()), rows,
            reinterpret_cast<const uint16_t*>(w->data_ptr()),
            b ? reinterpret_cast<const uint16_t*>(bc.data_ptr()) : nullptr, n, k,
            reinterpret_cast<uint16_t*>(y.data_ptr()));
    }
    *out = new at::Tensor(y);
  });
}
