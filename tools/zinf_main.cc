// The `zinf` command: one executable, one subcommand per job.
#include <CLI/CLI.hpp>

#include "src/base/log.h"
#include "tools/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"zinf — ZeRO-Infinity style offload engine: trains models larger than GPU "
               "memory by paging state among GPU, pinned host memory and NVMe"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("zinf ") + ZINF_VERSION);
  std::string log_level;
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error or off")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "off"}));
  app.parse_complete_callback([&] {
    if (!log_level.empty()) zinf::SetLogLevel(log_level);
  });

  int exit_code = 0;
  zinf::tools::RegisterInfo(app, exit_code);
  zinf::tools::RegisterBenchIo(app, exit_code);
  zinf::tools::RegisterTune(app, exit_code);
  zinf::tools::RegisterBenchAdam(app, exit_code);
  zinf::tools::RegisterBenchSwap(app, exit_code);
  zinf::tools::RegisterTrain(app, exit_code);
  zinf::tools::RegisterCkpt(app, exit_code);
  zinf::tools::RegisterLaunch(app, exit_code);
  zinf::tools::RegisterBenchComm(app, exit_code);
  zinf::tools::RegisterPlan(app, exit_code);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0; every usage error exits 2, as docs/development.md says.
    return app.exit(e) == 0 ? 0 : 2;
  }
  return exit_code;
}
