// ThreadCommunicators: a world of N ranks inside one process, one rank per thread — a test double
// for the multi-process communicators, so that code above comm/ (the ZeRO chunk manager, the
// model, the trainer) can be tested with several ranks in one test binary (and under the
// sanitizers), without mpirun. Test-only.
//
// Semantics are comm/communicator.h's (arguments validated by the same shared checks). Every
// collective is synchronous: a rank blocks in it until every rank has issued it, each rank then
// computes its result from all ranks' `send` buffers into a private buffer, all ranks wait until
// every rank has read, and each writes its `recv` (so in-place calls are safe). Reductions are
// deterministic and bit-identical on every rank: floating-point values are summed in f32 in rank
// order (16-bit types widened and rounded once at the end, as `mpi` does), kAvg divides the f32
// sum by the world size before rounding, integer sums wrap as two's complement.
//
// A rank that fails to arrive within `timeout` (another thread died or desynchronized) makes the
// others' collectives fail with DeadlineExceeded, and every later collective of the world fails
// at once (the world is broken), so tests end instead of hanging. Mismatched calls (different
// kinds or counts at the same position) are Internal errors on every rank.
//
// Thread safety: each Communicator of the world is used by one thread (its rank).
#ifndef PATRICKSTAR_COMM_TESTING_THREAD_COMMUNICATOR_H_
#define PATRICKSTAR_COMM_TESTING_THREAD_COMMUNICATOR_H_

#include <memory>
#include <vector>

#include "absl/time/time.h"
#include "comm/communicator.h"

namespace ps {

// The communicators of ranks 0 .. world_size - 1 of one new world. REQUIRES: world_size >= 1.
std::vector<std::unique_ptr<Communicator>> CreateThreadCommunicators(
    int world_size, absl::Duration timeout = absl::Seconds(120));

}  // namespace ps

#endif  // PATRICKSTAR_COMM_TESTING_THREAD_COMMUNICATOR_H_
