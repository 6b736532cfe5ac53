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
// With ReadReport::catalog set, every key the schema declares is also described there (its
// type and range, its value on `config` before reading, how "auto"/null read, its aliases):
// DescribeConfig walks an empty document that way, and docs/config.md is generated from it
// (config_reference.h), so the reference cannot drift from the schema.
//
// Thread-safety: pure function of its arguments.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "src/config/config.h"

namespace zinf::config_internal {

// One key of the schema, as its getter declares it.
struct KeyInfo {
  enum class Kind {
    kBlock,     // an object of keys
    kValue,     // a value zinf acts on
    kNoEffect,  // a DeepSpeed key accepted without effect (named in the warning unless neutral)
    kRefused,   // a DeepSpeed key refused outright
    kAlias,     // another name of the key at `path` (`note` holds the other name's path)
  };
  std::string path;      // primary names: "zero_optimization.offload_param.device"
  Kind kind = Kind::kValue;
  std::string expected;  // what the reader takes: "an integer from 1 to 4096"
  std::string value;     // its value before reading, as JSON ("unset" when optional and empty)
  bool accepts_auto = false;  // "auto" means the default
  bool accepts_null = false;  // null means absent
  std::string note;      // kNoEffect: the neutral values; kRefused: why; kAlias: the alias
  std::vector<std::string> aliases;  // other names (DescribeConfig folds kAlias entries here)
};

struct ReadReport {
  std::vector<std::string> errors;
  std::vector<std::string> unimplemented;
  std::vector<std::string> auto_keys;
  std::vector<std::string> given;
  std::vector<KeyInfo>* catalog = nullptr;  // when set: every declared key, described once
};

void ReadConfig(const nlohmann::json& doc, Config* config, ReadReport* report);

// Every key of the schema in declaration order, with its value on `base` (aliases folded into
// their primary key's entry).
std::vector<KeyInfo> DescribeConfig(const Config& base);

}  // namespace zinf::config_internal
