// Helpers shared by the CPU kernels of model/kernels: shape validation that names the offending
// dimension, and a deterministic parallel-for over a ThreadPool that may be absent.
//
// Determinism rule every kernel follows: the work is cut into tasks whose number and boundaries
// depend only on the problem size (never on the thread count), and every output element is
// written by exactly one task, which computes it in a fixed order. Results are therefore
// bit-identical whatever the number of threads, including none.
#ifndef PATRICKSTAR_MODEL_KERNELS_INTERNAL_KERNEL_UTIL_H_
#define PATRICKSTAR_MODEL_KERNELS_INTERNAL_KERNEL_UTIL_H_

#include <algorithm>
#include <cstdint>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "base/thread_pool.h"

namespace ps::kernels_internal {

// Runs fn(task) for every task in [0, num_tasks): on `pool` if given, else on the calling thread.
inline void ParallelFor(ThreadPool* pool, int64_t num_tasks, absl::FunctionRef<void(int64_t)> fn) {
  if (pool == nullptr) {
    for (int64_t task = 0; task < num_tasks; ++task) fn(task);
    return;
  }
  pool->ParallelFor(num_tasks, fn);
}

// Number of tasks of `grain` items each (the last may be shorter) covering `n` items.
inline int64_t NumTasks(int64_t n, int64_t grain) { return n <= 0 ? 0 : (n + grain - 1) / grain; }

// Runs fn(begin, end) over [0, n) in fixed ranges of `grain` elements (the last may be shorter).
// The split depends only on n and grain, so element-wise results never depend on the pool.
inline void ParallelForRanges(ThreadPool* pool, int64_t n, int64_t grain,
                              absl::FunctionRef<void(int64_t, int64_t)> fn) {
  ParallelFor(pool, NumTasks(n, grain), [&](int64_t task) {
    fn(task * grain, std::min(n, (task + 1) * grain));
  });
}

// Rows per task so that one task touches about `target_elems` elements of `row_elems` each.
inline int64_t RowsPerTask(int64_t row_elems, int64_t target_elems = 16384) {
  return std::max<int64_t>(1, target_elems / std::max<int64_t>(1, row_elems));
}

// InvalidArgument unless value > 0.
[[nodiscard]] inline absl::Status CheckPositive(absl::string_view kernel, absl::string_view name,
                                                int64_t value) {
  if (value > 0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(kernel, ": ", name, " must be positive, got ", value));
}

// InvalidArgument unless 0 < value <= INT32_MAX: a dimension handed to OpenBLAS, whose integers
// are 32-bit in the Debian build.
[[nodiscard]] inline absl::Status CheckBlasDim(absl::string_view kernel, absl::string_view name,
                                               int64_t value) {
  if (value > 0 && value <= INT32_MAX) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(kernel, ": ", name, " must be in [1, 2^31), got ", value));
}

// InvalidArgument unless the buffer `name` holds exactly `expected_elems` elements; `formula`
// says how the count is derived (e.g. "B*T*C").
template <typename E>
[[nodiscard]] absl::Status CheckElems(absl::string_view kernel, absl::string_view name,
                                      absl::Span<E> buffer, int64_t expected_elems,
                                      absl::string_view formula) {
  if (static_cast<int64_t>(buffer.size()) == expected_elems) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(kernel, ": ", name, " has ", buffer.size(),
                                                 " elements, expected ", expected_elems, " (",
                                                 formula, ")"));
}

// InvalidArgument unless the workspace holds at least `needed_elems` elements.
template <typename E>
[[nodiscard]] absl::Status CheckWorkspace(absl::string_view kernel, absl::Span<E> workspace,
                                          int64_t needed_elems) {
  if (static_cast<int64_t>(workspace.size()) >= needed_elems) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(kernel, ": workspace has ", workspace.size(),
                                                 " elements, needs ", needed_elems));
}

}  // namespace ps::kernels_internal

#endif  // PATRICKSTAR_MODEL_KERNELS_INTERNAL_KERNEL_UTIL_H_
