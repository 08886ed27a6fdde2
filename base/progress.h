// ProgressFn: how a long phase (seeded initialization, loading or quantizing a checkpoint,
// writing an export) reports how far it is, to whoever shows it (the trainer's console: a
// progress line on a terminal, plain lines in a log). The code doing the work knows the units and
// the total; the caller knows the terminal. Kept to a plain callback so that model/ and memory/
// report progress without depending on trainer/.
//
// Contract for the reporting side: call it with (done, total) in one unit per phase (bytes or
// elements, said where the phase is documented), total > 0 and fixed for the phase, done
// nondecreasing and <= total, the last call with done == total; from one thread at a time (the
// thread that drives the phase, or under the reporter's own lock), never re-entrantly. Calls may
// be frequent (once per chunk or per tensor): the showing side rate-limits its output. An empty
// ProgressFn means nobody is watching; reporting to it costs one branch.
//
// Thread safety: the callback itself need not be thread-safe (see the contract).
#ifndef PATRICKSTAR_BASE_PROGRESS_H_
#define PATRICKSTAR_BASE_PROGRESS_H_

#include <cstdint>
#include <functional>

namespace ps {

using ProgressFn = std::function<void(int64_t done, int64_t total)>;

// Reports (done, total) to `progress` if it is set.
inline void ReportProgress(const ProgressFn& progress, int64_t done, int64_t total) {
  if (progress) progress(done, total);
}

}  // namespace ps

#endif  // PATRICKSTAR_BASE_PROGRESS_H_
