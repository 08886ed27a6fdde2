// Which command-line flags a program was given, and the rule that an empty value is a mistake.
//
// A flag given with an empty value (`--train_data=`, `--train_data ""`: typically an unset shell
// variable, `--train_data=$DATA`) must never be read as "not given": the binaries refuse it, naming
// the flag (README, docs/training.md#flags). "Given" is absl's own record of what its parser saw
// (the command line and --flagfile), so a program's flags and this rule cannot drift apart.
//
// Thread safety: call after absl::ParseCommandLine, from the thread that parsed.
#ifndef PATRICKSTAR_BASE_FLAG_PRESENCE_H_
#define PATRICKSTAR_BASE_FLAG_PRESENCE_H_

#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace ps {

// Whether the flag named `name` was given (on the command line or in a --flagfile), with any
// value. abseil 20220623 keeps CommandLineFlag's own record private; this reads its parser's
// (flags_internal::WasPresentOnCommandLine). REQUIRES: absl::ParseCommandLine has run.
bool FlagGiven(absl::string_view name);

// The flags defined in source file `file` (pass __FILE__ from the file holding the ABSL_FLAGs),
// sorted by name.
std::vector<absl::CommandLineFlag*> FlagsDefinedIn(absl::string_view file);

// InvalidArgument naming the first flag defined in `file` that was given an empty value: a string
// flag's "" and an optional number's "" (absl parses it as "no value"); ok when there is none.
// (A non-optional number's or a boolean's "" does not parse at all.)
// REQUIRES: absl::ParseCommandLine has run.
[[nodiscard]] absl::Status RefuseEmptyFlags(absl::string_view file);

}  // namespace ps

#endif  // PATRICKSTAR_BASE_FLAG_PRESENCE_H_
