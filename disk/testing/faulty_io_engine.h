// FaultyIoEngine: an IoEngine (disk/io_engine.h) decorator that injects the faults a disk can
// produce, at random moments drawn from a seeded generator, for tests of the swap above it:
//  - a short transfer that is not an error (the OS may legally move fewer bytes; the caller must
//    continue with the rest): the request goes down with fewer bytes (a request of whole 4096-byte
//    blocks is cut at a block boundary: it may be on an O_DIRECT descriptor);
//  - a read that returns 0 bytes before the end (end of file: a short read error);
//  - EIO on a read or a write; ENOSPC on a write and on Allocate (fallocate);
//  - a completed read whose bytes are corrupted (one byte flipped) after the disk delivered them.
// Every injected fault is counted, so a test can check that each one ended in an error (or, for a
// legal short transfer, in correct bytes).
//
// Thread safety: as IoEngine.
#ifndef PATRICKSTAR_DISK_TESTING_FAULTY_IO_ENGINE_H_
#define PATRICKSTAR_DISK_TESTING_FAULTY_IO_ENGINE_H_

#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "base/mutex.h"
#include "disk/io_engine.h"

namespace ps {

struct FaultRates {
  // Probabilities per request (per Allocate call for allocate_enospc).
  double short_transfer = 0.0;
  double read_eof = 0.0;
  double eio = 0.0;
  double write_enospc = 0.0;
  double corrupt_read = 0.0;
  double allocate_enospc = 0.0;
};

struct FaultCounts {
  int64_t short_transfers = 0;
  int64_t read_eofs = 0;
  int64_t eios = 0;
  int64_t write_enospcs = 0;
  int64_t corrupt_reads = 0;
  int64_t allocate_enospcs = 0;
  // Faults that must end in an error of the I/O they hit (all but short transfers).
  int64_t errors() const { return read_eofs + eios + write_enospcs + corrupt_reads; }
};

class FaultyIoEngine final : public IoEngine {
 public:
  FaultyIoEngine(std::unique_ptr<IoEngine> inner, FaultRates rates, uint64_t seed);

  absl::Status Submit(absl::Span<const IoRequest> requests) override;
  absl::Status Reap(int min_completions, std::vector<IoCompletion>* out) override;
  int Allocate(int fd, int64_t offset, int64_t bytes) override;

  // Shared with the test, which keeps it after the swap took the engine. Read it when no I/O is in
  // flight (after the swap is destroyed, or between Waits).
  const std::shared_ptr<FaultCounts>& counts() const { return counts_; }

 private:
  std::unique_ptr<IoEngine> inner_;
  const FaultRates rates_;
  // Allocate() may come from another thread than Submit/Reap (IoEngine's contract).
  Mutex mu_;
  std::mt19937_64 rng_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<FaultCounts> counts_ = std::make_shared<FaultCounts>();
  // Completions made up here (EIO, ENOSPC, EOF), returned by the next Reap.
  std::vector<IoCompletion> synthesized_ ABSL_GUARDED_BY(mu_);
  // Reads passed down whose bytes are to be corrupted on completion: tag -> buffer.
  absl::flat_hash_map<uint64_t, uint8_t*> to_corrupt_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ps

#endif  // PATRICKSTAR_DISK_TESTING_FAULTY_IO_ENGINE_H_
