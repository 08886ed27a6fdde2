#include "base/thread_pool.h"

#include <cstdint>
#include <thread>

#include "absl/functional/function_ref.h"
#include "base/mutex.h"
#include "glog/logging.h"

namespace ps {

ThreadPool::ThreadPool(int num_threads) {
  CHECK_GE(num_threads, 1) << "ThreadPool needs at least one thread";
  workers_.reserve(num_threads - 1);
  for (int i = 1; i < num_threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  for (std::thread& worker : workers_) worker.join();
}

void ThreadPool::RunTasks(absl::FunctionRef<void(int64_t)> fn, int64_t num_tasks) {
  for (int64_t task = next_task_.fetch_add(1, std::memory_order_relaxed); task < num_tasks;
       task = next_task_.fetch_add(1, std::memory_order_relaxed)) {
    fn(task);
  }
}

void ThreadPool::WorkerLoop() {
  int64_t seen_generation = 0;
  while (true) {
    const absl::FunctionRef<void(int64_t)>* job;
    int64_t num_tasks;
    {
      MutexLock lock(&mu_);
      mu_.Await([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || generation_ != seen_generation;
      });
      if (stop_) return;
      seen_generation = generation_;
      job = job_;
      num_tasks = job_tasks_;
    }
    RunTasks(*job, num_tasks);
    MutexLock lock(&mu_);
    --busy_workers_;
  }
}

void ThreadPool::ParallelFor(int64_t num_tasks, absl::FunctionRef<void(int64_t)> fn) {
  if (num_tasks <= 0) return;
  if (workers_.empty() || num_tasks == 1) {
    for (int64_t task = 0; task < num_tasks; ++task) fn(task);
    return;
  }
  MutexLock call_lock(&call_mu_);
  {
    MutexLock lock(&mu_);
    next_task_.store(0, std::memory_order_relaxed);
    job_ = &fn;
    job_tasks_ = num_tasks;
    busy_workers_ = static_cast<int>(workers_.size());
    ++generation_;
  }
  RunTasks(fn, num_tasks);
  MutexLock lock(&mu_);
  mu_.Await([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return busy_workers_ == 0; });
  job_ = nullptr;
}

}  // namespace ps
