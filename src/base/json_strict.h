// src/base/json_strict.h — parse JSON refusing a key repeated within one object.
//
// Contract: ParseJsonRefusingDuplicates parses `text` with nlohmann::json (which would silently
// keep the last of two equal keys) and throws DuplicateJsonKey instead, carrying the keys from
// the document's root down to the repeated one ("[]" standing for an array level). Malformed
// JSON throws nlohmann's parse_error as json::parse does. Header-only: callers link
// nlohmann_json themselves.
//
// Thread-safety: reentrant.
#pragma once

#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace zinf {

struct DuplicateJsonKey {
  std::vector<std::string> path;  // root to the repeated key; "[]" for an array level

  // "a.b[].c"
  std::string Dotted() const {
    std::string out;
    for (const std::string& k : path) {
      if (k == "[]") {
        out += k;
      } else {
        out += (out.empty() ? "" : ".") + k;
      }
    }
    return out;
  }
};

inline nlohmann::json ParseJsonRefusingDuplicates(std::string_view text,
                                                  bool ignore_comments = false) {
  using json = nlohmann::json;
  struct Frame {
    bool object;
    std::set<std::string> keys;
    std::string key;  // the last key read at this level
  };
  std::vector<Frame> frames;
  auto callback = [&frames](int, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
        frames.push_back({true, {}, {}});
        break;
      case json::parse_event_t::array_start:
        frames.push_back({false, {}, {}});
        break;
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        if (!frames.empty()) frames.pop_back();
        break;
      case json::parse_event_t::key: {
        Frame& f = frames.back();
        f.key = parsed.get<std::string>();
        if (!f.keys.insert(f.key).second) {
          DuplicateJsonKey d;
          for (const Frame& g : frames) d.path.push_back(g.object ? g.key : "[]");
          throw d;
        }
        break;
      }
      default:
        break;
    }
    return true;
  };
  return json::parse(text.begin(), text.end(), callback, /*allow_exceptions=*/true,
                     ignore_comments);
}

}  // namespace zinf
