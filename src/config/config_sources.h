// src/config/config_sources.h — where each value of a merged config came from, and the config
// printed with it (`zinf train --print-config`).
//
// Contract: a config is built in layers (the defaults, a file, command-line flags); a
// ConfigSources records which layer set each value last, by its JSON path as Config::ToJson
// writes it ("optimizer.params.lr"). Set() at a block ("scheduler") covers every value under it
// and drops what was recorded under it before, so the latest Set at or above a path wins.
// Of(path) is the source recorded at the path or at the nearest block holding it, else
// "default". Annotate() prints a JSON object (Config::ToJson's) indented, one value a line,
// each followed by `// <source>`; arrays and empty objects are values, written on their line.
// Config files may hold comments, so the output loads as a config file.
//
// Thread-safety: a plain value.
#pragma once

#include <functional>
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "src/config/config.h"

namespace zinf {

inline constexpr char kDefaultSource[] = "default";

class ConfigSources {
 public:
  void Set(std::string_view path, const std::string& source);
  void SetAll(const std::vector<std::string>& paths, const std::string& source);
  std::string Of(std::string_view path) const;

  std::string Annotate(const nlohmann::ordered_json& config_json) const;
  std::string Annotate(const Config& config) const;  // of config.ToJson()

 private:
  std::map<std::string, std::string, std::less<>> sources_;
};

}  // namespace zinf
