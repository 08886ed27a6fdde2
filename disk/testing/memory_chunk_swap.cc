#include "disk/testing/memory_chunk_swap.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace ps {

MemoryChunkSwap::~MemoryChunkSwap() {
  for (auto& [ticket, p] : pending_) Complete(p);
}

absl::StatusOr<MemoryChunkSwap::Slot*> MemoryChunkSwap::FindSlot(int64_t key,
                                                                 absl::string_view what) {
  auto it = slots_.find(key);
  if (it == slots_.end()) {
    return absl::NotFoundError(absl::StrCat("MemoryChunkSwap: ", what, " of unknown slot ", key));
  }
  if (it->second.busy) {
    return absl::FailedPreconditionError(absl::StrCat("MemoryChunkSwap: ", what, " of slot ",
                                                      it->second.name,
                                                      " while another I/O of it is in flight"));
  }
  return &it->second;
}

absl::Status MemoryChunkSwap::AddSlot(int64_t key, int64_t bytes, std::string name) {
  if (bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("MemoryChunkSwap: slot ", name, " of ", bytes, " bytes"));
  }
  if (slots_.contains(key)) {
    return absl::InvalidArgumentError(absl::StrCat("MemoryChunkSwap: slot ", key, " added twice"));
  }
  Slot& slot = slots_[key];
  slot.name = std::move(name);
  slot.bytes.resize(static_cast<size_t>(bytes));
  file_bytes_ += bytes;
  return absl::OkStatus();
}

absl::StatusOr<IoTicket> MemoryChunkSwap::StartWrite(int64_t key, const void* src) {
  Slot* slot;
  {
    auto found = FindSlot(key, "write");
    if (!found.ok()) return found.status();
    slot = *found;
  }
  slot->busy = true;
  const IoTicket t = next_ticket_++;
  Pending& p = pending_[t];
  p.key = key;
  p.write = true;
  p.src = src;
  max_in_flight_ = std::max<int64_t>(max_in_flight_, static_cast<int64_t>(pending_.size()));
  return t;
}

absl::StatusOr<IoTicket> MemoryChunkSwap::StartRead(int64_t key, void* dst) {
  Slot* slot;
  {
    auto found = FindSlot(key, "read");
    if (!found.ok()) return found.status();
    slot = *found;
  }
  if (!slot->written) {
    return absl::FailedPreconditionError(
        absl::StrCat("MemoryChunkSwap: read of slot ", slot->name, ", which was never written"));
  }
  slot->busy = true;
  const IoTicket t = next_ticket_++;
  Pending& p = pending_[t];
  p.key = key;
  p.dst = dst;
  max_in_flight_ = std::max<int64_t>(max_in_flight_, static_cast<int64_t>(pending_.size()));
  return t;
}

void MemoryChunkSwap::Complete(Pending& p) {
  if (p.done) return;
  p.done = true;
  Slot& slot = slots_[p.key];
  slot.busy = false;
  const int64_t n = static_cast<int64_t>(slot.bytes.size());
  if (p.write) {
    std::memcpy(slot.bytes.data(), p.src, static_cast<size_t>(n));
    slot.written = true;
    ++counters_.writes;
    counters_.write_bytes += n;
    return;
  }
  if (auto it = read_faults_.find(p.key); it != read_faults_.end()) {
    p.status = std::move(it->second);
    read_faults_.erase(it);
    return;
  }
  std::memcpy(p.dst, slot.bytes.data(), static_cast<size_t>(n));
  ++counters_.reads;
  counters_.read_bytes += n;
}

absl::Status MemoryChunkSwap::Wait(IoTicket ticket) {
  auto it = pending_.find(ticket);
  if (it == pending_.end()) {
    return absl::NotFoundError(absl::StrCat("MemoryChunkSwap: unknown ticket ", ticket));
  }
  Complete(it->second);
  absl::Status status = std::move(it->second.status);
  pending_.erase(it);
  return status;
}

bool MemoryChunkSwap::Poll(IoTicket ticket) {
  auto it = pending_.find(ticket);
  if (it == pending_.end()) return false;
  Complete(it->second);
  return true;
}

bool MemoryChunkSwap::written(int64_t key) const {
  auto it = slots_.find(key);
  return it != slots_.end() && it->second.written;
}

int64_t MemoryChunkSwap::slot_bytes(int64_t key) const {
  auto it = slots_.find(key);
  return it == slots_.end() ? 0 : static_cast<int64_t>(it->second.bytes.size());
}

ChunkSwapInfo MemoryChunkSwap::info() const {
  return ChunkSwapInfo{.dir = "(memory)",
                       .path = "(memory)",
                       .engine = "memory",
                       .direct = false,
                       .direct_note = "in memory (tests)",
                       .file_bytes = file_bytes_};
}

}  // namespace ps
