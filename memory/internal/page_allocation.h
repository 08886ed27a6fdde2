// Large host allocations mapped straight from the OS (mmap) and returned to it on free (munmap),
// for the memory that backs the emulated accelerator and the chunk pools. Internal to memory/.
//
// Why not aligned_alloc. glibc's malloc raises its mmap threshold to the size of the largest
// mapped block freed (up to 32 MiB), and from then on serves blocks of that size from its heap,
// whose freed pages stay resident: measured with gpt2 f32 at a 36 MiB accelerator cap, the heap
// held 147 MiB at the peak while the emulated accelerator never had more than 36 MiB allocated.
// A block mapped here holds exactly the pages that were written (an untouched page costs no
// memory: a chunk's padding tail that is never written is never resident), and its pages go back
// to the OS when it is freed, so the process's resident set is what the memory plan predicts.
//
// Requests below kPageAllocationMinBytes (small test allocations) use aligned_alloc: a mapping
// each would waste a page apiece and a system call. Under AddressSanitizer every request does, so
// that overruns hit a redzone.
//
// Thread safety: thread-safe (the OS's).
#ifndef PATRICKSTAR_MEMORY_INTERNAL_PAGE_ALLOCATION_H_
#define PATRICKSTAR_MEMORY_INTERNAL_PAGE_ALLOCATION_H_

#include <cstdint>

namespace ps::memory_internal {

inline constexpr int64_t kPageAllocationMinBytes = 64 * 1024;

// `bytes` (> 0) aligned to kAllocationAlignment (memory/memory_resource.h); nullptr when the OS
// (or the heap) has no memory left. Mapped memory reads as zeros until written; heap memory holds
// whatever it held.
void* AllocatePages(int64_t bytes);

// Frees what AllocatePages(bytes) returned; `bytes` must be the same value.
void FreePages(void* ptr, int64_t bytes);

// Whether a block of `bytes` is mapped pages that may be split and resized: AllocatePages maps it
// (not under AddressSanitizer, not below kPageAllocationMinBytes) and it is whole pages. For such
// blocks, any page-aligned piece [ptr + a, ptr + a + n) with PagesResizable(n) is itself a block
// that FreePages(ptr + a, n) and ResizePages accept.
bool PagesResizable(int64_t bytes);

// Resizes a block for which PagesResizable(old_bytes) and PagesResizable(new_bytes) hold (mremap,
// possibly moving it): the first min(old, new) bytes keep their contents and their resident pages
// (no faults), a grown tail reads as zeros. Returns the block's new address, or nullptr with the
// block untouched when the OS refuses.
void* ResizePages(void* ptr, int64_t old_bytes, int64_t new_bytes);

}  // namespace ps::memory_internal

#endif  // PATRICKSTAR_MEMORY_INTERNAL_PAGE_ALLOCATION_H_
