#include "model/hf_json.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <optional>
#include <string>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/file_io.h"

namespace ps::hf_json {
namespace {

// A SAX pass that finds the first syntax error (with nlohmann's line/column message) and the
// first key repeated within one object (with the path of keys leading to that object).
class CheckingSax : public nlohmann::json_sax<nlohmann::json> {
 public:
  bool null() override { return Value(); }
  bool boolean(bool) override { return Value(); }
  bool number_integer(number_integer_t) override { return Value(); }
  bool number_unsigned(number_unsigned_t) override { return Value(); }
  bool number_float(number_float_t, const string_t&) override { return Value(); }
  bool string(string_t&) override { return Value(); }
  bool binary(binary_t&) override { return Value(); }
  bool start_object(std::size_t) override {
    frames_.push_back(Frame{true, {}, pending_key_});
    pending_key_.clear();
    return true;
  }
  bool key(string_t& k) override {
    Frame& f = frames_.back();
    if (!f.keys.insert(k).second) {
      std::vector<std::string> path;
      for (const Frame& fr : frames_) {
        if (!fr.name.empty()) path.push_back(fr.name);
      }
      duplicate_ = path.empty() ? absl::StrCat("key \"", k, "\" appears twice at the top level")
                                : absl::StrCat("key \"", k, "\" appears twice in \"",
                                               absl::StrJoin(path, "."), "\"");
      return false;
    }
    pending_key_ = k;
    return true;
  }
  bool end_object() override {
    frames_.pop_back();
    return Value();
  }
  bool start_array(std::size_t) override {
    frames_.push_back(Frame{false, {}, pending_key_});
    pending_key_.clear();
    return true;
  }
  bool end_array() override {
    frames_.pop_back();
    return Value();
  }
  bool parse_error(std::size_t, const std::string&,
                   const nlohmann::detail::exception& ex) override {
    std::string message = ex.what();
    // Drop nlohmann's "[json.exception.parse_error.101] " prefix: it means nothing to a user.
    if (const size_t close = message.find("] ");
        message.rfind("[json.exception", 0) == 0 && close != std::string::npos) {
      message = message.substr(close + 2);
    }
    syntax_ = std::move(message);
    return false;
  }

  const std::optional<std::string>& syntax_error() const { return syntax_; }
  const std::optional<std::string>& duplicate() const { return duplicate_; }

 private:
  struct Frame {
    bool is_object;
    absl::flat_hash_set<std::string> keys;
    std::string name;  // the key this container is the value of ("" at the top or in arrays)
  };
  bool Value() {
    pending_key_.clear();
    return true;
  }

  std::vector<Frame> frames_;
  std::string pending_key_;
  std::optional<std::string> syntax_;
  std::optional<std::string> duplicate_;
};

}  // namespace

absl::StatusOr<nlohmann::json> ParseObject(absl::string_view text, absl::string_view what,
                                           absl::string_view path, absl::StatusCode code) {
  auto error = [&](absl::string_view message) {
    return absl::Status(code, absl::StrCat(what, " '", path, "': ", message));
  };
  CheckingSax sax;
  const bool ok = nlohmann::json::sax_parse(text.begin(), text.end(), &sax,
                                            nlohmann::json::input_format_t::json, /*strict=*/true);
  if (sax.duplicate().has_value()) return error(*sax.duplicate());
  if (!ok || sax.syntax_error().has_value()) {
    return error(absl::StrCat("not valid JSON: ", sax.syntax_error().value_or("parse error")));
  }
  nlohmann::json value =
      nlohmann::json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) return error("not valid JSON");
  if (!value.is_object()) {
    return error(absl::StrCat("the top level is ", TypeName(value), ", not a JSON object"));
  }
  return value;
}

absl::StatusOr<std::string> ReadTextFile(const std::string& path, absl::string_view what) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(errno, absl::StrCat("cannot open ", what), path);
  absl::Cleanup close_fd = [fd] { ::close(fd); };
  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoError(errno, absl::StrCat("cannot stat ", what), path);
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(what, " '", path, "' is not a regular file"));
  }
  // Hugging Face's JSON files are kilobytes (an index of a 400B model is well under a megabyte).
  constexpr int64_t kMaxBytes = int64_t{64} << 20;
  if (st.st_size > kMaxBytes) {
    return absl::InvalidArgumentError(absl::StrCat(what, " '", path, "' has ", st.st_size,
                                                   " bytes, more than the ", kMaxBytes,
                                                   " a JSON file of a model directory can have"));
  }
  std::string text;
  text.resize(static_cast<size_t>(st.st_size));
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::read(fd, text.data() + done, text.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, absl::StrCat("cannot read ", what), path);
    }
    if (n == 0) break;  // the file shrank while being read
    done += static_cast<size_t>(n);
  }
  text.resize(done);
  return text;
}

std::string Brief(const nlohmann::json& value) {
  std::string s = value.dump(-1, ' ', /*ensure_ascii=*/true);
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

absl::string_view TypeName(const nlohmann::json& value) {
  switch (value.type()) {
    case nlohmann::json::value_t::null:
      return "null";
    case nlohmann::json::value_t::boolean:
      return "a boolean";
    case nlohmann::json::value_t::string:
      return "a string";
    case nlohmann::json::value_t::number_integer:
    case nlohmann::json::value_t::number_unsigned:
      return "an integer";
    case nlohmann::json::value_t::number_float:
      return "a number";
    case nlohmann::json::value_t::array:
      return "an array";
    case nlohmann::json::value_t::object:
      return "an object";
    default:
      return "an unsupported JSON value";
  }
}

}  // namespace ps::hf_json
