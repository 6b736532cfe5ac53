#include "src/base/units.h"

#include <cctype>
#include <charconv>
#include <cmath>
#include <limits>

#include <fmt/format.h>

namespace zinf {
namespace {

std::string_view Trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

template <typename Parse>
auto ParseCommaList(std::string_view text, Parse parse)
    -> Result<std::vector<uint64_t>> {
  std::vector<uint64_t> out;
  size_t start = 0;
  while (true) {
    size_t comma = text.find(',', start);
    std::string_view item = text.substr(start, comma == std::string_view::npos ? comma
                                                                               : comma - start);
    auto v = parse(item);
    if (!v.ok()) return v.status();
    out.push_back(*v);
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return out;
}

}  // namespace

Result<uint64_t> ParseBytes(std::string_view text) {
  std::string_view s = Trim(text);
  uint64_t value = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc() || ptr == s.data()) {
    return InvalidArgument(fmt::format(
        "'{}' is not a byte size: expected an integer with an optional K, M, G or T suffix "
        "(binary, e.g. 128K, 1M, 8MiB)", text));
  }
  std::string suffix(ptr, s.data() + s.size());
  for (auto& c : suffix) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  int shift = 0;
  if (suffix.empty() || suffix == "B") shift = 0;
  else if (suffix == "K" || suffix == "KB" || suffix == "KIB") shift = 10;
  else if (suffix == "M" || suffix == "MB" || suffix == "MIB") shift = 20;
  else if (suffix == "G" || suffix == "GB" || suffix == "GIB") shift = 30;
  else if (suffix == "T" || suffix == "TB" || suffix == "TIB") shift = 40;
  else {
    return InvalidArgument(fmt::format(
        "'{}' has an unknown size suffix '{}': expected K, M, G or T", text, suffix));
  }
  if (shift > 0 && value > (std::numeric_limits<uint64_t>::max() >> shift)) {
    return InvalidArgument(fmt::format("'{}' is too large", text));
  }
  return value << shift;
}

std::vector<std::string> SplitCommas(std::string_view text) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    size_t comma = text.find(',', start);
    out.emplace_back(text.substr(start, comma == std::string_view::npos ? comma : comma - start));
    if (comma == std::string_view::npos) return out;
    start = comma + 1;
  }
}

Result<std::vector<uint64_t>> ParseBytesList(std::string_view text) {
  return ParseCommaList(text, ParseBytes);
}

Result<std::vector<uint64_t>> ParseUintList(std::string_view text) {
  return ParseCommaList(text, [](std::string_view item) -> Result<uint64_t> {
    std::string_view s = Trim(item);
    uint64_t value = 0;
    auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
    if (ec != std::errc() || ptr != s.data() + s.size() || s.empty()) {
      return InvalidArgument(fmt::format("'{}' is not a non-negative integer", item));
    }
    return value;
  });
}

Result<double> ParseSeconds(std::string_view text) {
  std::string s(Trim(text));
  double scale = 1.0;
  if (s.size() > 2 && s.substr(s.size() - 2) == "ms") { scale = 1e-3; s.resize(s.size() - 2); }
  else if (!s.empty() && s.back() == 's') { s.pop_back(); }
  else if (!s.empty() && s.back() == 'm') { scale = 60.0; s.pop_back(); }
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size() || !(v >= 0) || !std::isfinite(v)) {
    return InvalidArgument(fmt::format(
        "'{}' is not a duration: expected seconds such as 10, 2.5, 500ms or 1m", text));
  }
  return v * scale;
}

std::string FormatBytesShort(uint64_t bytes) {
  static constexpr const char* kSuffix[] = {"", "K", "M", "G", "T"};
  int i = 0;
  while (i < 4 && bytes != 0 && bytes % 1024 == 0) { bytes /= 1024; ++i; }
  return fmt::format("{}{}", bytes, kSuffix[i]);
}

std::string FormatBytesHuman(uint64_t bytes) {
  static constexpr const char* kSuffix[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int i = 0;
  while (i < 4 && v >= 1024.0) { v /= 1024.0; ++i; }
  return i == 0 ? fmt::format("{} B", bytes) : fmt::format("{:.1f} {}", v, kSuffix[i]);
}

}  // namespace zinf
