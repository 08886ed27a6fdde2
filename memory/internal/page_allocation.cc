#include "memory/internal/page_allocation.h"

#ifndef _GNU_SOURCE
#define _GNU_SOURCE  // mremap
#endif
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>

#include "base/sanitizers.h"
#include "glog/logging.h"
#include "memory/memory_resource.h"

namespace ps::memory_internal {
namespace {

// Under AddressSanitizer every allocation comes from the heap, whose blocks ASan surrounds with
// redzones: an overrun of a chunk block or a device allocation is reported, not silently written
// into the next mapping.
constexpr bool kMapPages = !kAsan;

bool Mapped(int64_t bytes) { return kMapPages && bytes >= kPageAllocationMinBytes; }

int64_t PageBytes() {
  static const int64_t page = sysconf(_SC_PAGESIZE) > 0 ? sysconf(_SC_PAGESIZE) : 4096;
  return page;
}

// Chunk blocks are written whole (the initialization, a load, a copy from the accelerator), so
// their first touch faults every page: with 4 KiB pages that is 262144 faults per GiB (the 1B
// bf16 run at a 200 MiB cap spent 20.7 s of system time, 5.0M minor faults, mostly before its
// first step). Transparent huge pages fault 2 MiB at once. Measured on the 2-core AMD EPYC Zen 3
// VM (a shared, loaded machine; /tmp/touch-style loop, 1 GiB, one thread): 4 KiB pages 1.4-1.7
// GiB/s every time; huge pages 0.6-1.3 GiB/s the first time the guest's memory is touched (the
// hypervisor backs it then) and 10-11 GiB/s once it has been (benchmarks/init_benchmark prints
// the modes). The advice matters where /sys/kernel/mm/transparent_hugepage/enabled is "madvise"
// (the default here); under "always" the kernel does it anyway and under "never" it is ignored.
// Only blocks of kHugePageAdviceMinBytes and up are advised, where the at most two partly
// written 2 MiB pages at a block's ends stay a small share of it (an untouched page still costs
// nothing).
constexpr int64_t kHugePageAdviceMinBytes = 16 << 20;

void AdviseHugePages(void* p, int64_t bytes) {
#ifdef MADV_HUGEPAGE
  if (bytes < kHugePageAdviceMinBytes) return;
  // Advice only: a kernel without THP refuses it (EINVAL), and the block works as before.
  (void)madvise(p, static_cast<size_t>(bytes), MADV_HUGEPAGE);
#else
  (void)p;
  (void)bytes;
#endif
}

}  // namespace

static_assert(kAllocationAlignment <= 4096, "a mapping is only page-aligned");

void* AllocatePages(int64_t bytes) {
  if (!Mapped(bytes)) {
    const int64_t rounded =
        (bytes + kAllocationAlignment - 1) / kAllocationAlignment * kAllocationAlignment;
    return std::aligned_alloc(kAllocationAlignment, static_cast<size_t>(rounded));
  }
  void* p = mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  AdviseHugePages(p, bytes);
  return p;
}

void FreePages(void* ptr, int64_t bytes) {
  if (ptr == nullptr) return;
  if (!Mapped(bytes)) {
    std::free(ptr);
    return;
  }
  // munmap fails only for an address range that was never mapped: a caller's bug.
  PCHECK(munmap(ptr, static_cast<size_t>(bytes)) == 0)
      << "munmap of " << bytes << " bytes at " << ptr;
}

bool PagesResizable(int64_t bytes) { return Mapped(bytes) && bytes % PageBytes() == 0; }

void* ResizePages(void* ptr, int64_t old_bytes, int64_t new_bytes) {
  if (ptr == nullptr || !PagesResizable(old_bytes) || !PagesResizable(new_bytes)) return nullptr;
  void* p =
      mremap(ptr, static_cast<size_t>(old_bytes), static_cast<size_t>(new_bytes), MREMAP_MAYMOVE);
  if (p == MAP_FAILED) return nullptr;
  AdviseHugePages(p, new_bytes);
  return p;
}

}  // namespace ps::memory_internal
