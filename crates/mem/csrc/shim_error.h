// How colo-mem's CUDA shims (`cuda_alloc.cpp`, `cuda_graph.cpp`) report a
// failure to Rust (`cuda_region::shim_call`): a nonzero status, and the
// message copied, NUL-terminated, into the caller's buffer of `len` bytes.
// Nothing throws across the boundary. colo-kernels has a file of the same
// name that also tells refused arguments apart: each crate keeps its own.
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
