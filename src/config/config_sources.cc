#include "src/config/config_sources.h"

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>

namespace zinf {
namespace {

using nlohmann::ordered_json;

// One printed line: its text without the comment, and the source (empty: no comment).
struct Line {
  std::string text;
  std::string source;
};

// A value on one line; an array's items separated by ", ".
std::string Dump(const ordered_json& v) {
  if (v.is_array()) {
    std::string out = "[";
    for (size_t i = 0; i < v.size(); ++i) out += (i == 0 ? "" : ", ") + Dump(v[i]);
    return out + "]";
  }
  return v.dump(-1, ' ', false, ordered_json::error_handler_t::replace);
}

void Emit(const ConfigSources& sources, const ordered_json& object, const std::string& path,
          int depth, std::vector<Line>* out) {
  const std::string indent(2 * static_cast<size_t>(depth), ' ');
  size_t i = 0;
  for (const auto& [key, value] : object.items()) {
    const std::string child = path.empty() ? key : path + "." + key;
    const std::string comma = ++i < object.size() ? "," : "";
    const std::string head = indent + Dump(ordered_json(key)) + ": ";
    if (value.is_object() && !value.empty()) {
      out->push_back({head + "{", ""});
      Emit(sources, value, child, depth + 1, out);
      out->push_back({indent + "}" + comma, ""});
    } else {
      out->push_back({head + Dump(value) + comma, sources.Of(child)});
    }
  }
}

}  // namespace

void ConfigSources::Set(std::string_view path, const std::string& source) {
  const std::string block = std::string(path) + ".";
  for (auto it = sources_.lower_bound(block); it != sources_.end() && it->first.starts_with(block);) {
    it = sources_.erase(it);
  }
  sources_[std::string(path)] = source;
}

void ConfigSources::SetAll(const std::vector<std::string>& paths, const std::string& source) {
  for (const std::string& p : paths) Set(p, source);
}

std::string ConfigSources::Of(std::string_view path) const {
  for (std::string_view p = path;;) {
    auto it = sources_.find(p);
    if (it != sources_.end()) return it->second;
    const size_t dot = p.rfind('.');
    if (dot == std::string_view::npos) return kDefaultSource;
    p = p.substr(0, dot);
  }
}

std::string ConfigSources::Annotate(const ordered_json& config_json) const {
  std::vector<Line> lines = {{"{", ""}};
  Emit(*this, config_json, "", 1, &lines);
  lines.push_back({"}", ""});
  size_t width = 0;
  for (const Line& l : lines) {
    if (!l.source.empty()) width = std::max(width, l.text.size());
  }
  std::string out;
  for (const Line& l : lines) {
    out += l.source.empty() ? l.text : fmt::format("{:<{}}  // {}", l.text, width, l.source);
    out += '\n';
  }
  return out;
}

std::string ConfigSources::Annotate(const Config& config) const {
  return Annotate(config.ToJson());
}

}  // namespace zinf
