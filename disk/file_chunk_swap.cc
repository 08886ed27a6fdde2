#include "disk/file_chunk_swap.h"

#include <string.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <deque>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/crc32c.h"
#include "base/file_io.h"
#include "base/mutex.h"
#include "base/status_macros.h"
#include "disk/disk_probe.h"
#include "disk/io_engine.h"
#include "disk/swap_dir.h"
#include "glog/logging.h"

namespace ps {
namespace {

int64_t RoundUp(int64_t n, int64_t m) { return (n + m - 1) / m * m; }
bool Aligned(int64_t n) { return n % kDirectIoAlignment == 0; }
int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

class FileChunkSwap final : public ChunkSwap {
 public:
  FileChunkSwap(FileChunkSwapOptions options, std::unique_ptr<SwapDir> dir, SwapFile file,
                OpenedIoEngine engine);
  ~FileChunkSwap() override;

  absl::Status AddSlot(int64_t key, int64_t bytes, std::string name) override;
  absl::StatusOr<IoTicket> StartWrite(int64_t key, const void* src) override;
  absl::StatusOr<IoTicket> StartRead(int64_t key, void* dst) override;
  absl::Status Wait(IoTicket ticket) override;
  bool Poll(IoTicket ticket) override;
  bool written(int64_t key) const override;
  int64_t slot_bytes(int64_t key) const override;
  ChunkSwapInfo info() const override;
  ChunkSwapCounters counters() const override;

 private:
  struct Slot {
    std::string name;
    int64_t offset = 0;
    int64_t bytes = 0;
    bool written = false;
    bool busy = false;
    uint32_t crc = 0;
  };
  // One slot I/O. The fields above `pieces_left` are set before the ticket is shared with the I/O
  // thread and never change; the rest is guarded by mu_.
  struct Ticket {
    int64_t key = 0;
    std::string name;
    int64_t offset = 0;
    int64_t bytes = 0;
    bool write = false;
    char* buffer = nullptr;
    int pieces_left = 0;
    absl::Status status;  // the first error of a piece
    // The CRC-32C of the buffer — a write's source, a read's bytes once all arrived — computed on
    // the I/O thread (crc_queue_), off the caller's path. A write always needs it; a read once its
    // pieces all succeeded. done waits for it.
    bool crc_needed = false;
    bool crc_done = false;
    uint32_t crc = 0;
    bool done = false;
    // Caller-thread state: Finalize ran and its result.
    bool finalized = false;
    absl::Status result;
  };
  // One request of a ticket, possibly the rest of a short transfer.
  struct Piece {
    Ticket* ticket = nullptr;
    int64_t offset = 0;
    char* buffer = nullptr;
    int64_t bytes = 0;
  };

  absl::StatusOr<Slot*> FindSlot(int64_t key, absl::string_view what);
  absl::StatusOr<IoTicket> Start(int64_t key, Slot& slot, bool write, char* buffer);
  // Caller thread: applies a completed ticket to its slot and the counters (once).
  void Finalize(Ticket& t);
  // The message prefix naming the file, the slot and the offset.
  std::string Where(const Ticket& t, int64_t offset) const;
  absl::Status PieceError(const Ticket& t, const Piece& p, int64_t result) const;

  void IoLoop();
  // Under mu_: a piece ended (successfully or not).
  void PieceDone(Ticket& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // I/O thread: computes the CRCs crc_queue_ holds (outside mu_) and completes their tickets.
  void ComputeCrcs();
  void Fail(Ticket& t, absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const FileChunkSwapOptions options_;
  // Destroyed last: removes the file and the lock after everything else closed.
  std::unique_ptr<SwapDir> dir_;
  SwapFile file_;
  std::string engine_description_;
  std::unique_ptr<IoEngine> engine_;

  // Caller thread only.
  absl::flat_hash_map<int64_t, Slot> slots_;
  int64_t file_bytes_ = 0;
  IoTicket next_ticket_ = 1;
  ChunkSwapCounters counters_;

  mutable Mutex mu_;
  absl::flat_hash_map<IoTicket, std::unique_ptr<Ticket>> tickets_ ABSL_GUARDED_BY(mu_);
  std::deque<Piece> queue_ ABSL_GUARDED_BY(mu_);
  // Tickets whose CRC the I/O thread is to compute (see Ticket::crc_needed).
  std::vector<Ticket*> crc_queue_ ABSL_GUARDED_BY(mu_);
  int64_t buffered_requests_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread io_thread_;
};

FileChunkSwap::FileChunkSwap(FileChunkSwapOptions options, std::unique_ptr<SwapDir> dir,
                             SwapFile file, OpenedIoEngine engine)
    : options_(std::move(options)),
      dir_(std::move(dir)),
      file_(file),
      engine_description_(std::move(engine.description)),
      engine_(std::move(engine.engine)) {
  io_thread_ = std::thread([this] { IoLoop(); });
}

FileChunkSwap::~FileChunkSwap() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  io_thread_.join();
  MutexLock lock(&mu_);
  for (auto& [id, t] : tickets_) {
    if (!t->status.ok() && !t->finalized) {
      LOG(ERROR) << "swap I/O nobody waited for failed: " << t->status;
    }
  }
  engine_.reset();
  CloseSwapFile(file_);
  // dir_ removes the file and the lock.
}

std::string FileChunkSwap::Where(const Ticket& t, int64_t offset) const {
  return absl::StrCat("swap file '", file_.path, "', slot ", t.name, " (", t.bytes,
                      " bytes at offset ", t.offset, "), file offset ", offset);
}

absl::Status FileChunkSwap::PieceError(const Ticket& t, const Piece& p, int64_t result) const {
  const char* op = t.write ? "writing" : "reading";
  if (result == 0) {
    if (t.write) {
      return absl::DataLossError(
          absl::StrCat(Where(t, p.offset), ": the disk wrote 0 of ", p.bytes, " bytes"));
    }
    return absl::DataLossError(absl::StrCat(Where(t, p.offset), ": short read: end of file after ",
                                            p.offset - t.offset, " of ", t.bytes, " bytes"));
  }
  const int err = static_cast<int>(-result);
  if (err == EIO) {
    return absl::DataLossError(
        absl::StrCat(Where(t, p.offset), ": the disk reported an I/O error (", op, ", EIO)"));
  }
  if (err == ENOSPC || err == EDQUOT) {
    absl::StatusOr<int64_t> free_bytes = FreeDiskBytes(options_.dir);
    return absl::ResourceExhaustedError(absl::StrCat(
        "the swap directory '", options_.dir, "' is full (", ::strerror(err), ") ", op, " ",
        Where(t, p.offset), "; ",
        free_bytes.ok() ? absl::StrCat(*free_bytes, " bytes free") : "free space unknown",
        "; free space there or name another directory (nvme_path)"));
  }
  return absl::ErrnoToStatus(err, absl::StrCat(Where(t, p.offset), ": ", op, " failed"));
}

absl::StatusOr<FileChunkSwap::Slot*> FileChunkSwap::FindSlot(int64_t key, absl::string_view what) {
  auto it = slots_.find(key);
  if (it == slots_.end()) {
    return absl::NotFoundError(
        absl::StrCat("swap '", file_.path, "': ", what, " of unknown slot ", key));
  }
  if (it->second.busy) {
    return absl::FailedPreconditionError(absl::StrCat("swap '", file_.path, "': ", what,
                                                      " of slot ", it->second.name,
                                                      " while another I/O of it is in flight"));
  }
  return &it->second;
}

absl::Status FileChunkSwap::AddSlot(int64_t key, int64_t bytes, std::string name) {
  if (bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("swap '", file_.path, "': slot ", name, " of ", bytes, " bytes"));
  }
  if (slots_.contains(key)) {
    return absl::InvalidArgumentError(
        absl::StrCat("swap '", file_.path, "': slot ", key, " (", name, ") added twice"));
  }
  const int64_t offset = file_bytes_;
  const int64_t rounded = RoundUp(bytes, kDirectIoAlignment);
  int rc = engine_->Allocate(file_.fd, offset, rounded);
  if (rc == -EOPNOTSUPP) {
    // No fallocate on this filesystem: grow the file sparsely (the space is then not reserved).
    rc = ::ftruncate(file_.fd, offset + rounded) == 0 ? 0 : -errno;
  }
  if (rc == -ENOSPC || rc == -EDQUOT) {
    absl::StatusOr<int64_t> free_bytes = FreeDiskBytes(options_.dir);
    return absl::ResourceExhaustedError(absl::StrCat(
        "the swap directory '", options_.dir, "' has no room for slot ", name, ": the swap file '",
        file_.path, "' needs ", rounded, " more bytes (", offset + rounded, " in all) and the ",
        "filesystem has ",
        free_bytes.ok() ? absl::StrCat(*free_bytes, " bytes free")
                        : "an unknown number of bytes free",
        "; free space there, name another directory (nvme_path) or keep more state in RAM"));
  }
  if (rc != 0) {
    return absl::ErrnoToStatus(-rc, absl::StrCat("cannot grow the swap file '", file_.path,
                                                 "' for slot ", name, " by ", rounded, " bytes"));
  }
  Slot& slot = slots_[key];
  slot.name = std::move(name);
  slot.offset = offset;
  slot.bytes = bytes;
  file_bytes_ = offset + rounded;
  return absl::OkStatus();
}

absl::StatusOr<IoTicket> FileChunkSwap::Start(int64_t key, Slot& slot, bool write, char* buffer) {
  auto ticket = std::make_unique<Ticket>();
  ticket->key = key;
  ticket->name = slot.name;
  ticket->offset = slot.offset;
  ticket->bytes = slot.bytes;
  ticket->write = write;
  ticket->buffer = buffer;
  // Requests of block_size; with O_DIRECT the unaligned tail of the last one is its own request
  // (it takes the buffered descriptor), so the bulk stays direct.
  std::vector<Piece> pieces;
  for (int64_t done = 0; done < slot.bytes;) {
    int64_t n = std::min(options_.block_size, slot.bytes - done);
    if (file_.direct && n > kDirectIoAlignment && !Aligned(n)) n -= n % kDirectIoAlignment;
    pieces.push_back(Piece{
        .ticket = ticket.get(), .offset = slot.offset + done, .buffer = buffer + done, .bytes = n});
    done += n;
  }
  ticket->pieces_left = static_cast<int>(pieces.size());
  slot.busy = true;
  const IoTicket id = next_ticket_++;
  MutexLock lock(&mu_);
  if (write) {
    // The source's CRC is taken on the I/O thread while the write is in flight: the caller may not
    // change the buffer before Wait (disk/chunk_swap.h), so it is the CRC of the bytes written.
    ticket->crc_needed = true;
    crc_queue_.push_back(ticket.get());
  }
  tickets_[id] = std::move(ticket);
  queue_.insert(queue_.end(), pieces.begin(), pieces.end());
  return id;
}

absl::StatusOr<IoTicket> FileChunkSwap::StartWrite(int64_t key, const void* src) {
  ASSIGN_OR_RETURN(Slot * slot, FindSlot(key, "write"));
  // The engine only reads from a write's buffer.
  return Start(key, *slot, /*write=*/true, const_cast<char*>(static_cast<const char*>(src)));
}

absl::StatusOr<IoTicket> FileChunkSwap::StartRead(int64_t key, void* dst) {
  ASSIGN_OR_RETURN(Slot * slot, FindSlot(key, "read"));
  if (!slot->written) {
    return absl::FailedPreconditionError(
        absl::StrCat("swap '", file_.path, "': read of slot ", slot->name,
                     ", which holds no completed write (never written, or its last write failed)"));
  }
  return Start(key, *slot, /*write=*/false, static_cast<char*>(dst));
}

void FileChunkSwap::Finalize(Ticket& t) {
  if (t.finalized) return;
  t.finalized = true;
  Slot& slot = slots_[t.key];
  slot.busy = false;
  absl::Status status;
  {
    MutexLock lock(&mu_);
    status = t.status;
  }
  if (t.write) {
    slot.written = status.ok();
    if (status.ok()) {
      slot.crc = t.crc;  // crc_done: done waited for it
      ++counters_.writes;
      counters_.write_bytes += t.bytes;
    }
  } else if (status.ok()) {
    uint32_t crc;
    {
      MutexLock lock(&mu_);
      crc = t.crc;  // of the bytes read, taken on the I/O thread
    }
    if (crc != slot.crc) {
      status = absl::DataLossError(absl::StrFormat(
          "%s: the bytes read back do not match what was written (CRC-32C 0x%08x, written "
          "0x%08x): the disk or the file returned corrupted data",
          Where(t, t.offset), crc, slot.crc));
    } else {
      ++counters_.reads;
      counters_.read_bytes += t.bytes;
    }
  }
  t.result = std::move(status);
}

absl::Status FileChunkSwap::Wait(IoTicket id) {
  Ticket* t;
  int64_t blocked_ns = 0;
  {
    MutexLock lock(&mu_);
    auto it = tickets_.find(id);
    if (it == tickets_.end()) {
      return absl::NotFoundError(absl::StrCat("swap '", file_.path, "': unknown ticket ", id));
    }
    t = it->second.get();
    if (!t->done) {
      const int64_t start = NowNs();
      mu_.Await([t]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return t->done; });
      blocked_ns = NowNs() - start;
    }
  }
  (t->write ? counters_.write_wait_ns : counters_.read_wait_ns) += blocked_ns;
  Finalize(*t);
  absl::Status result = std::move(t->result);
  MutexLock lock(&mu_);
  tickets_.erase(id);
  return result;
}

bool FileChunkSwap::Poll(IoTicket id) {
  Ticket* t;
  {
    MutexLock lock(&mu_);
    auto it = tickets_.find(id);
    if (it == tickets_.end() || !it->second->done) return false;
    t = it->second.get();
  }
  Finalize(*t);
  return true;
}

bool FileChunkSwap::written(int64_t key) const {
  auto it = slots_.find(key);
  return it != slots_.end() && it->second.written;
}

int64_t FileChunkSwap::slot_bytes(int64_t key) const {
  auto it = slots_.find(key);
  return it == slots_.end() ? 0 : it->second.bytes;
}

ChunkSwapInfo FileChunkSwap::info() const {
  return ChunkSwapInfo{.dir = options_.dir,
                       .path = file_.path,
                       .engine = engine_description_,
                       .direct = file_.direct,
                       .direct_note = file_.note,
                       .file_bytes = file_bytes_};
}

ChunkSwapCounters FileChunkSwap::counters() const {
  ChunkSwapCounters c = counters_;
  MutexLock lock(&mu_);
  c.buffered_requests = buffered_requests_;
  return c;
}

void FileChunkSwap::PieceDone(Ticket& t) {
  if (--t.pieces_left > 0) return;
  if (!t.write && t.status.ok()) {
    t.crc_needed = true;
    crc_queue_.push_back(&t);
  }
  if (!t.crc_needed || t.crc_done) t.done = true;
}

void FileChunkSwap::ComputeCrcs() {
  std::vector<Ticket*> work;
  {
    MutexLock lock(&mu_);
    work.swap(crc_queue_);
  }
  if (work.empty()) return;
  // Tickets in crc_queue_ are not done, so nobody erases them meanwhile; their buffers are the
  // caller's until Wait (a write's is only read by the kernel; a read's pieces all arrived).
  std::vector<uint32_t> crcs;
  crcs.reserve(work.size());
  for (Ticket* t : work) crcs.push_back(Crc32c(t->buffer, static_cast<size_t>(t->bytes)));
  MutexLock lock(&mu_);
  for (size_t i = 0; i < work.size(); ++i) {
    Ticket& t = *work[i];
    t.crc = crcs[i];
    t.crc_done = true;
    if (t.pieces_left == 0) t.done = true;
  }
}

void FileChunkSwap::Fail(Ticket& t, absl::Status status) {
  if (t.status.ok()) t.status = std::move(status);
}

void FileChunkSwap::IoLoop() {
  absl::flat_hash_map<uint64_t, Piece> in_flight;
  uint64_t next_tag = 1;
  std::vector<IoRequest> batch;
  std::vector<Piece> batch_pieces;
  std::vector<IoCompletion> completions;
  const int depth = options_.queue_depth;
  while (true) {
    batch.clear();
    batch_pieces.clear();
    {
      MutexLock lock(&mu_);
      if (in_flight.empty()) {
        mu_.Await([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
          return stopping_ || !queue_.empty() || !crc_queue_.empty();
        });
        if (queue_.empty() && crc_queue_.empty()) return;  // stopping, and nothing is left to do
      }
      const bool refill = options_.overlap_events || in_flight.empty();
      while (refill && !queue_.empty() &&
             static_cast<int>(in_flight.size() + batch_pieces.size()) < depth) {
        Piece p = queue_.front();
        queue_.pop_front();
        if (!p.ticket->status.ok()) {  // the ticket failed already: skip its other requests
          PieceDone(*p.ticket);
          continue;
        }
        batch_pieces.push_back(p);
      }
      for (const Piece& p : batch_pieces) {
        const bool aligned =
            Aligned(reinterpret_cast<uintptr_t>(p.buffer)) && Aligned(p.offset) && Aligned(p.bytes);
        if (file_.direct && !aligned) ++buffered_requests_;
        batch.push_back(IoRequest{.fd = aligned ? file_.fd : file_.buffered_fd,
                                  .offset = p.offset,
                                  .buffer = p.buffer,
                                  .bytes = p.bytes,
                                  .write = p.ticket->write,
                                  .tag = next_tag});
        in_flight[next_tag++] = p;
      }
    }
    absl::Status submitted;
    if (options_.single_submit) {
      for (const IoRequest& r : batch) {
        submitted = engine_->Submit(absl::MakeConstSpan(&r, 1));
        if (!submitted.ok()) break;
      }
    } else if (!batch.empty()) {
      submitted = engine_->Submit(batch);
    }
    if (!submitted.ok()) {
      // The engine itself broke: every request it holds is lost to us; fail them all. (Never seen;
      // the buffers stay untouched only if the kernel did not take them, so this is logged.)
      LOG(ERROR) << "swap '" << file_.path << "': the I/O engine failed: " << submitted;
      MutexLock lock(&mu_);
      for (auto& [tag, p] : in_flight) {
        Fail(*p.ticket,
             absl::InternalError(absl::StrCat(Where(*p.ticket, p.offset),
                                              ": the I/O engine failed: ", submitted.message())));
        PieceDone(*p.ticket);
      }
      in_flight.clear();
      continue;
    }
    // While the requests just submitted are in flight: the CRCs of started writes and finished
    // reads.
    ComputeCrcs();
    if (in_flight.empty()) continue;
    completions.clear();
    const int wait_for = options_.overlap_events ? 1 : static_cast<int>(in_flight.size());
    if (absl::Status reaped = engine_->Reap(wait_for, &completions); !reaped.ok()) {
      LOG(FATAL) << "swap '" << file_.path << "': reaping I/O completions failed with "
                 << in_flight.size() << " requests in flight (their buffers may still be "
                 << "written by the kernel): " << reaped;
    }
    MutexLock lock(&mu_);
    for (const IoCompletion& c : completions) {
      auto it = in_flight.find(c.tag);
      CHECK(it != in_flight.end()) << "completion of unknown request " << c.tag;
      Piece p = it->second;
      in_flight.erase(it);
      Ticket& t = *p.ticket;
      if (c.result == -EINTR || c.result == -EAGAIN) {
        queue_.push_front(p);  // try again
        continue;
      }
      if (c.result <= 0) {
        Fail(t, PieceError(t, p, c.result));
        PieceDone(t);
        continue;
      }
      if (c.result < p.bytes) {
        // A short transfer: continue with the rest.
        p.offset += c.result;
        p.buffer += c.result;
        p.bytes -= c.result;
        queue_.push_front(p);
        continue;
      }
      PieceDone(t);
    }
  }
}

constexpr int64_t kMaxBlockBytes = int64_t{1} << 30;

absl::Status CheckOptions(const FileChunkSwapOptions& o, bool direct) {
  if (o.block_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("aio.block_size must be positive, got ", o.block_size));
  }
  if (o.block_size > kMaxBlockBytes) {
    // One request is one read/write system call or ring entry (32-bit lengths).
    return absl::InvalidArgumentError(absl::StrCat("aio.block_size must be at most ",
                                                   kMaxBlockBytes, " (1 GiB), got ", o.block_size));
  }
  if (direct && o.block_size % kDirectIoAlignment != 0) {
    return absl::InvalidArgumentError(absl::StrCat("aio.block_size must be a multiple of ",
                                                   kDirectIoAlignment, " for direct I/O, got ",
                                                   o.block_size));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<ChunkSwap>> OpenFileChunkSwap(FileChunkSwapOptions options) {
  RETURN_IF_ERROR(CheckOptions(options, options.direct));
  ASSIGN_OR_RETURN(OpenedIoEngine engine,
                   OpenIoEngine(IoEngineOptions{
                       .kind = options.engine,
                       .queue_depth = options.queue_depth,
                       .thread_count = options.thread_count,
                       .io_uring_refusal_for_test = options.io_uring_refusal_for_test}));
  if (options.wrap_engine_for_test) {
    engine.engine = options.wrap_engine_for_test(std::move(engine.engine));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<SwapDir> dir, SwapDir::Claim(options.dir, options.rank));
  ASSIGN_OR_RETURN(SwapFile file, CreateSwapFile(dir->swap_path(), options.dir, options.direct,
                                                 options.refuse_direct_for_test));
  return std::unique_ptr<ChunkSwap>(
      new FileChunkSwap(std::move(options), std::move(dir), file, std::move(engine)));
}

}  // namespace ps
