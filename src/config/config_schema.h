// src/config/config_schema.h — internal to src/config: reads a parsed JSON document into a
// Config, key by key, following the schema written out in config_schema.cc.
//
// Contract: ReadConfig visits every block and key zinf knows (present or not), fills the
// fields of `config` that are present and valid, and reports, without stopping at the first:
// problems ("<json path>: <what is wrong>; expected <what is allowed>"), DeepSpeed keys that
// are accepted but not acted on ("<json path>=<value>"), keys whose value was "auto", and the
// paths of the values the document set (`given`: spelled as Config::ToJson writes them, an
// alias under its primary name; see Config::given_keys for the groups).
// A field the document does not set keeps the value `config` had: reading onto a base config
// (Config::FromString with ConfigParseOptions::base) is reading onto a non-default `config`.
// Two groups are replaced whole when the document gives any part of them: the three batch keys
// (DeepSpeed resolves each from the others) and the `scheduler` block (its type decides its
// parameters; `"scheduler": null` means no scheduler), which then starts from
// SchedulerConfig's defaults.
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
  std::vector<std::string> given;
};

void ReadConfig(const nlohmann::json& doc, Config* config, ReadReport* report);

}  // namespace zinf::config_internal
