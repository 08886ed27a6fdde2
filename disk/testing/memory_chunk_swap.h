// MemoryChunkSwap: a ChunkSwap (disk/chunk_swap.h) in host memory, for tests of the code above the
// disk tier. Each I/O is carried out late — when Poll() or Wait() first sees it — so a caller that
// frees or rewrites a buffer before the I/O completed reads or writes freed memory (the
// sanitizers see it) or stores the wrong bytes (the bit-identity tests see it), as with a real
// disk. Reads are checked against the bytes written, like the file-backed swap's CRC-32C.
//
// Thread safety: thread-compatible.
#ifndef PATRICKSTAR_DISK_TESTING_MEMORY_CHUNK_SWAP_H_
#define PATRICKSTAR_DISK_TESTING_MEMORY_CHUNK_SWAP_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "disk/chunk_swap.h"

namespace ps {

class MemoryChunkSwap final : public ChunkSwap {
 public:
  MemoryChunkSwap() = default;
  ~MemoryChunkSwap() override;

  absl::Status AddSlot(int64_t key, int64_t bytes, std::string name) override;
  absl::StatusOr<IoTicket> StartWrite(int64_t key, const void* src) override;
  absl::StatusOr<IoTicket> StartRead(int64_t key, void* dst) override;
  absl::Status Wait(IoTicket ticket) override;
  bool Poll(IoTicket ticket) override;
  bool written(int64_t key) const override;
  int64_t slot_bytes(int64_t key) const override;
  ChunkSwapInfo info() const override;
  ChunkSwapCounters counters() const override { return counters_; }

  // For tests: I/Os started and not yet waited for, and the most at once so far.
  int64_t in_flight() const { return static_cast<int64_t>(pending_.size()); }
  int64_t max_in_flight() const { return max_in_flight_; }
  // For tests: the next read of `key` returns `error` instead of the bytes.
  void FailNextRead(int64_t key, absl::Status error) { read_faults_[key] = std::move(error); }

 private:
  struct Slot {
    std::string name;
    std::vector<char> bytes;
    bool written = false;
    bool busy = false;
  };
  struct Pending {
    int64_t key = 0;
    bool write = false;
    const void* src = nullptr;
    void* dst = nullptr;
    bool done = false;
    absl::Status status;
  };
  absl::StatusOr<Slot*> FindSlot(int64_t key, absl::string_view what);
  // Carries out the I/O (once).
  void Complete(Pending& p);

  absl::flat_hash_map<int64_t, Slot> slots_;
  absl::flat_hash_map<IoTicket, Pending> pending_;
  absl::flat_hash_map<int64_t, absl::Status> read_faults_;
  IoTicket next_ticket_ = 1;
  int64_t max_in_flight_ = 0;
  int64_t file_bytes_ = 0;
  ChunkSwapCounters counters_;
};

}  // namespace ps

#endif  // PATRICKSTAR_DISK_TESTING_MEMORY_CHUNK_SWAP_H_
