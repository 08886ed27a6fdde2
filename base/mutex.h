// ps::Mutex: a mutex with Abseil's thread-safety annotations and an absl::Mutex-like Await, built
// on std::mutex and std::condition_variable.
//
// Why not absl::Mutex: Debian's Abseil is a shared library built without ThreadSanitizer, so the
// happens-before edges of absl::Mutex are invisible to TSan and every structure guarded by one
// reports false data races under --config=tsan. std::mutex goes through pthread, which TSan
// intercepts. The interface mirrors the subset of absl::Mutex this project uses, so
// ABSL_GUARDED_BY and friends keep documenting (and, under clang, checking) the locking.
//
// Await(cond): releases the lock until `cond()` holds, re-evaluating it whenever another thread
// releases the mutex (every Unlock notifies waiters, as absl::Mutex re-checks conditions on
// release). Cheap when nobody waits.
#ifndef PATRICKSTAR_BASE_MUTEX_H_
#define PATRICKSTAR_BASE_MUTEX_H_

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"

namespace ps {

class ABSL_LOCKABLE Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  // Notifies before releasing: once the lock is free, a woken waiter may destroy the object
  // holding this mutex, so nothing here may touch it after mu_.unlock().
  void Unlock() ABSL_UNLOCK_FUNCTION() {
    cv_.notify_all();
    mu_.unlock();
  }
  bool TryLock() ABSL_EXCLUSIVE_TRYLOCK_FUNCTION(true) { return mu_.try_lock(); }
  void AssertHeld() const ABSL_ASSERT_EXCLUSIVE_LOCK() {}

  // REQUIRES: the calling thread holds this mutex. Returns with it held and cond() true.
  template <typename Cond>
  void Await(Cond cond) ABSL_EXCLUSIVE_LOCKS_REQUIRED(this) {
    std::unique_lock<std::mutex> lock(mu_, std::adopt_lock);
    cv_.wait(lock, cond);
    lock.release();
  }

  // Like Await, but gives up after `timeout`; returns cond()'s final value.
  template <typename Cond>
  bool AwaitWithTimeout(Cond cond, absl::Duration timeout) ABSL_EXCLUSIVE_LOCKS_REQUIRED(this) {
    std::unique_lock<std::mutex> lock(mu_, std::adopt_lock);
    const bool ok = cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout), cond);
    lock.release();
    return ok;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
};

// RAII lock for ps::Mutex: `MutexLock lock(&mu_);`.
class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

}  // namespace ps

#endif  // PATRICKSTAR_BASE_MUTEX_H_
