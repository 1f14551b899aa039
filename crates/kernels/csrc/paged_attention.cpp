// Decode attention over a paged KV cache on the CPU, for colo's rollout
// engine: each lane's queries attend to its keys, read in place from the
// cache's pages through a slot table. libtorch's way (what the engine ran
// before, and still runs on CUDA) gathers each lane's keys and values into
// a buffer, then runs two batched products, a mask and a softmax: six ops
// a layer, each a call into oneDNN or a TensorIterator for matrices of a
// few rows. Here it is one pass over the keys and one over the values.
//
// The arithmetic is the composite's, rounding where it rounds: scores
// q · k accumulated in float32 and rounded to the storage kind (the
// product's output), a float32 softmax, probabilities rounded to the
// storage kind, Σ p · v accumulated in float32 and rounded to it. With
// `with_lse` the output comes back as float32 (after that rounding) with
// each query's log-sum-exp of its scores, for merging partial attentions.
//
// Contract
// - `q` is (heads_kv · lanes, m, d), already scaled; `k_cache` and
//   `v_cache` are (heads_kv, slots, d), contiguous; all float32 or all
//   bfloat16 on the CPU. `slots` is (lanes · keys) int64 with lane l's
//   keys at [l · keys, l · keys + lens[l]); `lens` is (lanes) int64, each
//   in [1, keys]. Every slot is checked against the cache.
// - No gradient: the rollout engine never differentiates.
// - Results are new at::Tensors owned by the caller (freed by tch's
//   `at_free`). Errors come back as a nonzero status and a message.
#include "bf16_bits.h"
#include "shim_error.h"
#include "vec_math.h"
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <exception>
#include <limits>
#include <vector>

namespace {

using colo_shim::exp_nonpositive;
using colo_shim::load;
using colo_shim::narrow;
using colo_shim::rounded;
using colo_shim::store;
using colo_shim::widen;

constexpr int64_t kMaxHead = 1024;

struct Shape {
  int64_t kvh, lanes, m, d, keys;
};

#define COLO_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))

// One (KV head, lane): its m queries over its n keys. `scores` holds
// m × n floats, `acc` m × d.
template <typename S>
COLO_CLONES void attend_one(const S* q, const S* kc, const S* vc, const int64_t* slot, int64_t n,
                            Shape sh, float* scores, float* acc, float* out_f, S* out_s,
                            float* lse) {
  const int64_t m = sh.m, d = sh.d;
  float kb[kMaxHead];
  std::vector<float> qf(m * d);
  for (int64_t i = 0; i < m; ++i) load(q + i * d, qf.data() + i * d, d);
  for (int64_t j = 0; j < n; ++j) {
    load(kc + slot[j] * d, kb, d);
    for (int64_t i = 0; i < m; ++i) {
      const float* qi = qf.data() + i * d;
      float s = 0.f;
#pragma omp simd reduction(+ : s)
      for (int64_t t = 0; t < d; ++t) s += qi[t] * kb[t];
      scores[i * n + j] = rounded<S>(s);
    }
  }
  for (int64_t i = 0; i < m; ++i) {
    float* si = scores + i * n;
    float mx = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : mx)
    for (int64_t j = 0; j < n; ++j) mx = std::max(mx, si[j]);
    float sum = 0.f;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < n; ++j) {
      si[j] = exp_nonpositive(si[j] - mx);
      sum += si[j];
    }
    float inv = 1.f / sum;
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) si[j] = rounded<S>(si[j] * inv);
    if (lse != nullptr) lse[i] = mx + std::log(sum);
  }
  std::fill(acc, acc + m * d, 0.f);
  for (int64_t j = 0; j < n; ++j) {
    load(vc + slot[j] * d, kb, d);
    for (int64_t i = 0; i < m; ++i) {
      float p = scores[i * n + j];
      float* ai = acc + i * d;
#pragma omp simd
      for (int64_t t = 0; t < d; ++t) ai[t] += p * kb[t];
    }
  }
  for (int64_t i = 0; i < m * d; ++i) {
    if (out_f != nullptr)
      out_f[i] = rounded<S>(acc[i]);
    else
      narrow(acc[i], &out_s[i]);
  }
}

template <typename S>
void run(const at::Tensor& q, const at::Tensor& kc, const at::Tensor& vc, const int64_t* slots,
         const int64_t* lens, Shape sh, at::Tensor& out, float* lse) {
  const S* qp = reinterpret_cast<const S*>(q.data_ptr());
  const S* kp = reinterpret_cast<const S*>(kc.data_ptr());
  const S* vp = reinterpret_cast<const S*>(vc.data_ptr());
  const int64_t slots_per_head = kc.size(1);
  bool f32_out = out.scalar_type() == at::kFloat;
  at::parallel_for(0, sh.kvh * sh.lanes, 1, [&](int64_t b, int64_t e) {
    std::vector<float> scores(sh.m * sh.keys), acc(sh.m * sh.d);
    for (int64_t hl = b; hl < e; ++hl) {
      int64_t h = hl / sh.lanes, l = hl % sh.lanes;
      int64_t at_row = hl * sh.m * sh.d;
      attend_one<S>(qp + at_row, kp + h * slots_per_head * sh.d, vp + h * slots_per_head * sh.d,
                    slots + l * sh.keys, lens[l], sh, scores.data(), acc.data(),
                    f32_out ? out.data_ptr<float>() + at_row : nullptr,
                    f32_out ? nullptr : reinterpret_cast<S*>(out.data_ptr()) + at_row,
                    lse != nullptr ? lse + hl * sh.m : nullptr);
    }
  });
}

}  // namespace

extern "C" int colo_torch_paged_attention(const at::Tensor* q, const at::Tensor* k_cache,
                                          const at::Tensor* v_cache, const at::Tensor* slots,
                                          const at::Tensor* lens, int with_lse, at::Tensor** out,
                                          at::Tensor** lse, char* err, size_t len) {
  return colo_shim::guarded(err, len, [&] {
    COLO_CHECK(q->device().is_cpu() && k_cache->device().is_cpu() && v_cache->device().is_cpu(),
               "CPU tensors only");
    auto kind = q->scalar_type();
    COLO_CHECK((kind == at::kFloat || kind == at::kBFloat16) &&
                   k_cache->scalar_type() == kind && v_cache->scalar_type() == kind,
               "q and the caches all float32 or all bfloat16, got ", kind, ", ",
               k_cache->scalar_type(), " and ", v_cache->scalar_type());
    COLO_CHECK(k_cache->dim() == 3 && k_cache->sizes() == v_cache->sizes() &&
                   k_cache->is_contiguous() && v_cache->is_contiguous(),
               "the caches must be contiguous (kv_heads, slots, head_dim), got ",
               k_cache->sizes(), " and ", v_cache->sizes());
    COLO_CHECK(slots->scalar_type() == at::kLong && lens->scalar_type() == at::kLong &&
                   slots->dim() == 1 && lens->dim() == 1 && lens->numel() > 0 &&
                   slots->numel() % lens->numel() == 0,
               "slots (lanes · keys) and lens (lanes) must be int64, got ",
               slots->sizes(), " and ", lens->sizes());
    Shape sh{k_cache->size(0), lens->numel(), 0, k_cache->size(2), slots->numel() / lens->numel()};
    COLO_CHECK(q->dim() == 3 && q->size(0) == sh.kvh * sh.lanes && q->size(2) == sh.d &&
                   sh.d <= kMaxHead,
               "q ", q->sizes(), " must be (kv_heads · lanes, queries, ",
               sh.d, ") for ", sh.kvh, " KV heads and ", sh.lanes, " lanes");
    sh.m = q->size(1);
    at::Tensor sl = slots->contiguous(), ln = lens->contiguous();
    const int64_t *sp = sl.data_ptr<int64_t>(), *lp = ln.data_ptr<int64_t>();
    for (int64_t l = 0; l < sh.lanes; ++l) {
      COLO_CHECK(lp[l] >= 1 && lp[l] <= sh.keys, "lane ", l, " has ", lp[l],
                 " keys, outside [1, ", sh.keys, "]");
      for (int64_t j = 0; j < lp[l]; ++j) {
        int64_t s = sp[l * sh.keys + j];
        COLO_CHECK(s >= 0 && s < k_cache->size(1), "slot ", s, " of lane ", l,
                   " is outside the cache's ", k_cache->size(1), " slots");
      }
    }
    at::Tensor qc = q->contiguous();
    at::Tensor o = at::empty(qc.sizes(), qc.options().dtype(with_lse ? at::kFloat : kind));
    at::Tensor l;
    if (with_lse) l = at::empty({qc.size(0), sh.m, 1}, qc.options().dtype(at::kFloat));
    float* lse_p = with_lse ? l.data_ptr<float>() : nullptr;
    if (kind == at::kFloat)
      run<float>(qc, *k_cache, *v_cache, sp, lp, sh, o, lse_p);
    else
      run<uint16_t>(qc, *k_cache, *v_cache, sp, lp, sh, o, lse_p);
    *out = new at::Tensor(o);
    if (with_lse) *lse = new at::Tensor(l);
  });
}
