// src/config/config_schema.h — internal to src/config: reads a parsed JSON document into a
// Config, key by key, following the schema written out in config_schema.cc.
//
// Contract: ReadConfig visits every block and key zinf knows (present or not), fills the
// fields of `config` that are present and valid, and reports, without stopping at the first:
// problems ("<json path>: <what is wrong>; expected <what is allowed>"), DeepSpeed keys that
// are accepted but not acted on ("<json path>=<value>"), and keys whose value was "auto".
// Cross-field rules are not checked here (Config::Validate does).
//
// Thread-safety: pure function of its arguments.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "src/config/config.h"

namespace zinf::config_internal {

struct ReadReport {
  std::vector<std::string> errors;
  std::vector<std::string> unimplemented;
  std::vector<std::string> auto_keys;
};

void ReadConfig(const nlohmann::json& doc, Config* config, ReadReport* report);

}  // namespace zinf::config_internal
