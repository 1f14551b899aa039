// How colo-kernels' C++ reports a failure to Rust (`shim::call` in
// `src/shim.rs`): a nonzero status, and the message copied, NUL-terminated,
// into the caller's buffer of `len` bytes. Nothing throws across the
// boundary. Status 2: the kernel refused its arguments (`COLO_CHECK`, the
// message names the shapes, kinds or indices); status 1: libtorch threw
// while the kernel ran (its message without libtorch's C++ backtrace).
//
// colo-mem has a file of the same name for its allocator and CUDA graph
// shims, which report only the plain failure: each crate keeps its own.
#pragma once

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <cstddef>
#include <cstring>
#include <exception>
#include <stdexcept>

namespace colo_shim {

constexpr int kFailed = 1;
constexpr int kRefused = 2;

// A kernel's own check of its arguments failed.
struct Refused : std::runtime_error {
  using std::runtime_error::runtime_error;
};

inline int fail(int status, const char* what, char* err, size_t len) {
  if (err != nullptr && len > 0) {
    std::strncpy(err, what, len - 1);
    err[len - 1] = '\0';
  }
  return status;
}

// Runs `f`, turning every exception it throws into a status and a message.
template <typename F>
int guarded(char* err, size_t len, F&& f) {
  try {
    f();
    return 0;
  } catch (const Refused& e) {
    return fail(kRefused, e.what(), err, len);
  } catch (const c10::Error& e) {
    return fail(kFailed, e.what_without_backtrace(), err, len);
  } catch (const std::exception& e) {
    return fail(kFailed, e.what(), err, len);
  } catch (...) {
    return fail(kFailed, "an unknown C++ exception", err, len);
  }
}

}  // namespace colo_shim

// Refuses the kernel's arguments unless `cond`, with the message made of
// the other arguments (`c10::str`: sizes and kinds print as libtorch
// prints them).
#define COLO_CHECK(cond, ...)                                       \
  do {                                                              \
    if (!(cond)) throw ::colo_shim::Refused(::c10::str(__VA_ARGS__)); \
  } while (0)
