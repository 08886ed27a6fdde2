// Hand-rolled JSON output for the trace writer's hot path (no DOM, no allocation beyond the
// output string). Everything appended here is valid RFC 8259 JSON for every input.
#ifndef PATRICKSTAR_TRAINER_IO_INTERNAL_JSON_STRING_H_
#define PATRICKSTAR_TRAINER_IO_INTERNAL_JSON_STRING_H_

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace ps::io_internal {

// Appends `s` as a quoted JSON string. Escapes '"', '\\' and the control characters U+0000..U+001F
// (as \b \f \n \r \t or \u00XX); passes well-formed UTF-8 through unchanged; replaces each maximal
// ill-formed subsequence (Unicode 15 §3.9, "U+FFFD substitution of maximal subparts": stray
// continuation bytes, truncated sequences, overlong forms, surrogates, code points above U+10FFFF)
// with one U+FFFD.
void AppendJsonString(std::string* out, absl::string_view s);

// Appends a JSON number: the shortest decimal that reads back as the same double. JSON has no
// NaN or infinity, so those become the strings "NaN", "Infinity" and "-Infinity".
void AppendJsonDouble(std::string* out, double v);

void AppendJsonInt(std::string* out, int64_t v);
void AppendJsonUint(std::string* out, uint64_t v);

// Appends a time in nanoseconds as microseconds with exactly three decimals ("-12.005"), the unit
// of the Trace Event Format's "ts" and "dur", without the rounding a double would add.
void AppendMicrosFromNanos(std::string* out, int64_t ns);

}  // namespace ps::io_internal

#endif  // PATRICKSTAR_TRAINER_IO_INTERNAL_JSON_STRING_H_
