// How gradserve's executables read their flags: names with underscores, as absl declares them,
// or with hyphens (Note [Flag spelling]), and every flag argument checked before absl parses it,
// so that a mistyped flag is a usage error, exit status 2 (Note [Flags checked first]).
// Header-only, like process_start.h, so that the client tool, which does not link the engine,
// shares it.
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
// Note [Flags checked first]
// absl::ParseCommandLine exits with status 1 on an unknown flag or a value it cannot parse,
// where gradserve's executables promise 2 for bad arguments; and it takes every flag linked
// into the program, so the client tool would take `gradserve ping --scenario=mlp` although
// ping has no such flag, and ignore it. So a main calls FlagArguments::Check first and exits 2
// with its message: it reads the arguments by absl's rules ("--name=value", "--name value" for
// a flag that is not a bool, "--name" and "--noname" for a bool, one dash or two, nothing after
// "--") and fails on the first flag that is not registered, not among the command's own flags
// (when the main names them; absl's built-in flags, --help and its kind, always count), lacks
// its value, or whose value does not parse. Values are parsed by the flag itself
// (CommandLineFlag::ParseFrom), exactly as absl will parse them right after. Arguments that
// use --flagfile, --fromenv, --tryfromenv or --undefok are left to absl whole: what they bring
// is absl's to read.
//
// Thread safety: call ParseFlags (or make a FlagArguments) in main, after the flags are
// registered (static initialization) and before any thread reads them.

#ifndef GRADSERVE_PROGRAM_FLAG_ARGUMENTS_H_
#define GRADSERVE_PROGRAM_FLAG_ARGUMENTS_H_

#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace gradserve {

// A copy of a main's arguments with hyphenated flag names spelled as declared (Note [Flag
// spelling]); argc() and argv() are what absl::ParseCommandLine takes. argv()'s strings live as
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

  // Note [Flags checked first]: OK if absl will parse every flag argument; else
  // INVALID_ARGUMENT naming the first bad one. `own`, if not empty, lists the only flags
  // (besides absl's usage flags) that the arguments may set. Sets the flags it checks.
  absl::Status Check(absl::Span<const std::string> own = {}) const {
    if (arguments_.size() < 2) return absl::OkStatus();  // no arguments past the program's name
    const size_t end = static_cast<size_t>(
        std::find(arguments_.begin() + 1, arguments_.end(), "--") - arguments_.begin());
    for (size_t i = 1; i < end; ++i) {
      const absl::string_view name = Split(arguments_[i]).name;
      if (name == "flagfile" || name == "fromenv" || name == "tryfromenv" || name == "undefok") {
        return absl::OkStatus();  // absl's to read (see the Note)
      }
    }
    for (size_t i = 1; i < end; ++i) {
      Flag flag = Split(arguments_[i]);
      if (flag.name.empty() || IsUsageFlag(flag.name)) continue;
      if (!flag.has_value && i + 1 < end) flag.next = &arguments_[i + 1];
      if (absl::Status s = CheckOne(flag, own, &i); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

 private:
  // One flag argument: its name, and its value if it carries one ("--name=value").
  struct Flag {
    absl::string_view argument;
    absl::string_view name;  // empty if the argument is no flag
    absl::string_view value;
    bool has_value = false;
    const std::string* next = nullptr;  // the argument after it, if any
  };

  // The flags absl's parser handles by name, without registering them: --help and its kind.
  static bool IsUsageFlag(absl::string_view name) {
    for (absl::string_view usage : {"help", "helpfull", "helpshort", "helppackage", "helpon",
                                    "helpmatch", "version", "only_check_args"}) {
      if (name == usage) return true;
    }
    return false;
  }

  static Flag Split(absl::string_view argument) {
    Flag flag;
    flag.argument = argument;
    if (argument.size() < 2 || argument[0] != '-') return flag;
    absl::string_view rest = argument.substr(argument[1] == '-' ? 2 : 1);
    const size_t eq = rest.find('=');
    flag.name = rest.substr(0, eq);
    if (eq != absl::string_view::npos) {
      flag.value = rest.substr(eq + 1);
      flag.has_value = true;
    }
    if (flag.name.empty()) flag.name = argument;  // "--=x": no name, reported as typed
    return flag;
  }

  // Checks one flag; advances *i past a value given as the next argument.
  static absl::Status CheckOne(const Flag& flag, absl::Span<const std::string> own, size_t* i) {
    absl::CommandLineFlag* found = absl::FindCommandLineFlag(flag.name);
    bool negated = false;
    if (found == nullptr && absl::StartsWith(flag.name, "no")) {
      found = absl::FindCommandLineFlag(flag.name.substr(2));
      negated = found != nullptr && found->IsOfType<bool>();
      if (!negated) found = nullptr;
    }
    if (found == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag '", flag.argument, "'"));
    }
    if (!own.empty() && std::find(own.begin(), own.end(), found->Name()) == own.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", flag.argument, "' is not a flag of this command"));
    }
    if (negated) {
      if (!flag.has_value) return absl::OkStatus();
      return absl::InvalidArgumentError(
          absl::StrCat("'", flag.argument, "': the negative form of a bool flag takes no value"));
    }
    absl::string_view value = flag.value;
    if (!flag.has_value) {
      if (found->IsOfType<bool>()) return absl::OkStatus();
      if (flag.next == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat("flag '", flag.argument, "' is missing its value"));
      }
      value = *flag.next;
      ++*i;
    }
    std::string error;  // absl's own message: "Illegal value 'x' specified for flag 'name'..."
    if (!found->ParseFrom(value, &error)) return absl::InvalidArgumentError(error);
    return absl::OkStatus();
  }

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

// What a main does with its arguments: spells them (Note [Flag spelling]), checks them (Note
// [Flags checked first]; own as in Check) and parses them with absl::ParseCommandLine. Returns
// the positional arguments (absl's, without argv[0]); on a bad flag, prints
// "PROGRAM: message; 'PROGRAM --help' lists its flags" to stderr and returns nullopt, and the
// main exits 2.
inline std::optional<std::vector<std::string>> ParseFlags(int argc, char** argv,
                                                          const std::string& program,
                                                          absl::Span<const std::string> own = {}) {
  FlagArguments arguments(argc, argv);
  if (absl::Status checked = arguments.Check(own); !checked.ok()) {
    std::fprintf(stderr, "%s: %s; '%s --help' lists its flags\n", program.c_str(),
                 std::string(checked.message()).c_str(), program.c_str());
    return std::nullopt;
  }
  const std::vector<char*> positional = absl::ParseCommandLine(arguments.argc(), arguments.argv());
  return std::vector<std::string>(positional.begin() + 1, positional.end());
}

}  // namespace gradserve

#endif  // GRADSERVE_PROGRAM_FLAG_ARGUMENTS_H_
