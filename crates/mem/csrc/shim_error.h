// How colo-mem's C++ shim reports a failure to Rust (`torch::shim_call`):
// a nonzero status, and the message copied, NUL-terminated, into the
// caller's buffer of `len` bytes. Nothing throws across the boundary.
#pragma once

#include <cstddef>
#include <cstring>

namespace colo_shim {

inline int fail(const char* what, char* err, size_t len) {
  if (err != nullptr && len > 0) {
    std::strncpy(err, what, len - 1);
    err[len - 1] = '\0';
  }
  return 1;
}

}  // namespace colo_shim
