// src/base/log.h — logging for the whole project (spdlog underneath).
//
// Contract: logs go to stderr, so that stdout stays clean for tables and --json output.
// The level comes from ZINF_LOG_LEVEL (trace, debug, info, warn, error, off; default info)
// or SetLogLevel. WarnOnce logs a message the first time its key is seen in this process,
// for conditions that are worth saying once (an engine fallback, a buffered-I/O fallback).
//
// Thread-safety: every function here may be called from any thread.
#pragma once

#include <string_view>

#include <spdlog/spdlog.h>

namespace zinf {

// Returns the project's logger (created on first use).
spdlog::logger& Log();

// Level names as spdlog spells them; unknown names return false and change nothing.
bool SetLogLevel(std::string_view level);

// Logs `message` at warn level once per distinct `key` per process.
void WarnOnce(std::string_view key, std::string_view message);
// Same, at info level.
void InfoOnce(std::string_view key, std::string_view message);

}  // namespace zinf
