#include "src/base/log.h"

#include <cstdlib>
#include <mutex>
#include <set>
#include <string>

#include <spdlog/sinks/stdout_color_sinks.h>

namespace zinf {

spdlog::logger& Log() {
  static std::shared_ptr<spdlog::logger> logger = [] {
    auto l = spdlog::stderr_color_mt("zinf");
    l->set_pattern("[%H:%M:%S.%e] [%^%l%$] %v");
    l->set_level(spdlog::level::info);
    if (const char* env = std::getenv("ZINF_LOG_LEVEL")) {
      l->set_level(spdlog::level::from_str(env));
    }
    return l;
  }();
  return *logger;
}

bool SetLogLevel(std::string_view level) {
  auto lvl = spdlog::level::from_str(std::string(level));
  // from_str maps unknown names to off; accept "off" only when asked for.
  if (lvl == spdlog::level::off && level != "off") return false;
  Log().set_level(lvl);
  return true;
}

static bool FirstTime(std::string_view key) {
  static std::mutex mu;
  static std::set<std::string, std::less<>> seen;
  std::lock_guard lock(mu);
  return seen.emplace(key).second;
}

void WarnOnce(std::string_view key, std::string_view message) {
  if (FirstTime(key)) Log().warn("{}", message);
}

void InfoOnce(std::string_view key, std::string_view message) {
  if (FirstTime(key)) Log().info("{}", message);
}

}  // namespace zinf
