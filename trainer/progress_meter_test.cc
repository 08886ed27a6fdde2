#include "trainer/progress_meter.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "base/testing/fake_clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ps {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

constexpr int64_t kSecond = 1'000'000'000;

ProgressMeterOptions Options(const FakeClock& fake, bool terminal) {
  ProgressMeterOptions o;
  o.is_terminal = terminal;
  o.clock = fake.clock();
  return o;
}

std::vector<std::string> Lines(const std::string& text) {
  return absl::StrSplit(text, '\n', absl::SkipEmpty());
}

TEST(FormatDurationTest, PicksTheUnitAPersonReads) {
  EXPECT_EQ(FormatDuration(0), "0 ms");
  EXPECT_EQ(FormatDuration(-3), "0 ms");
  EXPECT_EQ(FormatDuration(std::numeric_limits<double>::quiet_NaN()), "0 ms");
  EXPECT_EQ(FormatDuration(0.0004), "0 ms");
  EXPECT_EQ(FormatDuration(0.044), "44 ms");
  EXPECT_EQ(FormatDuration(0.9994), "999 ms");
  EXPECT_EQ(FormatDuration(0.9996), "1.0 s");
  EXPECT_EQ(FormatDuration(1.44), "1.4 s");
  EXPECT_EQ(FormatDuration(9.94), "9.9 s");
  EXPECT_EQ(FormatDuration(12.4), "12 s");
  EXPECT_EQ(FormatDuration(185), "3m 05s");
  EXPECT_EQ(FormatDuration(3599.4), "59m 59s");
  EXPECT_EQ(FormatDuration(7260), "2h 01m");
  EXPECT_EQ(FormatDuration(std::numeric_limits<double>::infinity()), "> 99 days");
  EXPECT_EQ(FormatDuration(1e30), "> 99 days");
}

TEST(FormatCountTest, SiSuffixes) {
  EXPECT_EQ(FormatCount(0), "0");
  EXPECT_EQ(FormatCount(-5), "0");
  EXPECT_EQ(FormatCount(999), "999");
  EXPECT_EQ(FormatCount(12345), "12.3k");
  EXPECT_EQ(FormatCount(540e6), "540.0M");
  EXPECT_EQ(FormatCount(1.236e9), "1.24B");
  EXPECT_EQ(FormatCount(static_cast<double>(std::numeric_limits<int64_t>::max())), "9223372.04T");
  EXPECT_EQ(FormatCount(std::numeric_limits<double>::infinity()), "?");
}

TEST(EstimateSecondsLeftTest, ConstantRateArithmetic) {
  // 25% in 10 s: 30 s to go.
  EXPECT_DOUBLE_EQ(*EstimateSecondsLeft(25, 100, 10), 30);
  EXPECT_DOUBLE_EQ(*EstimateSecondsLeft(100, 100, 10), 0);
  EXPECT_DOUBLE_EQ(*EstimateSecondsLeft(150, 100, 10), 0);
  EXPECT_EQ(EstimateSecondsLeft(0, 100, 10), std::nullopt);
  EXPECT_EQ(EstimateSecondsLeft(10, 0, 10), std::nullopt);
  EXPECT_EQ(EstimateSecondsLeft(10, 100, 0), std::nullopt);
  EXPECT_EQ(EstimateSecondsLeft(10, std::numeric_limits<double>::infinity(), 1), std::nullopt);
  // Huge totals stay finite (no int64 overflow in the caller: doubles throughout).
  const double big = static_cast<double>(std::numeric_limits<int64_t>::max());
  EXPECT_NEAR(*EstimateSecondsLeft(big / 4, big, 1), 3, 1e-9);
  // Random rates: done/elapsed * left == total - done.
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> u(1e-3, 1e12);
  for (int i = 0; i < 1000; ++i) {
    const double total = u(rng), done = std::min(total, u(rng)), elapsed = u(rng) * 1e-6;
    const double left = *EstimateSecondsLeft(done, total, elapsed);
    EXPECT_NEAR(left * done / elapsed, total - done, 1e-9 * total);
  }
}

TEST(FormatTokensPerSecondTest, SlowStepsNeverReadZero) {
  EXPECT_EQ(FormatTokensPerSecond(8319.4), "   8319");
  EXPECT_EQ(FormatTokensPerSecond(99.6), "    100");
  EXPECT_EQ(FormatTokensPerSecond(23.27), "   23.3");
  EXPECT_EQ(FormatTokensPerSecond(2.5), "   2.50");
  EXPECT_EQ(FormatTokensPerSecond(0.25), "   0.25");
  EXPECT_EQ(FormatTokensPerSecond(0.00312), "0.00312");
  EXPECT_EQ(FormatTokensPerSecond(0), "      0");
  EXPECT_EQ(FormatTokensPerSecond(-1), "      0");
  EXPECT_EQ(FormatTokensPerSecond(std::numeric_limits<double>::quiet_NaN()), "      0");
  // Any positive rate shows a non-zero digit.
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<double> exponent(-6, 7);
  for (int i = 0; i < 1000; ++i) {
    const double rate = std::pow(10.0, exponent(rng));
    const std::string s = FormatTokensPerSecond(rate);
    EXPECT_GE(s.size(), 7u) << rate;
    EXPECT_TRUE(s.find_first_of("123456789") != std::string::npos) << rate << " -> " << s;
  }
}

// Plain output (a log): a short phase is one line, begin and end.
TEST(ProgressMeterTest, PlainShortPhaseIsOneLine) {
  FakeClock fake(0);
  std::ostringstream out;
  ProgressMeter meter(&out, Options(fake, /*terminal=*/false));
  meter.Begin("initializing 1.24B parameters from seed 42", ProgressUnit::kElements);
  // The begin is written at once (flushed), before any progress.
  EXPECT_EQ(out.str(), "initializing 1.24B parameters from seed 42 ...");
  ProgressFn fn = meter.Fn();
  for (int i = 1; i <= 100; ++i) {
    fake.Advance(kSecond / 20);
    fn(i * 10, 1000);
  }
  EXPECT_DOUBLE_EQ(meter.End(), 5.0);
  EXPECT_EQ(out.str(),
            "initializing 1.24B parameters from seed 42 ... done in 5.0 s (1.0k elements, 200 "
            "elements/s)\n");
  EXPECT_THAT(out.str(), Not(HasSubstr("\r")));
  EXPECT_FALSE(meter.running());
}

// Plain output: at most one progress line per 10 s per phase, plus the end line.
TEST(ProgressMeterTest, PlainLinesAreRateLimited) {
  FakeClock fake(123 * kSecond);
  std::ostringstream out;
  ProgressMeter meter(&out, Options(fake, /*terminal=*/false));
  meter.Begin("loading /models/x (13.50 GiB)", ProgressUnit::kBytes);
  const int64_t total = 1000;
  // 1000 reports 0.1 s apart: 100 s.
  for (int i = 1; i <= 1000; ++i) {
    fake.Advance(kSecond / 10);
    meter.Update(i, total);
  }
  meter.End();
  const std::vector<std::string> lines = Lines(out.str());
  // The begin line, one line per 10 s (at 10, 20, ..., 100 s), the end line.
  ASSERT_EQ(lines.size(), 1u + 10u + 1u) << out.str();
  EXPECT_EQ(lines[0], "loading /models/x (13.50 GiB) ...");
  EXPECT_EQ(lines[1],
            "loading /models/x (13.50 GiB) ...  10% (100 B of 1000 B), 10 B/s, 1m 30s left");
  EXPECT_THAT(lines[5], StartsWith("loading /models/x (13.50 GiB) ...  50% (500 B of 1000 B)"));
  EXPECT_THAT(lines[5], HasSubstr("50 s left"));
  EXPECT_EQ(lines.back(), "loading /models/x (13.50 GiB) ... done in 1m 40s (1000 B, 10 B/s)");
  EXPECT_THAT(out.str(), Not(HasSubstr("\r")));
}

// A terminal: the line rewrites itself ("\r" + clear to the end of line), rate-limited to the
// terminal interval, and ends as one plain line.
TEST(ProgressMeterTest, TerminalRewritesOneLine) {
  FakeClock fake(0);
  std::ostringstream out;
  ProgressMeterOptions o = Options(fake, /*terminal=*/true);
  o.terminal_interval_ns = kSecond;
  ProgressMeter meter(&out, o);
  meter.Begin("quantizing", ProgressUnit::kElements);
  EXPECT_EQ(out.str(), "quantizing ...");
  fake.Advance(kSecond / 2);
  meter.Update(100, 400);  // too soon: not drawn
  EXPECT_EQ(out.str(), "quantizing ...");
  fake.Advance(kSecond / 2);
  meter.Update(200, 400);
  EXPECT_EQ(out.str(),
            "quantizing ...\r\033[Kquantizing ...  50% (200 of 400 elements), 200 "
            "elements/s, 1.0 s left");
  fake.Advance(kSecond);
  meter.Update(400, 400);
  EXPECT_DOUBLE_EQ(meter.End(", 7 weights"), 2.0);
  const std::string s = out.str();
  EXPECT_EQ(s.substr(s.rfind('\r')),
            "\r\033[Kquantizing ... done in 2.0 s (400 elements, 200 elements/s), 7 weights\n");
  // Only the end writes a newline.
  EXPECT_EQ(std::count(s.begin(), s.end(), '\n'), 1);
}

// The steps' status line shows only on a terminal, and is cleared before any other line.
TEST(ProgressMeterTest, StatusLineOnlyOnATerminal) {
  FakeClock fake(0);
  for (const bool terminal : {false, true}) {
    std::ostringstream out;
    {
      ProgressMeter meter(&out, Options(fake, terminal));
      meter.Status("step 3/10 | loss 2.5000 |    1234 tok/s | ETA 12 s");
      meter.Status("step 4/10 | loss 2.4000 |    1234 tok/s | ETA 10 s");
      meter.Print("step     5/10 | loss 2.3000\n");
      meter.Status("step 6/10 | loss 2.2000 |    1234 tok/s | ETA 6.0 s");
    }  // the destructor clears it
    if (!terminal) {
      EXPECT_EQ(out.str(), "step     5/10 | loss 2.3000\n");
    } else {
      EXPECT_EQ(out.str(),
                "\r\033[Kstep 3/10 | loss 2.5000 |    1234 tok/s | ETA 12 s"
                "\r\033[Kstep 4/10 | loss 2.4000 |    1234 tok/s | ETA 10 s"
                "\r\033[Kstep     5/10 | loss 2.3000\n"
                "\r\033[Kstep 6/10 | loss 2.2000 |    1234 tok/s | ETA 6.0 s\r\033[K");
    }
  }
}

// Awkward reports: total 0 (unknown), done beyond the total or negative (clamped), huge numbers.
TEST(ProgressMeterTest, AwkwardReports) {
  FakeClock fake(0);
  std::ostringstream out;
  ProgressMeter meter(&out, Options(fake, /*terminal=*/false));
  meter.Begin("phase", ProgressUnit::kElements);
  fake.Advance(10 * kSecond);
  meter.Update(0, 0);
  fake.Advance(10 * kSecond);
  meter.Update(50, 10);  // done > total: clamped
  fake.Advance(10 * kSecond);
  meter.Update(-5, 10);  // negative: clamped to 0
  fake.Advance(10 * kSecond);
  const int64_t max = std::numeric_limits<int64_t>::max();
  meter.Update(max / 2, max);
  fake.Advance(10 * kSecond);
  meter.Update(max, max);
  meter.End();
  const std::vector<std::string> lines = Lines(out.str());
  ASSERT_EQ(lines.size(), 7u) << out.str();
  EXPECT_EQ(lines[1], "phase ... 10 s so far");
  EXPECT_EQ(lines[2], "phase ... 100% (10 of 10 elements), 0.5 elements/s, 0 ms left");
  EXPECT_EQ(lines[3], "phase ...   0% (0 of 10 elements)");
  EXPECT_THAT(lines[4], StartsWith("phase ...  50% (4611686.02T of 9223372.04T elements)"));
  EXPECT_THAT(lines[4], HasSubstr("40 s left"));
  EXPECT_THAT(lines[6], StartsWith("phase ... done in 50 s (9223372.04T elements"));
  // Bytes at the int64 limit.
  std::ostringstream bytes_out;
  ProgressMeter bytes(&bytes_out, Options(fake, /*terminal=*/false));
  bytes.Begin("b", ProgressUnit::kBytes);
  fake.Advance(10 * kSecond);
  bytes.Update(max, max);
  bytes.End();
  EXPECT_THAT(bytes_out.str(), HasSubstr("100% ("));
  EXPECT_THAT(bytes_out.str(), HasSubstr("PiB"));
}

// No output stream: nothing printed, phases still timed; updates without a phase are ignored.
TEST(ProgressMeterTest, NullStreamStillTimes) {
  FakeClock fake(0);
  ProgressMeter meter(nullptr, Options(fake, /*terminal=*/true));
  meter.Update(1, 2);
  EXPECT_EQ(meter.End(), 0);
  meter.Begin("x");
  fake.Advance(3 * kSecond);
  EXPECT_DOUBLE_EQ(meter.End(), 3.0);
}

// A phase that fails says so; Begin ends a phase still running; Print ends it too.
TEST(ProgressMeterTest, FailAndImplicitEnds) {
  FakeClock fake(0);
  std::ostringstream out;
  ProgressMeter meter(&out, Options(fake, /*terminal=*/false));
  meter.Begin("a");
  fake.Advance(kSecond);
  EXPECT_DOUBLE_EQ(meter.Fail(), 1.0);
  meter.Begin("b");
  meter.Begin("c");
  meter.Print("line\n");
  EXPECT_EQ(out.str(), "a ... failed after 1.0 s\nb ... done in 0 ms\nc ... done in 0 ms\nline\n");
}

// Reports from several threads (a parallel initialization) are safe and the end is one line.
TEST(ProgressMeterTest, ConcurrentUpdates) {
  std::ostringstream out;
  ProgressMeterOptions o;
  o.plain_interval_ns = 0;  // every report prints
  ProgressMeter meter(&out, o);
  meter.Begin("parallel");
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&meter, t] {
      for (int i = 0; i < 200; ++i) meter.Update(t * 200 + i, 800);
    });
  }
  for (std::thread& t : threads) t.join();
  meter.End();
  for (const std::string& line : Lines(out.str())) {
    EXPECT_THAT(line, StartsWith("parallel ...")) << line;
  }
  EXPECT_EQ(Lines(out.str()).size(), 1u + 800u + 1u);
}

}  // namespace
}  // namespace ps
