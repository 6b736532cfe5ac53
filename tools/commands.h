// tools/commands.h — the subcommands of the `zinf` executable.
//
// Contract: each Register* adds one subcommand to `app`; when that subcommand is chosen and
// parsed, its callback runs the command and stores the process exit status in `exit_code`
// (0 success, 1 the command failed, 2 bad usage). Commands print results to stdout and
// diagnostics to stderr.
//
// Thread-safety: called once from main, single-threaded.
#pragma once

#include <CLI/CLI.hpp>

namespace zinf::tools {

void RegisterInfo(CLI::App& app, int& exit_code);
void RegisterBenchIo(CLI::App& app, int& exit_code);
void RegisterTune(CLI::App& app, int& exit_code);
void RegisterBenchAdam(CLI::App& app, int& exit_code);
void RegisterBenchSwap(CLI::App& app, int& exit_code);
void RegisterTrain(CLI::App& app, int& exit_code);
void RegisterCkpt(CLI::App& app, int& exit_code);
void RegisterLaunch(CLI::App& app, int& exit_code);
void RegisterBenchComm(CLI::App& app, int& exit_code);
void RegisterPlan(CLI::App& app, int& exit_code);

}  // namespace zinf::tools
