#include "disk/testing/faulty_io_engine.h"

#include <algorithm>
#include <cerrno>
#include <utility>

#include "glog/logging.h"

namespace ps {

FaultyIoEngine::FaultyIoEngine(std::unique_ptr<IoEngine> inner, FaultRates rates, uint64_t seed)
    : inner_(std::move(inner)), rates_(rates), rng_(seed) {
  CHECK(inner_ != nullptr);
}

absl::Status FaultyIoEngine::Submit(absl::Span<const IoRequest> requests) {
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  std::vector<IoRequest> down;
  down.reserve(requests.size());
  MutexLock lock(&mu_);
  for (IoRequest r : requests) {
    if (uniform(rng_) < rates_.eio) {
      ++counts_->eios;
      synthesized_.push_back(IoCompletion{.tag = r.tag, .result = -EIO});
      continue;
    }
    if (r.write && uniform(rng_) < rates_.write_enospc) {
      ++counts_->write_enospcs;
      synthesized_.push_back(IoCompletion{.tag = r.tag, .result = -ENOSPC});
      continue;
    }
    if (!r.write && uniform(rng_) < rates_.read_eof) {
      ++counts_->read_eofs;
      synthesized_.push_back(IoCompletion{.tag = r.tag, .result = 0});
      continue;
    }
    if (r.bytes > 1 && uniform(rng_) < rates_.short_transfer) {
      // A request of whole 4096-byte blocks may be on an O_DIRECT descriptor, which moves whole
      // blocks only: it is cut at a block boundary, as the kernel would.
      constexpr int64_t kBlock = 4096;
      if (r.bytes % kBlock != 0) {
        ++counts_->short_transfers;
        r.bytes = std::uniform_int_distribution<int64_t>(1, r.bytes - 1)(rng_);
      } else if (r.bytes > kBlock) {
        ++counts_->short_transfers;
        r.bytes = kBlock * std::uniform_int_distribution<int64_t>(1, r.bytes / kBlock - 1)(rng_);
      }
    }
    if (!r.write && uniform(rng_) < rates_.corrupt_read) {
      ++counts_->corrupt_reads;
      to_corrupt_[r.tag] = static_cast<uint8_t*>(r.buffer);
    }
    down.push_back(r);
  }
  mu_.Unlock();
  absl::Status status = inner_->Submit(down);
  mu_.Lock();
  return status;
}

absl::Status FaultyIoEngine::Reap(int min_completions, std::vector<IoCompletion>* out) {
  int made_up;
  {
    MutexLock lock(&mu_);
    made_up = static_cast<int>(synthesized_.size());
    out->insert(out->end(), synthesized_.begin(), synthesized_.end());
    synthesized_.clear();
  }
  const size_t first = out->size();
  if (absl::Status s = inner_->Reap(std::max(0, min_completions - made_up), out); !s.ok()) {
    return s;
  }
  MutexLock lock(&mu_);
  for (size_t i = first; i < out->size(); ++i) {
    auto it = to_corrupt_.find((*out)[i].tag);
    if (it == to_corrupt_.end()) continue;
    const int64_t n = (*out)[i].result;
    if (n > 0) {
      const int64_t at = std::uniform_int_distribution<int64_t>(0, n - 1)(rng_);
      it->second[at] ^= static_cast<uint8_t>(1u << (at % 8));
    } else {
      --counts_->corrupt_reads;  // the read failed anyway: nothing was corrupted
    }
    to_corrupt_.erase(it);
  }
  return absl::OkStatus();
}

int FaultyIoEngine::Allocate(int fd, int64_t offset, int64_t bytes) {
  MutexLock lock(&mu_);
  if (std::uniform_real_distribution<double>(0.0, 1.0)(rng_) < rates_.allocate_enospc) {
    ++counts_->allocate_enospcs;
    return -ENOSPC;
  }
  return inner_->Allocate(fd, offset, bytes);
}

}  // namespace ps
