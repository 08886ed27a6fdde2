#include "base/flag_presence.h"

#include <algorithm>
#include <vector>

#include "absl/flags/internal/parse.h"
#include "absl/flags/reflection.h"
#include "absl/strings/str_cat.h"

namespace ps {

bool FlagGiven(absl::string_view name) {
  return absl::flags_internal::WasPresentOnCommandLine(name);
}

std::vector<absl::CommandLineFlag*> FlagsDefinedIn(absl::string_view file) {
  std::vector<absl::CommandLineFlag*> flags;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (flag->Filename() == file) flags.push_back(flag);
  }
  std::sort(flags.begin(), flags.end(),
            [](const absl::CommandLineFlag* a, const absl::CommandLineFlag* b) {
              return a->Name() < b->Name();
            });
  return flags;
}

absl::Status RefuseEmptyFlags(absl::string_view file) {
  for (const absl::CommandLineFlag* flag : FlagsDefinedIn(file)) {
    if (!FlagGiven(flag->Name()) || !flag->CurrentValue().empty()) continue;
    return absl::InvalidArgumentError(absl::StrCat(
        "--", flag->Name(), " is empty: give it a value, or leave the flag out (an empty value is "
        "never taken as \"not given\"; an unset shell variable, as in --", flag->Name(),
        "=$VAR, expands to nothing)"));
  }
  return absl::OkStatus();
}

}  // namespace ps
