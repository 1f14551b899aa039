// colo-mem's shim against libtorch's CUDA caching allocator (feature `cuda`):
// one MemPool per (pool, tag), each with a pluggable allocator whose segments
// come from colo-mem's CUDA virtual-memory backend — torch_memory_saver's
// mechanism.
//
// Contract
// - colo_cuda_region_begin(slot, tag, device) makes every CUDA allocation on
//   `device`, from any thread, come from the tag's MemPool until
//   colo_cuda_region_end. The routing is a process-wide decision (a filter
//   that accepts every stream), not a thread filter: the autograd engine's
//   device thread, which allocates the gradients, is caught as well.
// - The caching allocator asks for whole segments (2 MiB or more) through
//   colo_mem_cuda_segment_alloc (Rust, cuda_region.rs), which allocates them
//   in the pool under the tag; it still sub-allocates tensors inside them.
// - colo_cuda_empty_tag(slot, tag, device) returns the tag's cached free
//   segments to Rust (colo_mem_cuda_segment_free); the pool calls it before a
//   pause so that only live tensors' segments are paused. The caching
//   allocator releases a pool's cached blocks only once nothing holds the
//   pool (it must be "freeable": the MemPool object is a holder), so with no
//   region open on the tag the MemPool is destroyed (releasePool) and the
//   cache emptied with the default id, which releases the cached blocks of
//   every freeable pool — this one, and earlier ones of any tag whose last
//   tensors have been freed since (a pool is erased once it holds nothing)
//   — and of the default pool, as torch.cuda.empty_cache() does. No ids are
//   kept. The next region makes a fresh MemPool.
// - Errors are returned as nonzero with a message in `err`; nothing throws
//   into Rust.
#include "shim_error.h"
#include <ATen/Context.h>
#include <ATen/cuda/MemPool.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

extern "C" {
void* colo_mem_cuda_segment_alloc(uint32_t slot, uint32_t tag, size_t bytes);
void colo_mem_cuda_segment_free(void* ptr);
}

namespace {

struct TagPool {
  std::shared_ptr<c10::cuda::CUDACachingAllocator::CUDAAllocator> allocator;
  std::unique_ptr<at::cuda::MemPool> pool;
  // Regions open on the tag (begin without end).
  int open = 0;
};

std::mutex g_mu;
// Leaked on purpose, as PyTorch does with its own statics: destroying the
// MemPools at exit would call into the caching allocator (and back into
// Rust) after the CUDA runtime has been torn down.
auto& g_pools = *new std::map<std::pair<uint32_t, uint32_t>, TagPool>();

using colo_shim::fail;

// The tag's MemPool (made if there is none) with `open` added to its count
// of open regions, in one step under the lock, so that an empty on another
// thread never destroys a pool a region is about to use.
TagPool& tag_pool(uint32_t slot, uint32_t tag, int device, int open) {
  // The caching allocator is set up on libtorch's first CUDA tensor; a
  // MemPool made before that fails ("did you call init?").
  at::globalContext().lazyInitDevice(c10::DeviceType::CUDA);
  std::lock_guard<std::mutex> lock(g_mu);
  TagPool& tp = g_pools[{slot, tag}];
  tp.open += open;
  if (!tp.pool) {
    tp.allocator = torch::cuda::CUDAPluggableAllocator::createCustomAllocator(
        [slot, tag](size_t bytes, int, cudaStream_t) {
          // A segment may be needed while a CUDA graph is being captured
          // (cuda_graph.cpp); mapping memory is not a stream operation, and
          // relaxed mode lets the driver calls through, as libtorch's own
          // cudaMalloc during a capture does.
          c10::cuda::CUDAStreamCaptureModeGuard relaxed(cudaStreamCaptureModeRelaxed);
          return colo_mem_cuda_segment_alloc(slot, tag, bytes);
        },
        [](void* ptr, size_t, int, cudaStream_t) { colo_mem_cuda_segment_free(ptr); });
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
    tp.pool = std::make_unique<at::cuda::MemPool>(tp.allocator, /*is_user_created=*/true,
                                                  /*use_on_oom=*/false, /*no_split=*/false);
  }
  return tp;
}

}  // namespace

extern "C" {

int colo_cuda_region_begin(uint32_t slot, uint32_t tag, int device, char* err, size_t len) {
  try {
    TagPool& tp = tag_pool(slot, tag, device, 1);
    try {
      c10::cuda::CUDACachingAllocator::beginAllocateToPool(
          static_cast<c10::DeviceIndex>(device), tp.pool->id(), [](cudaStream_t) { return true; });
    } catch (...) {
      std::lock_guard<std::mutex> lock(g_mu);
      tp.open -= 1;
      throw;
    }
    return 0;
  } catch (const std::exception& e) {
    return fail(e.what(), err, len);
  }
}

int colo_cuda_region_end(uint32_t slot, uint32_t tag, int device, char* err, size_t len) {
  try {
    TagPool& tp = tag_pool(slot, tag, device, 0);
    auto id = tp.pool->id();
    auto dev = static_cast<c10::DeviceIndex>(device);
    // begin took a reference on the pool; end + release give it back, as
    // torch.cuda.use_mem_pool does.
    c10::cuda::CUDACachingAllocator::endAllocateToPool(dev, id);
    c10::cuda::CUDACachingAllocator::releasePool(dev, id);
    std::lock_guard<std::mutex> lock(g_mu);
    tp.open -= 1;
    return 0;
  } catch (const std::exception& e) {
    return fail(e.what(), err, len);
  }
}

int colo_cuda_empty_tag(uint32_t slot, uint32_t tag, int device, char* err, size_t len) {
  try {
    std::unique_ptr<at::cuda::MemPool> dying;
    {
      std::lock_guard<std::mutex> lock(g_mu);
      auto it = g_pools.find({slot, tag});
      if (it == g_pools.end()) return 0;
      TagPool& tp = it->second;
      if (tp.open > 0) return 0;  // in use: nothing can go
      dying = std::move(tp.pool);  // null when an earlier empty destroyed it
    }
    // Outside the lock: the frees call back into Rust.
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
    dying.reset();  // releasePool: the pool becomes freeable
    c10::cuda::CUDACachingAllocator::emptyCache();
    return 0;
  } catch (const std::exception& e) {
    return fail(e.what(), err, len);
  }
}

// Bytes the caching allocator holds in tensors on `device` (all pools): the
// device's tensor memory; colo subtracts its own tags to show the untagged.
int colo_cuda_allocated_bytes(int device, int64_t* bytes, char* err, size_t len) {
  try {
    auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(
        static_cast<c10::DeviceIndex>(device));
    *bytes = stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)]
                 .current;
    return 0;
  } catch (const std::exception& e) {
    return fail(e.what(), err, len);
  }
}

}  // extern "C"
