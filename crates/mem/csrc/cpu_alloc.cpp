// colo-mem's shim against libtorch: one c10 CPU allocator.
//
// Contract
// - colo_torch_install() makes this allocator libtorch's CPU allocator. It is
//   called once, before the first tensor where possible (a static constructor
//   of this file runs it when the binary loads), and never undone: oneDNN frees
//   `raw_allocate`d memory through the *current* allocator's raw_deleter, so an
//   allocator that was ever current must stay current.
// - Every allocation first asks Rust (colo_mem_region_alloc, region.rs) for a
//   block of the region active on the calling thread; Rust returns null when
//   none applies and the block comes from c10::alloc_cpu, libtorch's default.
// - One deleter for both: Rust frees a block whose address lies in one of its
//   pools (colo_mem_region_free returns true); anything else goes to
//   c10::free_cpu. So memory is always returned to where it came from, even
//   for tensors made before the install.
// - Blocks from c10::alloc_cpu are counted (live and peak bytes, by
//   malloc_usable_size) as "untagged" device memory for colo's accounting.
// - Nothing here throws into Rust or calls back into libtorch.
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <malloc.h>

#include <atomic>
#include <cstdint>

extern "C" {
void* colo_mem_region_alloc(size_t bytes);
bool colo_mem_region_free(void* ptr);
}

namespace {

std::atomic<int64_t> g_untagged_live{0};
std::atomic<int64_t> g_untagged_peak{0};
std::atomic<uint64_t> g_untagged_allocs{0};

void note_untagged(int64_t delta) {
  int64_t now = g_untagged_live.fetch_add(delta, std::memory_order_relaxed) + delta;
  int64_t peak = g_untagged_peak.load(std::memory_order_relaxed);
  while (now > peak &&
         !g_untagged_peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}

void colo_delete(void* ptr) {
  if (ptr == nullptr || colo_mem_region_free(ptr)) return;
  note_untagged(-static_cast<int64_t>(malloc_usable_size(ptr)));
  c10::free_cpu(ptr);
}

struct ColoCpuAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t bytes) override {
    const c10::Device cpu(c10::DeviceType::CPU);
    if (bytes > 0) {
      if (void* p = colo_mem_region_alloc(bytes)) return {p, p, &colo_delete, cpu};
    }
    void* p = c10::alloc_cpu(bytes);
    if (p != nullptr) {
      note_untagged(static_cast<int64_t>(malloc_usable_size(p)));
      g_untagged_allocs.fetch_add(1, std::memory_order_relaxed);
    }
    return {p, p, &colo_delete, cpu};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &colo_delete; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

ColoCpuAllocator g_alloc;

}  // namespace

extern "C" {

// True when this allocator is libtorch's CPU allocator after the call.
// c10 keeps the allocator of the highest priority; the default is registered
// at priority 0 and an equal priority replaces it.
bool colo_torch_install() {
  if (c10::GetCPUAllocator() != &g_alloc) c10::SetCPUAllocator(&g_alloc, 0);
  return c10::GetCPUAllocator() == &g_alloc;
}

void colo_torch_untagged(int64_t* live, int64_t* peak, uint64_t* allocs) {
  *live = g_untagged_live.load(std::memory_order_relaxed);
  *peak = g_untagged_peak.load(std::memory_order_relaxed);
  *allocs = g_untagged_allocs.load(std::memory_order_relaxed);
}

void colo_torch_reset_untagged_peak() {
  g_untagged_peak.store(g_untagged_live.load(std::memory_order_relaxed),
                        std::memory_order_relaxed);
}

}  // extern "C"

namespace {
// Installed when the binary loads, before main and so before any tensor of
// colo's (libtorch's own static initialisers ran earlier, as it is a
// dependency, and make no tensors).
[[maybe_unused]] const bool g_installed_at_load = colo_torch_install();
}  // namespace
