// gradserve: the command-line tool of the gradserve service. `gradserve --help` lists its
// subcommands; `gradserve COMMAND --help` describes one.

#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "client/cli/command.h"
#include "program/flag_arguments.h"
#include "program/process_start.h"

namespace gradserve::cli {

Command LoadCommand();  // load_command.cc

namespace {

// Every subcommand, in the order `gradserve --help` lists them.
std::vector<Command> AllCommands() {
  return {GradCommand(), SessionCommand(), InfoCommand(), HealthCommand(),
          PingCommand(), LoadCommand(),    GraphCommand()};
}

bool IsHelp(const std::string& arg) {
  return arg == "--help" || arg == "-h" || arg == "help" || arg == "-help";
}

void PrintToolHelp(const std::vector<Command>& commands) {
  std::printf(
      "gradserve: computes gradients on a gradserve server.\n\n"
      "Usage: gradserve COMMAND [flags] [args]\n\nCommands:\n");
  for (const Command& c : commands) std::printf("  %-8s %s\n", c.name.c_str(), c.summary.c_str());
  std::printf("\n'gradserve COMMAND --help' describes a command and its flags.\n");
}

void PrintCommandHelp(const Command& command) {
  std::printf("%s\n\nFlags:\n", command.usage.c_str());
  for (const std::string& name : command.flags) {
    const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr) continue;
    std::printf("  --%s (default: %s)\n      %s\n", name.c_str(), flag->DefaultValue().c_str(),
                flag->Help().c_str());
  }
}

int Run(int argc, char** argv) {
  const std::vector<Command> commands = AllCommands();
  if (argc < 2 || IsHelp(argv[1])) {
    PrintToolHelp(commands);
    return argc < 2 ? kExitUsage : kExitOk;
  }
  const std::string name = argv[1];
  const Command* command = nullptr;
  for (const Command& c : commands) {
    if (c.name == name) command = &c;
  }
  if (command == nullptr) {
    std::fprintf(stderr, "gradserve: unknown command '%s'; 'gradserve --help' lists them\n",
                 name.c_str());
    return kExitUsage;
  }
  for (int i = 2; i < argc; ++i) {
    if (IsHelp(argv[i])) {
      PrintCommandHelp(*command);
      return kExitOk;
    }
  }
  // Parse the command's flags as if it were its own program: argv[0] is "gradserve NAME".
  std::string program = "gradserve " + name;
  std::vector<char*> args = {program.data()};
  for (int i = 2; i < argc; ++i) args.push_back(argv[i]);
  absl::SetProgramUsageMessage(command->usage);
  std::optional<std::vector<std::string>> positional =
      ParseFlags(static_cast<int>(args.size()), args.data(), program, command->flags);
  if (!positional.has_value()) return kExitUsage;  // Note [Flags checked first]
  return command->run(*positional);
}

}  // namespace
}  // namespace gradserve::cli

int main(int argc, char** argv) {
  gradserve::StartProcess();  // Note [Malloc tuning], Note [Mutex deadlock detection]
  return gradserve::cli::Run(argc, argv);
}
