#include "trainer/io/trace_writer.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <fstream>
#include <limits>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace ps {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr int64_t kStartNs = 1'000'000'000'000;

std::string TmpPath(absl::string_view name) {
  return absl::StrCat(::testing::TempDir(), "/trace_writer_test_", name, "_", ::getpid());
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Parses a whole trace with a strict JSON parser; `append_bracket` closes an unclosed array.
nlohmann::json ParseTrace(const std::string& text, bool append_bracket = false) {
  const std::string doc = append_bracket ? text + "]" : text;
  nlohmann::json j = nlohmann::json::parse(doc, nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(j.is_discarded()) << "not valid JSON:\n" << doc;
  EXPECT_TRUE(j.is_array());
  return j;
}

std::vector<nlohmann::json> EventsWithPhase(const nlohmann::json& trace, absl::string_view ph) {
  std::vector<nlohmann::json> out;
  for (const nlohmann::json& e : trace) {
    if (e.value("ph", "") == ph) out.push_back(e);
  }
  return out;
}

// A clock the test moves by hand.
struct FakeClock {
  std::atomic<int64_t> now_ns{kStartNs};
  std::function<int64_t()> Fn() {
    return [this] { return now_ns.load(); };
  }
};

TEST(TraceWriterTest, WritesEveryEventKindAsStrictJson) {
  FakeClock clock;
  TraceWriterOptions options;
  options.process_name = "rank 0";
  options.pid = 3;
  options.clock_ns = clock.Fn();
  const std::string path = TmpPath("kinds");
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<TraceWriter> trace, TraceWriter::Create(path, options));
  const TrackId main = trace->Track("main");
  const TrackId copy = trace->Track("copy h2d");
  EXPECT_EQ(trace->Track("main"), main);
  EXPECT_NE(main, copy);

  trace->Complete(main, "forward", "model", kStartNs + 1234567, 2000500,
                  {{"layer", 3},
                   {"loss", 2.5},
                   {"device", "accelerator:0"},
                   {"ok", true},
                   {"big", std::numeric_limits<uint64_t>::max()},
                   {"neg", int64_t{-7}}});
  trace->Complete(copy, "load", "", kStartNs + 10, -5);  // negative duration -> 0
  trace->Counter("accelerator:0 bytes", kStartNs + 2000,
                 {{"model_data", (int64_t{1} << 40) + 1},
                  {"non_model", 2.5},
                  {"huge", std::numeric_limits<uint64_t>::max()},
                  {"u32", uint32_t{4000000000u}}});
  trace->Instant(copy, "evict", kStartNs + 3000, InstantScope::kProcess, {{"chunk", 17}});
  trace->MarkRegion("warm-up", kStartNs, 5000000);
  EXPECT_OK(trace->Close());
  EXPECT_OK(trace->Close());  // idempotent

  const std::string text = ReadFile(path);
  // Exact microseconds, no float noise.
  EXPECT_THAT(text, HasSubstr("\"ts\":1234.567"));
  EXPECT_THAT(text, HasSubstr("\"dur\":2000.500"));
  const nlohmann::json j = ParseTrace(text);

  const auto meta = EventsWithPhase(j, "M");
  std::map<std::string, int> thread_names;
  std::map<int, int> sort_index;
  bool saw_process_name = false;
  for (const nlohmann::json& e : meta) {
    EXPECT_EQ(e["pid"], 3);
    if (e["name"] == "process_name") {
      saw_process_name = true;
      EXPECT_EQ(e["args"]["name"], "rank 0");
    } else if (e["name"] == "thread_name") {
      thread_names[e["args"]["name"].get<std::string>()] = e["tid"].get<int>();
    } else if (e["name"] == "thread_sort_index") {
      sort_index[e["tid"].get<int>()] = e["args"]["sort_index"].get<int>();
    }
  }
  EXPECT_TRUE(saw_process_name);
  EXPECT_EQ(thread_names["main"], main);
  EXPECT_EQ(thread_names["copy h2d"], copy);
  ASSERT_EQ(thread_names.count("regions"), 1u);
  EXPECT_EQ(sort_index[thread_names["regions"]], -1);  // the regions track sorts first
  EXPECT_EQ(sort_index[main], main);

  const auto complete = EventsWithPhase(j, "X");
  ASSERT_EQ(complete.size(), 3u);
  EXPECT_EQ(complete[0]["name"], "forward");
  EXPECT_EQ(complete[0]["cat"], "model");
  EXPECT_EQ(complete[0]["tid"], main);
  EXPECT_DOUBLE_EQ(complete[0]["ts"].get<double>(), 1234.567);
  EXPECT_DOUBLE_EQ(complete[0]["dur"].get<double>(), 2000.5);
  EXPECT_EQ(complete[0]["args"]["layer"], 3);
  EXPECT_EQ(complete[0]["args"]["loss"], 2.5);
  EXPECT_EQ(complete[0]["args"]["device"], "accelerator:0");
  EXPECT_EQ(complete[0]["args"]["ok"], true);
  EXPECT_EQ(complete[0]["args"]["big"].get<uint64_t>(), std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(complete[0]["args"]["neg"], -7);
  EXPECT_FALSE(complete[1].contains("cat"));
  EXPECT_EQ(complete[1]["dur"].get<double>(), 0.0);
  EXPECT_DOUBLE_EQ(complete[1]["ts"].get<double>(), 0.01);
  EXPECT_EQ(complete[2]["name"], "warm-up");
  EXPECT_EQ(complete[2]["cat"], "region");
  EXPECT_EQ(complete[2]["tid"], thread_names["regions"]);
  EXPECT_DOUBLE_EQ(complete[2]["dur"].get<double>(), 5000.0);

  const auto counters = EventsWithPhase(j, "C");
  ASSERT_EQ(counters.size(), 1u);
  EXPECT_EQ(counters[0]["name"], "accelerator:0 bytes");
  EXPECT_EQ(counters[0]["args"]["model_data"].get<int64_t>(), (int64_t{1} << 40) + 1);
  EXPECT_EQ(counters[0]["args"]["non_model"], 2.5);
  EXPECT_DOUBLE_EQ(counters[0]["args"]["huge"].get<double>(), 18446744073709551616.0);
  EXPECT_EQ(counters[0]["args"]["u32"].get<int64_t>(), 4000000000);
  EXPECT_DOUBLE_EQ(counters[0]["ts"].get<double>(), 2.0);

  const auto instants = EventsWithPhase(j, "i");
  ASSERT_EQ(instants.size(), 3u);
  EXPECT_EQ(instants[0]["name"], "evict");
  EXPECT_EQ(instants[0]["s"], "p");
  EXPECT_EQ(instants[0]["args"]["chunk"], 17);
  EXPECT_EQ(instants[1]["name"], "warm-up begin");
  EXPECT_EQ(instants[1]["s"], "g");
  EXPECT_EQ(instants[2]["name"], "warm-up end");
  EXPECT_DOUBLE_EQ(instants[2]["ts"].get<double>(), 5000.0);
  EXPECT_EQ(trace->events(), static_cast<int64_t>(j.size()));
}

TEST(TraceWriterTest, TimestampsBeforeTheStartAndFarAwayStillParse) {
  FakeClock clock;
  TraceWriterOptions options;
  options.clock_ns = clock.Fn();
  const std::string path = TmpPath("far");
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<TraceWriter> trace, TraceWriter::Create(path, options));
  const TrackId t = trace->Track("t");
  trace->Complete(t, "before", "", kStartNs - 1500, 1);
  trace->Complete(t, "min", "", std::numeric_limits<int64_t>::min(), 1);
  trace->Complete(t, "max", "", std::numeric_limits<int64_t>::max(),
                  std::numeric_limits<int64_t>::max());
  trace->Counter("nan", kStartNs, {{"v", std::numeric_limits<double>::quiet_NaN()}});
  ASSERT_OK(trace->Close());
  const std::string text = ReadFile(path);
  EXPECT_THAT(text, HasSubstr("\"ts\":-1.500"));
  const nlohmann::json j = ParseTrace(text);
  EXPECT_EQ(EventsWithPhase(j, "X").size(), 3u);
  EXPECT_EQ(EventsWithPhase(j, "C")[0]["args"]["v"], "NaN");
}

TEST(TraceWriterTest, ScopedSpanAndRegionUseTheInjectedClock) {
  FakeClock clock;
  TraceWriterOptions options;
  options.clock_ns = clock.Fn();
  const std::string path = TmpPath("scoped");
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<TraceWriter> trace, TraceWriter::Create(path, options));
  const TrackId t = trace->Track("compute");
  {
    ScopedRegion warmup(trace.get(), "warm-up iteration");
    clock.now_ns += 5000;
    {
      ScopedSpan span(trace.get(), t, std::string("forward"), "model", {{"micro_batch", 0}});
      clock.now_ns += 7001;
      span.AddArg({"tokens", 256});
      span.AddArg({"name", std::string("temporary string")});
      span.AddArg({"view", std::string_view("std view")});
    }
    ScopedSpan early(trace.get(), t, "backward");
    clock.now_ns += 3;
    early.End();
    clock.now_ns += 1000;
  }  // `early` ends before the region: End() made its destructor a no-op
  ASSERT_OK(trace->Close());
  const nlohmann::json j = ParseTrace(ReadFile(path));
  const auto complete = EventsWithPhase(j, "X");
  ASSERT_EQ(complete.size(), 3u);
  EXPECT_EQ(complete[0]["name"], "forward");
  EXPECT_DOUBLE_EQ(complete[0]["ts"].get<double>(), 5.0);
  EXPECT_DOUBLE_EQ(complete[0]["dur"].get<double>(), 7.001);
  EXPECT_EQ(complete[0]["args"]["micro_batch"], 0);
  EXPECT_EQ(complete[0]["args"]["tokens"], 256);
  EXPECT_EQ(complete[0]["args"]["name"], "temporary string");
  EXPECT_EQ(complete[0]["args"]["view"], "std view");
  EXPECT_EQ(complete[1]["name"], "backward");
  EXPECT_DOUBLE_EQ(complete[1]["dur"].get<double>(), 0.003);
  EXPECT_FALSE(complete[1].contains("args"));
  EXPECT_EQ(complete[2]["name"], "warm-up iteration");
  EXPECT_DOUBLE_EQ(complete[2]["ts"].get<double>(), 0.0);
  EXPECT_DOUBLE_EQ(complete[2]["dur"].get<double>(), 13.004);
}

TEST(TraceWriterTest, NullAndDisabledWritersDoNothing) {
  {
    ScopedSpan span(nullptr, 1, "x", "y", {{"a", 1}});
    span.AddArg({"b", 2});
    ScopedRegion region(nullptr, "r");
  }
  std::unique_ptr<TraceWriter> trace = TraceWriter::CreateDisabled();
  EXPECT_FALSE(trace->enabled());
  EXPECT_EQ(trace->Track("t"), 0);
  trace->Complete(0, "x", "y", 1, 2, {{"a", 1}});
  trace->Counter("c", 1, {{"v", 1}});
  trace->Instant(0, "i", 1);
  trace->MarkRegion("r", 1, 2);
  { ScopedSpan span(trace.get(), 0, "x"); }
  EXPECT_EQ(trace->events(), 0);
  EXPECT_OK(trace->Flush());
  EXPECT_OK(trace->Close());
}

// Events reach the file every flush_every_events events and every flush_interval_ms, before any
// Flush() or Close(), and the file is then a loadable (unterminated) array.
TEST(TraceWriterTest, StreamsEventsToTheFileBeforeClose) {
  FakeClock clock;
  TraceWriterOptions options;
  options.clock_ns = clock.Fn();
  options.flush_every_events = 10;
  options.flush_interval_ms = 50;
  const std::string path = TmpPath("stream");
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<TraceWriter> trace, TraceWriter::Create(path, options));
  const TrackId t = trace->Track("t");  // 2 metadata events, buffered
  const auto count_in_file = [&] {
    return static_cast<int>(EventsWithPhase(ParseTrace(ReadFile(path), true), "X").size());
  };
  EXPECT_EQ(count_in_file(), 0);
  for (int i = 0; i < 25; ++i) trace->Complete(t, absl::StrCat("e", i), "", kStartNs + i, 1);
  // Flushed at 10 buffered events (2 metadata + 8) and at 20 (18 more): 18 complete events.
  EXPECT_EQ(count_in_file(), 18);
  clock.now_ns += 49'000'000;
  trace->Complete(t, "e25", "", clock.now_ns, 1);
  EXPECT_EQ(count_in_file(), 18);
  clock.now_ns += 1'000'000;  // 50 ms since the last write
  trace->Complete(t, "e26", "", clock.now_ns, 1);
  EXPECT_EQ(count_in_file(), 27);
  trace->Complete(t, "e27", "", clock.now_ns, 1);
  ASSERT_OK(trace->Flush());
  EXPECT_EQ(count_in_file(), 28);
  ASSERT_OK(trace->Close());
  EXPECT_EQ(EventsWithPhase(ParseTrace(ReadFile(path)), "X").size(), 28u);
}

// A process killed after a flush leaves a file that parses once `]` is appended, with every
// flushed event in it.
TEST(TraceWriterTest, KilledProcessLeavesALoadableTrace) {
  const std::string path = TmpPath("killed");
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    TraceWriterOptions options;
    options.flush_every_events = 7;
    auto trace = TraceWriter::Create(path, options);
    if (!trace.ok()) ::_exit(1);
    const TrackId t = (*trace)->Track("t");
    for (int i = 0; i < 100; ++i) (*trace)->Complete(t, "work", "", (*trace)->NowNs(), 10);
    if (!(*trace)->Flush().ok()) ::_exit(2);
    (*trace)->Complete(t, "lost", "", (*trace)->NowNs(), 10);  // buffered, never written
    ::raise(SIGKILL);
    ::_exit(3);
  }
  int wstatus = 0;
  ASSERT_EQ(::waitpid(pid, &wstatus, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(wstatus)) << "child exited with " << WEXITSTATUS(wstatus);
  ASSERT_EQ(WTERMSIG(wstatus), SIGKILL);
  const std::string text = ReadFile(path);
  EXPECT_THAT(text, StartsWith("[\n"));
  EXPECT_NE(text.back(), ']');
  const nlohmann::json j = ParseTrace(text, /*append_bracket=*/true);
  EXPECT_EQ(EventsWithPhase(j, "X").size(), 100u);
}

TEST(TraceWriterTest, ArbitraryBytesInNamesAndArgsStayValidJson) {
  std::mt19937_64 rng(21);
  const std::string path = TmpPath("bytes");
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<TraceWriter> trace, TraceWriter::Create(path));
  std::vector<std::string> names;
  for (int i = 0; i < 300; ++i) {
    std::string s(rng() % 20, '\0');
    for (char& c : s) c = static_cast<char>(rng());
    names.push_back(s);
  }
  names.push_back("quote\" backslash\\ newline\n tab\t nul" + std::string(1, '\0') +
                  " \xC3\xA9\xF0\x9F\x9A\x80");
  for (const std::string& name : names) {
    const TrackId t = trace->Track(name);
    trace->Complete(t, name, name, trace->NowNs(), 1, {{name, name}});
    trace->Counter(name, trace->NowNs(), {{name, 1}});
    trace->Instant(t, name, trace->NowNs(), InstantScope::kThread, {{name, 1.5}});
  }
  ASSERT_OK(trace->Close());
  const nlohmann::json j = ParseTrace(ReadFile(path));
  const auto complete = EventsWithPhase(j, "X");
  ASSERT_EQ(complete.size(), names.size());
  // Well-formed UTF-8 (the last name) round-trips exactly.
  EXPECT_EQ(complete.back()["name"], names.back());
  EXPECT_EQ(complete.back()["args"][names.back()], names.back());
}

TEST(TraceWriterTest, ConcurrentEmittersKeepEveryEventAndPerThreadOrder) {
  const std::string path = TmpPath("concurrent");
  TraceWriterOptions options;
  options.flush_every_events = 7;  // many flushes racing with emitters
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<TraceWriter> trace, TraceWriter::Create(path, options));
  constexpr int kThreads = 4;
  constexpr int kEvents = 1500;
  std::vector<std::thread> threads;
  for (int k = 0; k < kThreads; ++k) {
    threads.emplace_back([&, k] {
      const TrackId t = trace->Track(absl::StrCat("worker ", k));
      for (int i = 0; i < kEvents; ++i) {
        ScopedSpan span(trace.get(), t, "step", "work", {{"i", i}});
        trace->Counter(absl::StrCat("worker ", k, " progress"), trace->NowNs(), {{"i", i}});
        if (i % 100 == 0) (void)trace->Flush();
      }
    });
  }
  for (std::thread& th : threads) th.join();
  ASSERT_OK(trace->Close());
  const nlohmann::json j = ParseTrace(ReadFile(path));
  std::map<int, std::vector<int>> by_tid;
  for (const nlohmann::json& e : EventsWithPhase(j, "X")) {
    by_tid[e["tid"].get<int>()].push_back(e["args"]["i"].get<int>());
  }
  ASSERT_EQ(by_tid.size(), static_cast<size_t>(kThreads));
  for (const auto& [tid, seq] : by_tid) {
    ASSERT_EQ(seq.size(), static_cast<size_t>(kEvents)) << tid;
    for (int i = 0; i < kEvents; ++i) ASSERT_EQ(seq[i], i) << tid;
  }
  EXPECT_EQ(EventsWithPhase(j, "C").size(), static_cast<size_t>(kThreads * kEvents));
}

TEST(TraceWriterTest, CreateErrorsNameThePath) {
  EXPECT_THAT(TraceWriter::Create("/nonexistent-dir-for-trace-test/trace.json"),
              StatusIs(absl::StatusCode::kNotFound, "/nonexistent-dir-for-trace-test/trace.json"));
  // /dev/full accepts open() and fails every write with ENOSPC: Create reports it at once.
  EXPECT_THAT(TraceWriter::Create("/dev/full"),
              StatusIs(absl::StatusCode::kResourceExhausted, "/dev/full"));
  TraceWriterOptions bad;
  bad.flush_every_events = 0;
  EXPECT_THAT(TraceWriter::Create(TmpPath("bad"), bad),
              StatusIs(absl::StatusCode::kInvalidArgument, "flush_every_events"));
  bad = TraceWriterOptions();
  bad.flush_interval_ms = -1;
  EXPECT_THAT(TraceWriter::Create(TmpPath("bad"), bad),
              StatusIs(absl::StatusCode::kInvalidArgument, "flush_interval_ms"));
}

// A write error after creation (here: the reader of a pipe goes away) is remembered: Flush() and
// Close() report the first error, later events are dropped.
TEST(TraceWriterTest, RemembersTheFirstWriteError) {
  struct sigaction ignore = {};
  ignore.sa_handler = SIG_IGN;
  struct sigaction old = {};
  ASSERT_EQ(::sigaction(SIGPIPE, &ignore, &old), 0);
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const std::string path = absl::StrCat("/proc/self/fd/", fds[1]);
  TraceWriterOptions options;
  options.flush_every_events = 1'000'000;
  options.flush_interval_ms = 1'000'000;
  auto created = TraceWriter::Create(path, options);
  ASSERT_OK(created.status());
  std::unique_ptr<TraceWriter> trace = std::move(created).value();
  ::close(fds[0]);
  const TrackId t = trace->Track("t");
  trace->Complete(t, "x", "", trace->NowNs(), 1);
  const absl::Status first = trace->Flush();
  EXPECT_FALSE(first.ok());
  EXPECT_THAT(first, StatusIs(first.code(), HasSubstr(path)));
  const int64_t events = trace->events();
  trace->Complete(t, "dropped", "", trace->NowNs(), 1);
  EXPECT_EQ(trace->events(), events);
  EXPECT_EQ(trace->Flush(), first);
  EXPECT_EQ(trace->Close(), first);
  EXPECT_EQ(trace->Close(), first);
  ::close(fds[1]);
  ASSERT_EQ(::sigaction(SIGPIPE, &old, nullptr), 0);
}

}  // namespace
}  // namespace ps
