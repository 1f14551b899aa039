// Float32 helpers for colo's CPU kernels (`token_logprobs.cpp`,
// `rope.cpp`, `paged_attention.cpp`): an exponential GCC vectorises, and
// the conversions of a run of bfloat16 (or float32) values to and from a
// float32 buffer. A kernel works through its rows in float32 blocks so
// that each loop is either a conversion or float32-only arithmetic, which
// GCC vectorises for AVX-512 and AVX2 alike (a loop mixing bfloat16 loads
// or stores with the exponential it does not).
#pragma once

#include "bf16_bits.h"

#include <cstdint>

namespace colo_shim {

// exp(x) for x ≤ 0 (the kernels' arguments: a logit minus its row's
// maximum or log-sum-exp), branch-free so that loops vectorise: Cephes'
// expf, 2^n · p(r) with |r| ≤ ln2/2, within ~1 ulp of expf; 0 below −87.
inline float exp_nonpositive(float x) {
  float xc = x < -87.0f ? -87.0f : x;
  // Round to nearest by the 1.5 · 2^23 trick (|xc · log2 e| < 126).
  float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = xc - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  float scale = __builtin_bit_cast(float, (static_cast<int32_t>(n) + 127) << 23);
  return x < -87.0f ? 0.0f : p * scale;
}

template <typename S>
__attribute__((always_inline)) inline void load(const S* src, float* dst, int64_t n) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) dst[j] = widen(src[j]);
}

template <typename S>
__attribute__((always_inline)) inline void store(const float* src, S* dst, int64_t n) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) narrow(src[j], &dst[j]);
}

}  // namespace colo_shim
