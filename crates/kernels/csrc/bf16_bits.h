// bfloat16 <-> float32 on raw bits for colo's CPU kernels (`rms_norm.cpp`,
// `token_logprobs.cpp`, `rope.cpp`, `paged_attention.cpp`,
// `skinny_linear.cpp`, `grad_sum.cpp`), which hold bfloat16 as uint16_t and float32 as float: rounding to nearest even, NaN kept a (quiet) NaN, as
// c10::BFloat16 does. Branch-free and with __builtin_bit_cast rather than
// memcpy, so that loops around them vectorise (GCC does not vectorise a
// loop with a memcpy into a local).
#pragma once

#include <cstdint>

namespace colo_shim {

inline float widen(float v) { return v; }
inline float widen(uint16_t b) {
  return __builtin_bit_cast(float, static_cast<uint32_t>(b) << 16);
}
inline void narrow(float v, float* out) { *out = v; }
inline void narrow(float v, uint16_t* out) {
  uint32_t u = __builtin_bit_cast(uint32_t, v);
  uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  bool nan = (u & 0x7FFFFFFFu) > 0x7F800000u;  // compared as integers: vectorises
  *out = static_cast<uint16_t>(nan ? 0x7FC0u : rounded);
}

// The value after a round trip through the storage kind S (uint16_t:
// bfloat16; float: itself), where libtorch rounds an op's output.
template <typename S>
inline float rounded(float v) {
  S s;
  narrow(v, &s);
  return widen(s);
}

}  // namespace colo_shim
