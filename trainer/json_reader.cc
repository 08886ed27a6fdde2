#include "trainer/json_reader.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/units.h"
#include "glog/logging.h"

namespace ps {
namespace {

// Runs nlohmann's SAX parser over the text before the DOM parse: the SAX interface reports the
// byte position of a syntax error without exceptions, and sees every key, so a key written twice
// (which the DOM would silently collapse to the last value) is caught.
class SyntaxChecker final : public nlohmann::json_sax<Json> {
 public:
  explicit SyntaxChecker(int max_depth, absl::string_view depth_hint)
      : max_depth_(max_depth), depth_hint_(depth_hint) {}

  bool null() override { return Value(); }
  bool boolean(bool) override { return Value(); }
  bool number_integer(number_integer_t) override { return Value(); }
  bool number_unsigned(number_unsigned_t) override { return Value(); }
  bool number_float(number_float_t, const string_t&) override { return Value(); }
  bool string(string_t&) override { return Value(); }
  bool binary(binary_t&) override { return Value(); }
  bool start_object(std::size_t) override { return Open(/*is_object=*/true); }
  bool end_object() override { return Close(); }
  bool start_array(std::size_t) override { return Open(/*is_object=*/false); }
  bool end_array() override { return Close(); }
  bool key(string_t& key) override {
    Frame& f = frames_.back();
    if (std::find(f.keys.begin(), f.keys.end(), key) != f.keys.end()) {
      error_ = absl::StrCat("key `", JsonReader::JoinKeyPath(Path(), key),
                            "` appears more than once in its object; keep one");
      return false;
    }
    f.keys.push_back(key);
    f.current = key;
    return true;
  }
  bool parse_error(std::size_t position, const std::string& /*last_token*/,
                   const nlohmann::detail::exception& ex) override {
    syntax_error_position_ = position;
    syntax_error_ = ex.what();
    return false;
  }

  // Set after a failed parse: either a structural error (duplicate key, depth) or a syntax one.
  const std::string& error() const { return error_; }
  std::optional<size_t> syntax_error_position() const { return syntax_error_position_; }
  const std::string& syntax_error() const { return syntax_error_; }

 private:
  struct Frame {
    bool is_object = true;
    std::vector<std::string> keys;
    std::string current;  // the key (objects) or "[index]" (arrays) of the value being read
    int64_t next_index = 0;
  };

  bool Value() {
    if (!frames_.empty() && !frames_.back().is_object) {
      frames_.back().current = absl::StrCat("[", frames_.back().next_index++, "]");
    }
    return true;
  }
  bool Open(bool is_object) {
    Value();
    if (static_cast<int>(frames_.size()) >= max_depth_) {
      error_ = absl::StrCat("the JSON nests deeper than ", max_depth_, " levels", depth_hint_);
      return false;
    }
    frames_.push_back(Frame{is_object, {}, "", 0});
    return true;
  }
  bool Close() {
    frames_.pop_back();
    return true;
  }
  // Path of the object being filled: the enclosing frames' current keys.
  std::string Path() const {
    std::string path;
    for (size_t i = 0; i + 1 < frames_.size(); ++i) {
      const std::string& part = frames_[i].current;
      if (!path.empty() && !absl::StartsWith(part, "[")) path += ".";
      path += part;
    }
    return path;
  }

  const int max_depth_;
  const std::string depth_hint_;
  std::vector<Frame> frames_;
  std::string error_;
  std::optional<size_t> syntax_error_position_;
  std::string syntax_error_;
};

// "source:line:col: JSON syntax error: <what>; the line reads: <line>".
absl::Status SyntaxError(absl::string_view text, absl::string_view source, size_t position,
                         absl::string_view what) {
  // nlohmann's position counts the bytes read, the offending one included.
  const size_t offset = std::min(text.size(), position > 0 ? position - 1 : 0);
  const size_t line_start = text.rfind('\n', offset == 0 ? absl::string_view::npos : offset - 1);
  const size_t begin = (line_start == absl::string_view::npos || offset == 0) ? 0 : line_start + 1;
  int64_t line = 1;
  for (size_t i = 0; i < begin; ++i) line += text[i] == '\n';
  int64_t column = 1;  // in characters: UTF-8 continuation bytes do not count
  for (size_t i = begin; i < offset; ++i) {
    column += (static_cast<unsigned char>(text[i]) & 0xC0) != 0x80;
  }
  size_t end = text.find('\n', begin);
  if (end == absl::string_view::npos) end = text.size();
  absl::string_view line_text = text.substr(begin, std::min<size_t>(end - begin, 100));
  // Drop nlohmann's "[json.exception.parse_error.101] parse error at line 2, column 8: ".
  std::string message(what);
  if (const size_t bracket = message.find("] "); bracket != std::string::npos) {
    message = message.substr(bracket + 2);
  }
  if (absl::StartsWith(message, "parse error")) {
    if (const size_t colon = message.find(": "); colon != std::string::npos) {
      message = message.substr(colon + 2);
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(source, ":", line, ":", column,
                                                 ": JSON syntax error: ", message,
                                                 "; the line reads: ", QuoteForMessage(line_text)));
}

}  // namespace

absl::Status CheckJsonSyntax(absl::string_view text, absl::string_view source, int max_depth,
                             absl::string_view depth_hint) {
  SyntaxChecker checker(max_depth, depth_hint);
  // nlohmann/json throws; the SAX interface reports errors through parse_error instead, but no
  // exception may leave this function.
  try {
    if (Json::sax_parse(text.begin(), text.end(), &checker)) return absl::OkStatus();
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": cannot parse the JSON: ", e.what()));
  }
  if (!checker.error().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", checker.error()));
  }
  return SyntaxError(text, source, checker.syntax_error_position().value_or(0),
                     checker.syntax_error());
}

// --- Message helpers -------------------------------------------------------------------------

std::string JsonReader::JoinKeyPath(absl::string_view path, absl::string_view key) {
  return path.empty() ? std::string(key) : absl::StrCat(path, ".", key);
}

std::string FormatShortestDouble(double v) {
  for (int precision = 6; precision <= 17; ++precision) {
    std::string s = absl::StrFormat("%.*g", precision, v);
    if (std::strtod(s.c_str(), nullptr) == v) return s;
  }
  return absl::StrFormat("%.17g", v);
}

std::string QuoteForMessage(absl::string_view s) {
  constexpr size_t kMax = 60;
  std::string cut(s.substr(0, kMax));
  std::string quoted = Json(cut).dump(-1, ' ', false, Json::error_handler_t::replace);
  if (s.size() > kMax) quoted.insert(quoted.size() - 1, "...");
  return quoted;
}

std::string DescribeJson(const Json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return v.get<bool>() ? "boolean true" : "boolean false";
  if (v.is_number_unsigned()) return absl::StrCat("integer ", v.get<uint64_t>());
  if (v.is_number_integer()) return absl::StrCat("integer ", v.get<int64_t>());
  if (v.is_number_float()) return absl::StrCat("number ", FormatShortestDouble(v.get<double>()));
  if (v.is_string())
    return absl::StrCat("string ", QuoteForMessage(v.get_ref<const std::string&>()));
  if (v.is_array()) return absl::StrCat("array of ", v.size(), " element(s)");
  if (v.is_object()) return "object";
  return "binary";
}

int KeyEditDistance(absl::string_view a_in, absl::string_view b_in) {
  const std::string a = absl::AsciiStrToLower(a_in);
  const std::string b = absl::AsciiStrToLower(b_in);
  const size_t n = a.size(), m = b.size();
  std::vector<std::vector<int>> d(n + 1, std::vector<int>(m + 1, 0));
  for (size_t i = 0; i <= n; ++i) d[i][0] = static_cast<int>(i);
  for (size_t j = 0; j <= m; ++j) d[0][j] = static_cast<int>(j);
  for (size_t i = 1; i <= n; ++i) {
    for (size_t j = 1; j <= m; ++j) {
      const int cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[n][m];
}

std::string SuggestKey(absl::string_view key, const JsonSection& section) {
  for (const JsonKeyAlias& alias : section.aliases) {
    if (absl::EqualsIgnoreCase(alias.wrong, key)) return std::string(alias.right);
  }
  // Keys longer than any valid one are not typos of it; cap the work.
  if (key.size() > 64) return "";
  const int max_distance = key.size() <= 4 ? 1 : key.size() <= 8 ? 2 : 3;
  int best = max_distance + 1;
  std::string best_key;
  for (absl::string_view valid : section.keys) {
    const int d = KeyEditDistance(key, valid);
    if (d < best) {
      best = d;
      best_key = std::string(valid);
    }
  }
  return best_key;
}

// --- JsonReader ------------------------------------------------------------------------------

absl::Status JsonReader::Error(absl::string_view message) const {
  return absl::InvalidArgumentError(absl::StrCat(source_, ": ", message));
}

absl::Status JsonReader::TypeError(absl::string_view path, absl::string_view expected,
                                   const Json& found) const {
  return Error(absl::StrCat("`", path, "` must be ", expected, ", found ", DescribeJson(found)));
}

absl::Status JsonReader::ValueError(absl::string_view path, const Json& value,
                                    absl::string_view rule) const {
  return Error(absl::StrCat("`", path, "` = ", DescribeJson(value), ": ", rule));
}

absl::Status JsonReader::CheckKeys(const Json& obj, const JsonSection& section) const {
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    const std::string& key = it.key();
    if (std::find(section.keys.begin(), section.keys.end(), key) != section.keys.end()) {
      continue;
    }
    const auto ignored = std::find_if(section.ignored.begin(), section.ignored.end(),
                                      [&key](const JsonIgnoredKey& k) { return k.key == key; });
    if (ignored != section.ignored.end()) {
      LOG(WARNING) << source_ << ": ignoring key `" << JoinKeyPath(section.path, key)
                   << "`: " << ignored->why;
      if (ignored_ != nullptr) ignored_->push_back(key);
      continue;
    }
    const std::string shown = key.size() > 80 ? absl::StrCat(key.substr(0, 80), "...") : key;
    std::string message = absl::StrCat("unknown key `", JoinKeyPath(section.path, shown), "`");
    const std::string suggestion = SuggestKey(key, section);
    if (!suggestion.empty()) absl::StrAppend(&message, "; did you mean `", suggestion, "`?");
    absl::StrAppend(&message, " (valid keys ",
                    section.path.empty() ? std::string("at the top level")
                                         : absl::StrCat("in `", section.path, "`"),
                    ": ", absl::StrJoin(section.keys, ", "), ")");
    return Error(message);
  }
  return absl::OkStatus();
}

const Json* JsonReader::Find(const Json& obj, absl::string_view key) {
  auto it = obj.find(std::string(key));
  return it == obj.end() ? nullptr : &*it;
}

absl::StatusOr<const Json*> JsonReader::GetSection(const Json& parent, const JsonSection& section,
                                                   absl::string_view key) const {
  const Json* v = Find(parent, key);
  if (v == nullptr) return nullptr;
  if (!v->is_object()) return TypeError(section.path, "an object", *v);
  RETURN_IF_ERROR(CheckKeys(*v, section));
  return v;
}

absl::Status JsonReader::GetBool(const Json& obj, absl::string_view path, absl::string_view key,
                                 bool* out) const {
  const Json* v = Find(obj, key);
  if (v == nullptr) return absl::OkStatus();
  if (!v->is_boolean()) return TypeError(JoinKeyPath(path, key), "a boolean (true or false)", *v);
  *out = v->get<bool>();
  return absl::OkStatus();
}

absl::Status JsonReader::GetString(const Json& obj, absl::string_view path, absl::string_view key,
                                   std::string* out) const {
  const Json* v = Find(obj, key);
  if (v == nullptr) return absl::OkStatus();
  if (!v->is_string()) return TypeError(JoinKeyPath(path, key), "a string", *v);
  if (v->get_ref<const std::string&>().empty()) {
    return ValueError(JoinKeyPath(path, key), *v,
                      "an empty string is not a value: give one, or leave the key out for its "
                      "default");
  }
  *out = v->get<std::string>();
  return absl::OkStatus();
}

absl::Status JsonReader::GetDouble(const Json& obj, absl::string_view path, absl::string_view key,
                                   double* out) const {
  const Json* v = Find(obj, key);
  if (v == nullptr) return absl::OkStatus();
  if (!v->is_number()) return TypeError(JoinKeyPath(path, key), "a number", *v);
  *out = v->get<double>();
  return absl::OkStatus();
}

absl::StatusOr<int64_t> JsonReader::ToInt64(const Json& v, absl::string_view path, int64_t lo,
                                            int64_t hi) const {
  std::optional<int64_t> value;
  if (v.is_number_unsigned()) {
    if (v.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      value = static_cast<int64_t>(v.get<uint64_t>());
    }
  } else if (v.is_number_integer()) {
    value = v.get<int64_t>();
  } else if (v.is_number_float()) {
    const double d = v.get<double>();
    if (d != std::floor(d)) return TypeError(path, "an integer", v);
    if (d >= -9.2e18 && d <= 9.2e18) value = static_cast<int64_t>(d);
  } else {
    return TypeError(path, "an integer", v);
  }
  if (!value.has_value() || *value < lo || *value > hi) {
    return ValueError(path, v, absl::StrCat("out of range; must be in [", lo, ", ", hi, "]"));
  }
  return *value;
}

absl::Status JsonReader::GetUint64(const Json& obj, absl::string_view path, absl::string_view key,
                                   uint64_t* out) const {
  const Json* v = Find(obj, key);
  if (v == nullptr) return absl::OkStatus();
  const std::string full = JoinKeyPath(path, key);
  if (v->is_number_unsigned()) {
    *out = v->get<uint64_t>();
  } else if (v->is_number_integer()) {  // signed: negative
    return ValueError(full, *v, "must be >= 0 (an unsigned 64-bit integer)");
  } else if (v->is_number_float()) {
    const double d = v->get<double>();
    if (d != std::floor(d)) return TypeError(full, "an unsigned integer", *v);
    if (d < 0 || d >= 18446744073709551616.0) {
      return ValueError(full, *v, "out of range; must be in [0, 2^64)");
    }
    *out = static_cast<uint64_t>(d);
  } else {
    return TypeError(full, "an unsigned integer", *v);
  }
  return absl::OkStatus();
}

absl::Status JsonReader::GetBytes(const Json& obj, absl::string_view path, absl::string_view key,
                                  int64_t* out) const {
  const Json* v = Find(obj, key);
  if (v == nullptr) return absl::OkStatus();
  const std::string full = JoinKeyPath(path, key);
  if (v->is_string()) {
    absl::StatusOr<int64_t> bytes = ParseBytes(v->get_ref<const std::string&>());
    if (!bytes.ok()) {
      return ValueError(full, *v,
                        absl::StrCat(bytes.status().message(),
                                     "; write e.g. \"64MiB\", \"1.5GB\" or an integer"));
    }
    *out = *bytes;
    return absl::OkStatus();
  }
  if (!v->is_number()) {
    return TypeError(full, "a byte quantity (a string like \"64MiB\" or an integer)", *v);
  }
  ASSIGN_OR_RETURN(*out, ToInt64(*v, full, 0, std::numeric_limits<int64_t>::max()));
  return absl::OkStatus();
}

}  // namespace ps
