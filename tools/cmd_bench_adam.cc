// Placeholder until this command lands: it says so and fails.
#include <fmt/format.h>

#include "tools/commands.h"

namespace zinf::tools {

void RegisterBenchAdam(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("bench-adam", "(not built yet)");
  cmd->allow_extras();
  cmd->callback([&exit_code] {
    fmt::print(stderr, "zinf bench-adam: not implemented in this build\n");
    exit_code = 1;
  });
}

}  // namespace zinf::tools
