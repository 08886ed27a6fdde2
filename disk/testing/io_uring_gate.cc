#include "disk/testing/io_uring_gate.h"

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "disk/io_engine.h"
#include "glog/logging.h"

namespace ps {

std::string IoUringRefusal() {
  // The auto engine tries a ring and, refused, says why: "threads (io_uring refused: <reason>)".
  absl::StatusOr<OpenedIoEngine> opened =
      OpenIoEngine(IoEngineOptions{.kind = IoEngineKind::kAuto});
  CHECK(opened.ok()) << opened.status();
  absl::string_view description = opened->description;
  if (description == "io_uring") return "";
  CHECK(absl::ConsumePrefix(&description, "threads (io_uring refused: ") &&
        absl::ConsumeSuffix(&description, ")"))
      << "unexpected engine description: " << opened->description;
  return std::string(description);
}

std::string ExpectedAutoEngine() {
  const std::string refusal = IoUringRefusal();
  return refusal.empty() ? "io_uring" : absl::StrCat("threads (io_uring refused: ", refusal, ")");
}

}  // namespace ps
