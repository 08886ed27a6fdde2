// Chunk traffic of the eviction policies on GPT-shaped training traces.
//
// For each GPT preset (124M to 12B parameters) and several accelerator budgets, one training
// iteration's param-chunk accesses are generated the way the ChunkManager records them, and
// replayed through OPT (learning its schedule in a warm-up iteration, as the ChunkManager does),
// LRU and a static partition, and through Belady's MIN with true future knowledge (an independent
// implementation: the minimum number of loads for demand paging). Per steady-state iteration the
// table reports loads (host -> accelerator) and write-backs (accelerator -> host) with clean
// eviction, the forward pass's write-backs with clean eviction and without it (PatrickStar moves
// every evicted chunk back), and checks that OPT loads exactly Belady's minimum and that clean
// eviction leaves the forward pass without write-backs.
//
// The trace model:
//  - Operators: model/gpt_config.h, f16 params, the embedding on the host (PatrickStar's CPU
//    embedding), so the chunk is sized by the largest block operator (mlp.c_fc), rounded up to
//    1 Mi elements. Each operator access is one moment needing the operator's chunk.
//  - Activation checkpointing per block; backward of block l first recomputes its forward (read
//    accesses), then runs the operators' backward in reverse (gradients overwrite parameters: the
//    chunk becomes dirty).
//  - The non-model tide, batch 8 x sequence 1024: checkpoints of 2 s b h bytes per finished block,
//    a block's working activations s b h (34 + 5 a s / h) bytes (Korthikanti et al.), twice that
//    in backward, and f32 logits s b V x 4 bytes around the LM head.
//  - Capacity at moment m: floor((budget - max(tide[m], tide[m+1])) / chunk bytes), the
//    ChunkManager's chunkable memory.
//  - The optimizer step runs on the host (CPU Adam): every param chunk goes back to the host
//    (dirty ones written back), so every iteration starts with an empty accelerator.
//  - Static partition: the lowest-index chunks that fit at the tide's peak, less one streaming
//    slot, are preferred residents (ZeRO-Offload-like static placement).
//
// Run: bazel run //benchmarks:scheduler_benchmark
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_format.h"
#include "base/check.h"
#include "base/units.h"
#include "chunk/chunk_layout.h"
#include "chunk/operator_spec.h"
#include "glog/logging.h"
#include "model/gpt_config.h"
#include "scheduler/access_schedule.h"
#include "scheduler/eviction_policy.h"

namespace ps {
namespace {

constexpr int64_t kBatch = 8;
constexpr int kIterations = 4;  // 0: warm-up; 2: the reported steady iteration

enum class Phase : uint8_t { kForward, kRecompute, kBackward, kAdam };

struct Step {
  int64_t chunk = -1;  // -1: the optimizer step (everything goes to the host)
  Phase phase = Phase::kForward;
  int64_t tide_bytes = 0;
};

struct Trace {
  std::string preset;
  int64_t params = 0;
  int64_t chunk_elems = 0;
  int64_t chunk_bytes = 0;
  int64_t num_chunks = 0;
  int64_t peak_tide_bytes = 0;
  std::vector<Step> steps;
};

Trace BuildTrace(const std::string& preset) {
  absl::StatusOr<GptConfig> config = GptPreset(preset);
  PS_CHECK_OK(config);
  const GptConfig& c = *config;
  std::vector<OperatorSpec> ops = GptOperators(c);
  ops.erase(ops.begin(), ops.begin() + 2);  // the embedding (wte, wpe) runs on the host
  int64_t largest = 0;
  for (const OperatorSpec& op : ops) largest = std::max(largest, OperatorNumElems(op));
  Trace t;
  t.preset = preset;
  t.params = GptParameterCount(c);
  t.chunk_elems = AlignUp(largest, kMiB);
  t.chunk_bytes = t.chunk_elems * 2;
  absl::StatusOr<ChunkLayout> layout = ChunkLayout::Build({.capacity_elems = t.chunk_elems}, ops);
  PS_CHECK_OK(layout);
  t.num_chunks = layout->num_chunks();
  auto chunk_of = [&](const std::string& name) {
    absl::StatusOr<OperatorId> id = layout->FindOperator(name);
    PS_CHECK_OK(id);
    return layout->op(*id).chunk_index;
  };

  const int64_t sbh = c.max_seq_len * kBatch * c.hidden;
  const int64_t checkpoint_bytes = 2 * sbh;
  const int64_t work_bytes = sbh * 34 + 5 * c.num_heads * c.max_seq_len * c.max_seq_len * kBatch;
  const int64_t logits_bytes = c.max_seq_len * kBatch * c.vocab_size * 4;
  const char* block_ops[] = {"ln_1", "attn.c_attn", "attn.c_proj",
                             "ln_2", "mlp.c_fc",    "mlp.c_proj"};
  auto op_name = [](int64_t l, const char* op) { return absl::StrFormat("h.%d.%s", l, op); };
  for (int64_t l = 0; l < c.num_layers; ++l) {
    for (const char* op : block_ops) {
      t.steps.push_back(
          {chunk_of(op_name(l, op)), Phase::kForward, l * checkpoint_bytes + work_bytes});
    }
  }
  const int64_t all_checkpoints = c.num_layers * checkpoint_bytes;
  t.steps.push_back({chunk_of("ln_f"), Phase::kForward, all_checkpoints + logits_bytes});
  t.steps.push_back({chunk_of("ln_f"), Phase::kBackward, all_checkpoints + 2 * logits_bytes});
  for (int64_t l = c.num_layers - 1; l >= 0; --l) {
    for (const char* op : block_ops) {
      t.steps.push_back(
          {chunk_of(op_name(l, op)), Phase::kRecompute, l * checkpoint_bytes + work_bytes});
    }
    for (int i = 5; i >= 0; --i) {
      t.steps.push_back({chunk_of(op_name(l, block_ops[i])), Phase::kBackward,
                         l * checkpoint_bytes + 2 * work_bytes});
    }
  }
  t.steps.push_back({-1, Phase::kAdam, 0});
  for (const Step& s : t.steps) t.peak_tide_bytes = std::max(t.peak_tide_bytes, s.tide_bytes);
  return t;
}

// Chunks that fit beside the tide at each moment (0 at the optimizer step: all go to the host).
std::vector<int64_t> Capacities(const Trace& t, int64_t budget_bytes) {
  std::vector<int64_t> cap(t.steps.size());
  for (size_t m = 0; m < t.steps.size(); ++m) {
    if (t.steps[m].chunk < 0) continue;
    const int64_t tide =
        std::max(t.steps[m].tide_bytes, t.steps[(m + 1) % t.steps.size()].tide_bytes);
    cap[m] = std::max<int64_t>(0, (budget_bytes - tide) / t.chunk_bytes);
  }
  return cap;
}

struct Traffic {
  int64_t loads = 0;
  int64_t write_backs = 0;          // with clean eviction
  int64_t evictions = 0;            // = write-backs without clean eviction (PatrickStar)
  int64_t forward_write_backs = 0;  // in the forward pass (not the backward's recompute)
  int64_t forward_evictions = 0;
  Traffic& operator+=(const Traffic& o) {
    loads += o.loads;
    write_backs += o.write_backs;
    forward_write_backs += o.forward_write_backs;
    forward_evictions += o.forward_evictions;
    evictions += o.evictions;
    return *this;
  }
};

// The accelerator's param chunks, with dirtiness and the per-iteration traffic.
class Device {
 public:
  bool resident(int64_t c) const { return resident_.contains(c); }
  int64_t size() const { return static_cast<int64_t>(resident_.size()); }
  const absl::flat_hash_set<int64_t>& chunks() const { return resident_; }
  void Load(int64_t c, Traffic& t) {
    resident_.insert(c);
    ++t.loads;
  }
  void Evict(int64_t c, Phase phase, Traffic& t) {
    CHECK(resident_.erase(c) == 1);
    ++t.evictions;
    const bool forward = phase == Phase::kForward;
    if (dirty_.erase(c) > 0) {
      ++t.write_backs;
      if (forward) ++t.forward_write_backs;
    }
    if (forward) ++t.forward_evictions;
  }
  void Touch(int64_t c, Phase phase) {
    if (phase == Phase::kBackward) dirty_.insert(c);
  }

 private:
  absl::flat_hash_set<int64_t> resident_;
  absl::flat_hash_set<int64_t> dirty_;
};

// Replays `iterations` iterations through `policy` (OPT learns its schedule in iteration 0).
std::vector<Traffic> ReplayPolicy(const Trace& t, const std::vector<int64_t>& cap,
                                  EvictionPolicy& policy, int iterations) {
  AccessSchedule schedule;
  Device device;
  std::vector<Traffic> per;
  const int64_t moments = static_cast<int64_t>(t.steps.size());
  for (int it = 0; it < iterations; ++it) {
    Traffic traffic;
    for (int64_t m = 0; m < moments; ++m) {
      const Step& s = t.steps[m];
      const int64_t need = s.chunk >= 0 && !device.resident(s.chunk) ? 1 : 0;
      const int64_t over = device.size() + need - cap[m];
      if (over > 0) {
        std::vector<EvictionCandidate> candidates;
        for (int64_t c : device.chunks()) {
          if (c != s.chunk) candidates.push_back({c, 1});
        }
        std::sort(candidates.begin(), candidates.end(),
                  [](const EvictionCandidate& a, const EvictionCandidate& b) {
                    return a.chunk < b.chunk;
                  });
        const std::vector<int64_t> victims = policy.ChooseVictims(candidates, over, m);
        CHECK_EQ(static_cast<int64_t>(victims.size()), over) << policy.name() << " at " << m;
        for (int64_t v : victims) device.Evict(v, s.phase, traffic);
      }
      if (s.chunk < 0) continue;
      if (need > 0) device.Load(s.chunk, traffic);
      device.Touch(s.chunk, s.phase);
      policy.RecordUse(s.chunk, m);
      if (it == 0) PS_CHECK_OK(schedule.Record(s.chunk, m));
    }
    if (it == 0) {
      PS_CHECK_OK(schedule.Finish(moments));
      policy.SetSchedule(&schedule);
    }
    per.push_back(traffic);
  }
  policy.SetSchedule(nullptr);
  return per;
}

// Belady's MIN with the true future: evicts the resident chunk whose next access in the whole
// remaining sequence is furthest (never again counts as furthest).
std::vector<Traffic> ReplayBelady(const Trace& t, const std::vector<int64_t>& cap, int iterations) {
  const int64_t moments = static_cast<int64_t>(t.steps.size());
  const int64_t total = moments * iterations;
  std::vector<int64_t> next_use(total, std::numeric_limits<int64_t>::max());
  absl::flat_hash_map<int64_t, int64_t> seen;
  for (int64_t p = total - 1; p >= 0; --p) {
    const int64_t c = t.steps[p % moments].chunk;
    if (c < 0) continue;
    auto it = seen.find(c);
    if (it != seen.end()) next_use[p] = it->second;
    seen[c] = p;
  }
  // Next use of each resident chunk from the current position.
  absl::flat_hash_map<int64_t, int64_t> next_of;
  Device device;
  std::vector<Traffic> per(iterations);
  for (int64_t p = 0; p < total; ++p) {
    const Step& s = t.steps[p % moments];
    const int64_t m = p % moments;
    Traffic& traffic = per[p / moments];
    const int64_t need = s.chunk >= 0 && !device.resident(s.chunk) ? 1 : 0;
    int64_t over = device.size() + need - cap[m];
    while (over-- > 0) {
      int64_t victim = -1;
      for (int64_t c : device.chunks()) {
        if (c == s.chunk) continue;
        if (victim < 0 || next_of[c] > next_of[victim] ||
            (next_of[c] == next_of[victim] && c < victim)) {
          victim = c;
        }
      }
      CHECK_GE(victim, 0);
      device.Evict(victim, s.phase, traffic);
    }
    if (s.chunk < 0) continue;
    if (need > 0) device.Load(s.chunk, traffic);
    device.Touch(s.chunk, s.phase);
    next_of[s.chunk] = next_use[p];
  }
  return per;
}

void Run() {
  const std::vector<std::string> presets = {"gpt2", "gpt2-medium", "gpt2-xl", "4B", "12B"};
  const double fractions[] = {0.25, 0.5, 1.0};
  std::printf(
      "Param-chunk traffic per steady-state training iteration (iteration %d of %d; iteration 0 "
      "is the warm-up), in chunks. Batch %lld x seq 1024, activation checkpointing (recompute in "
      "backward), CPU embedding, CPU Adam.\n"
      "budget = peak non-model tide + fraction x all param chunks + one chunk.\n"
      "Each policy: loads (host->accelerator) / write-backs with clean eviction / write-backs "
      "without it (PatrickStar: every eviction) / forward-pass write-backs with / without clean "
      "eviction.\n\n",
      2, kIterations, static_cast<long long>(kBatch));
  std::printf("%-11s %6s %10s %6s %9s %4s | %-21s | %-21s | %-21s | %6s | %s\n", "model", "params",
              "chunk", "chunks", "budget", "frac", "OPT", "LRU", "static", "Belady", "check");
  bool all_ok = true;
  for (const std::string& preset : presets) {
    const Trace t = BuildTrace(preset);
    const int64_t all_chunks_bytes = t.num_chunks * t.chunk_bytes;
    for (double fraction : fractions) {
      const int64_t budget =
          t.peak_tide_bytes + static_cast<int64_t>(fraction * all_chunks_bytes) + t.chunk_bytes;
      const std::vector<int64_t> cap = Capacities(t, budget);
      int64_t min_cap = std::numeric_limits<int64_t>::max();
      for (size_t m = 0; m < cap.size(); ++m) {
        if (t.steps[m].chunk >= 0) min_cap = std::min(min_cap, cap[m]);
      }
      CHECK_GE(min_cap, 1) << preset << ": an operator does not fit";
      OptPolicy opt;
      LruPolicy lru;
      absl::flat_hash_set<int64_t> static_chunks;
      for (int64_t c = 0; c < std::max<int64_t>(0, min_cap - 1); ++c) static_chunks.insert(c);
      StaticPartitionPolicy static_policy(static_chunks);
      const Traffic o = ReplayPolicy(t, cap, opt, kIterations)[2];
      const Traffic l = ReplayPolicy(t, cap, lru, kIterations)[2];
      const Traffic s = ReplayPolicy(t, cap, static_policy, kIterations)[2];
      const Traffic b = ReplayBelady(t, cap, kIterations)[2];
      // OPT that knows the schedule from the start, over all iterations, against Belady.
      OptPolicy oracle;
      AccessSchedule known;
      for (size_t m = 0; m < t.steps.size(); ++m) {
        if (t.steps[m].chunk >= 0) PS_CHECK_OK(known.Record(t.steps[m].chunk, m));
      }
      PS_CHECK_OK(known.Finish(t.steps.size()));
      oracle.SetSchedule(&known);
      Traffic oracle_total, belady_total;
      for (const Traffic& x : ReplayPolicy(t, cap, oracle, kIterations)) oracle_total += x;
      for (const Traffic& x : ReplayBelady(t, cap, kIterations)) belady_total += x;
      const bool ok = o.loads == b.loads && oracle_total.loads == belady_total.loads &&
                      o.forward_write_backs == 0;
      all_ok &= ok;
      auto cell = [](const Traffic& x) {
        return absl::StrFormat("%d/%d/%d/%d/%d", x.loads, x.write_backs, x.evictions,
                               x.forward_write_backs, x.forward_evictions);
      };
      std::printf("%-11s %5.2fB %10s %6lld %9s %4.2f | %-21s | %-21s | %-21s | %6lld | %s\n",
                  preset.c_str(), t.params / 1e9, FormatBytes(t.chunk_bytes).c_str(),
                  static_cast<long long>(t.num_chunks), FormatBytes(budget).c_str(), fraction,
                  cell(o).c_str(), cell(l).c_str(), cell(s).c_str(),
                  static_cast<long long>(b.loads), ok ? "OPT=min, fwd wb 0" : "MISMATCH");
    }
  }
  std::printf("\n%s\n", all_ok ? "All checks passed: OPT loads exactly Belady's minimum and clean "
                                 "eviction leaves the forward pass without write-backs."
                               : "CHECK FAILED");
  std::fflush(stdout);
  CHECK(all_ok);
}

}  // namespace
}  // namespace ps

int main(int argc, char** argv) {
  google::InitGoogleLogging(argv[0]);
  ps::Run();
  return 0;
}
