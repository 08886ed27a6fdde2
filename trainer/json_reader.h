// JsonReader: reads typed values out of a JSON document that a person wrote, with errors a person
// can act on — every message names the source (a file name), the key path and the value found,
// and says what is allowed. Generic: it knows JSON and key tables (JsonSection), not any config.
//
//  - CheckJsonSyntax runs before the DOM parse: the syntax error's 1-based line and column (the
//    column counted in characters, not bytes) with the offending line quoted, a key written twice
//    in one object (which a DOM would silently collapse to the last value), and nesting deeper
//    than a limit (without recursion).
//  - JsonReader::CheckKeys refuses keys its JsonSection does not list, suggesting the nearest
//    valid key ("did you mean `betas`?": a known alias, else a small case-insensitive
//    Damerau-Levenshtein distance) and listing the valid ones; keys the section marks as ignored
//    are reported (LOG(WARNING) and a list) and skipped.
//  - The getters leave the output untouched when the key is absent and refuse a wrong JSON type
//    (naming the expected and the found type) or an out-of-range integer. Integers written as
//    whole floats (1e3) are accepted, as JSON does not tell them apart.
//
// Thread safety: JsonReader is immutable after construction (its const methods may LOG).
#ifndef PATRICKSTAR_TRAINER_JSON_READER_H_
#define PATRICKSTAR_TRAINER_JSON_READER_H_

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "base/status_macros.h"
#include "nlohmann/json.hpp"

namespace ps {

using Json = nlohmann::json;

// A key people commonly write for a valid one (`right`), suggested whatever its edit distance.
struct JsonKeyAlias {
  absl::string_view wrong;
  absl::string_view right;
};

// A key accepted and skipped, with the reason given in the warning.
struct JsonIgnoredKey {
  absl::string_view key;
  absl::string_view why;
};

// The keys one JSON object may have.
struct JsonSection {
  // Key path of the object: "" for the top level, "optimizer.params" for a nested one.
  absl::string_view path;
  absl::Span<const absl::string_view> keys;
  absl::Span<const JsonKeyAlias> aliases = {};
  absl::Span<const JsonIgnoredKey> ignored = {};
};

// OK if `text` is one JSON value with no key repeated in an object and nesting at most `max_depth`
// levels. InvalidArgument otherwise: "source:line:col: JSON syntax error: <reason>; the line reads:
// <line>" for syntax; "source: key `a.b` appears more than once in its object; keep one";
// "source: the JSON nests deeper than N levels<depth_hint>".
[[nodiscard]] absl::Status CheckJsonSyntax(absl::string_view text, absl::string_view source,
                                           int max_depth, absl::string_view depth_hint = "");

class JsonReader {
 public:
  // Ignored keys found by CheckKeys are appended to `ignored` when it is non-null (not owned;
  // must outlive the reader).
  JsonReader(absl::string_view source, std::vector<std::string>* ignored = nullptr)
      : source_(source), ignored_(ignored) {}

  const std::string& source() const { return source_; }

  // InvalidArgument "source: <message>".
  absl::Status Error(absl::string_view message) const;
  // "source: `path` must be <expected>, found <Describe(found)>".
  absl::Status TypeError(absl::string_view path, absl::string_view expected,
                         const Json& found) const;
  // "source: `path` = <Describe(value)>: <rule>".
  absl::Status ValueError(absl::string_view path, const Json& value, absl::string_view rule) const;

  // See the file comment.
  [[nodiscard]] absl::Status CheckKeys(const Json& obj, const JsonSection& section) const;

  // The member `key` of `obj`, or null when absent. REQUIRES: obj.is_object().
  static const Json* Find(const Json& obj, absl::string_view key);

  // The object `parent[key]` checked against `section`: null when absent; InvalidArgument unless
  // an object with valid keys.
  absl::StatusOr<const Json*> GetSection(const Json& parent, const JsonSection& section,
                                         absl::string_view key) const;

  // Each reads `obj[key]` (its path is JoinKeyPath(path, key)) into `out` when present.
  // GetString refuses "" (InvalidArgument naming the key): every string key of the config names a
  // path or a value, and an empty one is a mistake (a template's unset variable), never "not
  // given" — leaving the key out is.
  [[nodiscard]] absl::Status GetBool(const Json& obj, absl::string_view path, absl::string_view key,
                                     bool* out) const;
  [[nodiscard]] absl::Status GetString(const Json& obj, absl::string_view path,
                                       absl::string_view key, std::string* out) const;
  [[nodiscard]] absl::Status GetDouble(const Json& obj, absl::string_view path,
                                       absl::string_view key, double* out) const;
  [[nodiscard]] absl::Status GetUint64(const Json& obj, absl::string_view path,
                                       absl::string_view key, uint64_t* out) const;
  // A byte quantity: "64MiB" (base/units.h ParseBytes) or a whole number of bytes >= 0.
  [[nodiscard]] absl::Status GetBytes(const Json& obj, absl::string_view path,
                                      absl::string_view key, int64_t* out) const;
  // An integer of type Int (its whole range).
  template <typename Int>
  [[nodiscard]] absl::Status GetInt(const Json& obj, absl::string_view path, absl::string_view key,
                                    Int* out) const {
    const Json* v = Find(obj, key);
    if (v == nullptr) return absl::OkStatus();
    ASSIGN_OR_RETURN(const int64_t value,
                     ToInt64(*v, JoinKeyPath(path, key), std::numeric_limits<Int>::min(),
                             std::numeric_limits<Int>::max()));
    *out = static_cast<Int>(value);
    return absl::OkStatus();
  }
  // `v` as an integer in [lo, hi] (`path` names it in errors).
  absl::StatusOr<int64_t> ToInt64(const Json& v, absl::string_view path, int64_t lo,
                                  int64_t hi) const;

  // "a.b" (or "b" at the top level).
  static std::string JoinKeyPath(absl::string_view path, absl::string_view key);

 private:
  std::string source_;
  std::vector<std::string>* ignored_;
};

// --- Message helpers -------------------------------------------------------------------------

// "integer 5", "number 2.5", "string \"x\"", "boolean true", "null", "array of 2 element(s)",
// "object".
std::string DescribeJson(const Json& v);
// The shortest "%g" form that reads back as the same double.
std::string FormatShortestDouble(double v);
// A string value for a message: quoted, JSON-escaped (invalid UTF-8 replaced), cut after 60
// bytes.
std::string QuoteForMessage(absl::string_view s);
// Optimal string alignment distance (Damerau-Levenshtein with adjacent transpositions), ASCII
// case-insensitive.
int KeyEditDistance(absl::string_view a, absl::string_view b);
// The valid key of `section` a misspelled `key` most likely meant (an alias first), or "".
std::string SuggestKey(absl::string_view key, const JsonSection& section);

}  // namespace ps

#endif  // PATRICKSTAR_TRAINER_JSON_READER_H_
