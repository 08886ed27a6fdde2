// ThreadPool: a fixed set of worker threads that run the tasks of one ParallelFor at a time, with
// the calling thread taking part. Built for the CPU Adam kernels, whose work is a few large
// data-parallel loops per optimizer step: tasks are handed out dynamically (an atomic counter), so
// the assignment of tasks to threads varies from run to run — callers that need reproducible
// results make every task's output depend on the task index only, never on which thread ran it.
//
// Synchronization uses ps::Mutex (std::mutex underneath), which ThreadSanitizer understands.
//
// Thread safety: ParallelFor may be called from several threads; calls are serialized (a second
// caller waits for the first to finish). A task must not call ParallelFor on the same pool
// (it would deadlock).
#ifndef PATRICKSTAR_BASE_THREAD_POOL_H_
#define PATRICKSTAR_BASE_THREAD_POOL_H_

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "base/mutex.h"

namespace ps {

class ThreadPool {
 public:
  // A pool of `num_threads` threads in all: the caller of ParallelFor plus num_threads - 1
  // workers. REQUIRES: num_threads >= 1.
  explicit ThreadPool(int num_threads);
  // Joins the workers. REQUIRES: no ParallelFor in progress.
  ~ThreadPool();

  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Runs fn(task) for every task in [0, num_tasks), spread over the pool's threads, and returns
  // when all have finished. Each task runs exactly once. Tasks run concurrently: fn must be safe to
  // call from several threads at once. num_tasks <= 0 does nothing.
  void ParallelFor(int64_t num_tasks, absl::FunctionRef<void(int64_t)> fn);

 private:
  void WorkerLoop();
  // Claims and runs tasks of the current job until none is left.
  void RunTasks(absl::FunctionRef<void(int64_t)> fn, int64_t num_tasks);

  // Serializes ParallelFor callers.
  Mutex call_mu_;
  Mutex mu_;
  // Bumped once per ParallelFor that wakes the workers.
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  const absl::FunctionRef<void(int64_t)>* job_ ABSL_GUARDED_BY(mu_) = nullptr;
  int64_t job_tasks_ ABSL_GUARDED_BY(mu_) = 0;
  // Workers that have not yet finished the current generation.
  int busy_workers_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  // Next unclaimed task of the current job.
  std::atomic<int64_t> next_task_{0};
  std::vector<std::thread> workers_;
};

}  // namespace ps

#endif  // PATRICKSTAR_BASE_THREAD_POOL_H_
