// How gradserve's executables read their flags' names: with underscores, as absl declares them,
// or with hyphens. Header-only, like process_start.h, so that the client tool, which does not
// link the engine, shares it.
//
// Note [Flag spelling]
// The flags are absl flags, whose names have underscores (--max_inline_cost, --grace_period).
// Many command-line tools spell such names with hyphens, and so do many Kubernetes manifests;
// absl stops on "--grace-period" as an unknown flag. So a main passes its arguments through
// FlagArguments before absl parses them: an argument "--a-b" or "--a-b=value" (with one dash
// or two) whose name with underscores, a_b, is a flag of the executable becomes "--a_b" or
// "--a_b=value". Every other argument reaches absl as it was typed: values (only the name
// before '=' is read), positional arguments, everything after "--", and names that are no
// flag either way, which absl then reports as typed.
//
// Thread safety: make a FlagArguments in main, after the flags are registered (static
// initialization) and before absl parses them.

#ifndef GRADSERVE_ENGINE_UTIL_FLAG_SPELLING_H_
#define GRADSERVE_ENGINE_UTIL_FLAG_SPELLING_H_

#include <algorithm>
#include <string>
#include <vector>

#include "absl/flags/reflection.h"
#include "absl/strings/match.h"

namespace gradserve {

// Note [Flag spelling]: a copy of a main's arguments with hyphenated flag names spelled as
// declared; argc() and argv() are what absl::ParseCommandLine takes. argv()'s strings live as
// long as this object.
class FlagArguments {
 public:
  FlagArguments(int argc, char** argv) {
    bool flags_ended = false;
    for (int i = 0; i < argc; ++i) {
      std::string argument = argv[i];
      if (i > 0 && !flags_ended) {
        flags_ended = argument == "--";
        if (!flags_ended) SpellAsDeclared(&argument);
      }
      arguments_.push_back(std::move(argument));
    }
    for (std::string& argument : arguments_) pointers_.push_back(argument.data());
    pointers_.push_back(nullptr);  // argv[argc], as a main receives it
  }

  FlagArguments(const FlagArguments&) = delete;
  FlagArguments& operator=(const FlagArguments&) = delete;

  int argc() const { return static_cast<int>(arguments_.size()); }
  char** argv() { return pointers_.data(); }

 private:
  // "--a-b[=value]" -> "--a_b[=value]" if a_b is a flag; else unchanged.
  static void SpellAsDeclared(std::string* argument) {
    const size_t dashes = absl::StartsWith(*argument, "--")  ? 2
                          : absl::StartsWith(*argument, "-") ? 1
                                                             : 0;
    if (dashes == 0) return;
    const size_t end = std::min(argument->find('=', dashes), argument->size());
    std::string name = argument->substr(dashes, end - dashes);
    if (name.find('-') == std::string::npos) return;
    std::replace(name.begin(), name.end(), '-', '_');
    if (absl::FindCommandLineFlag(name) == nullptr) return;
    argument->replace(dashes, end - dashes, name);
  }

  std::vector<std::string> arguments_;
  std::vector<char*> pointers_;
};

}  // namespace gradserve

#endif  // GRADSERVE_ENGINE_UTIL_FLAG_SPELLING_H_
