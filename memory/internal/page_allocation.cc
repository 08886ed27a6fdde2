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

// No madvise(MADV_HUGEPAGE) on the chunk blocks, measured once (issue #38, 2026-12-08) on the
// AMD EPYC Zen 3 2-core VM (transparent_hugepage "madvise"), gpt2-large bf16 at a 200 MiB cap, 1
// step, the same binary with the advice on mappings of 16 MiB and up and with THP disabled for
// the process (prctl PR_SET_THP_DISABLE): 2.76M minor faults and 14.2 s of system time with
// 4 KiB pages, 0.49M faults but 24.4 s with huge pages. A 2 MiB page the guest touches for the
// first time is backed by the hypervisor then (a 1 GiB loop: 0.6-1.3 GiB/s the first time,
// 10-11 GiB/s once backed, 4 KiB pages 1.4-1.7 GiB/s every time; benchmarks/init_benchmark
// prints these modes), and chunk memory is mostly touched once. Where THP is "always" the
// kernel uses huge pages anyway.

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
  return p == MAP_FAILED ? nullptr : p;
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
  return p == MAP_FAILED ? nullptr : p;
}

}  // namespace ps::memory_internal
