// CUDA graphs for colo (feature `cuda`): libtorch's at::cuda::CUDAGraph
// behind a C interface, and the side stream graphs are captured on.
//
// Contract
// - colo_cuda_side_stream(device, 1) makes the device's side stream (one per
//   device, made once) the calling thread's current stream, after it waits
//   for everything queued on the stream that was current;
//   colo_cuda_side_stream(device, 0) switches back and makes that stream
//   wait for the side stream. Enter and exit nest as a stack per thread. CUDA
//   graphs cannot be captured on the default stream, and the caching
//   allocator reuses a freed block only on the stream it was made on, so the
//   warm-up before a capture and the capture itself run on this one stream:
//   the capture then finds the warm-up's blocks in the cache and needs no
//   new segment.
// - colo_cuda_graph_begin/end capture the work the thread queues between
//   them (on the side stream, entered) into a graph; colo_cuda_graph_replay
//   launches it on the current stream. Capture is thread-local
//   (cudaStreamCaptureModeThreadLocal): other threads may use CUDA
//   meanwhile.
// - Memory allocated during a capture comes from whatever pool the caching
//   allocator picks first: inside a colo region, the region's tag (a region
//   opened before the capture precedes the graph's own private pool in the
//   allocator's list), which is how colo pauses a graph's memory with its
//   tag, as torch_memory_saver's "cuda_graph" tag does for SGLang.
// - Errors are returned as nonzero with a message in `err`; nothing throws
//   into Rust.
#include "shim_error.h"
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

namespace {

using colo_shim::fail;

std::mutex g_mu;
// Leaked on purpose, like libtorch's own stream pools.
auto& g_side = *new std::map<c10::DeviceIndex, c10::cuda::CUDAStream>();

c10::cuda::CUDAStream side_stream(c10::DeviceIndex device) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_side.find(device);
  if (it == g_side.end()) {
    it = g_side.emplace(device, c10::cuda::getStreamFromPool(false, device)).first;
  }
  return it->second;
}

// The streams that were current before each enter, innermost last.
thread_local std::vector<c10::cuda::CUDAStream> t_entered;

// `waiter` waits for the work queued on `done` so far. (ATen's CUDAEvent
// would pull in cuda_fp16.h, whose CCCL headers the wheels lack.)
void wait_for(const c10::cuda::CUDAStream& done, const c10::cuda::CUDAStream& waiter) {
  cudaEvent_t ev;
  C10_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  C10_CUDA_CHECK(cudaEventRecord(ev, done.stream()));
  C10_CUDA_CHECK(cudaStreamWaitEvent(waiter.stream(), ev, 0));
  // Destroying a recorded event is allowed; the wait stays queued.
  C10_CUDA_CHECK(cudaEventDestroy(ev));
}

// Runs `f` on the graph; 0, or 1 with libtorch's message in `err`.
template <class F>
int on_graph(void* graph, char* err, size_t len, F f) {
  try {
    f(*static_cast<at::cuda::CUDAGraph*>(graph));
    return 0;
  } catch (const std::exception& e) {
    return fail(e.what(), err, len);
  }
}

}  // namespace

extern "C" {

int colo_cuda_side_stream(int device, int enter, char* err, size_t len) {
  try {
    auto dev = static_cast<c10::DeviceIndex>(device);
    if (enter != 0) {
      auto prev = c10::cuda::getCurrentCUDAStream(dev);
      auto side = side_stream(dev);
      wait_for(prev, side);
      t_entered.push_back(prev);
      c10::cuda::setCurrentCUDAStream(side);
    } else {
      if (t_entered.empty()) return fail("side stream exited without an enter", err, len);
      auto prev = t_entered.back();
      t_entered.pop_back();
      wait_for(c10::cuda::getCurrentCUDAStream(dev), prev);
      c10::cuda::setCurrentCUDAStream(prev);
    }
    return 0;
  } catch (const std::exception& e) {
    return fail(e.what(), err, len);
  }
}

void* colo_cuda_graph_new(char* err, size_t len) {
  try {
    return new at::cuda::CUDAGraph();
  } catch (const std::exception& e) {
    fail(e.what(), err, len);
    return nullptr;
  }
}

void colo_cuda_graph_free(void* graph) { delete static_cast<at::cuda::CUDAGraph*>(graph); }

int colo_cuda_graph_begin(void* graph, char* err, size_t len) {
  return on_graph(graph, err, len, [](at::cuda::CUDAGraph& g) {
    g.capture_begin({0, 0}, cudaStreamCaptureModeThreadLocal);
  });
}

int colo_cuda_graph_end(void* graph, char* err, size_t len) {
  return on_graph(graph, err, len, [](at::cuda::CUDAGraph& g) { g.capture_end(); });
}

int colo_cuda_graph_replay(void* graph, char* err, size_t len) {
  return on_graph(graph, err, len, [](at::cuda::CUDAGraph& g) { g.replay(); });
}

}  // extern "C"
