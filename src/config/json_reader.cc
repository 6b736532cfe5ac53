#include "src/config/json_reader.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>

#include "src/base/units.h"
#include "src/config/key_match.h"

namespace zinf::config_internal {
namespace {

using nlohmann::json;

constexpr uint64_t kU64Max = std::numeric_limits<uint64_t>::max();
constexpr uint64_t kU32Max = std::numeric_limits<uint32_t>::max();
constexpr size_t kMaxShownValue = 60;  // characters of a value quoted in a message
constexpr double kInf = std::numeric_limits<double>::infinity();

std::string IntRangeText(uint64_t lo, uint64_t hi) {
  if (hi == kU64Max || hi == kU32Max) return fmt::format("an integer >= {}", lo);
  return fmt::format("an integer from {} to {}", lo, hi);
}

std::string BytesRangeText(uint64_t lo, uint64_t hi, Align align) {
  std::string what = align == Align::kPowerOfTwo ? " that is a power of two"
                     : align == Align::kPage     ? " that is a multiple of 4096"
                                                 : "";
  std::string range =
      hi == kU64Max ? fmt::format(" of at least {}", FormatBytesShort(lo))
                    : fmt::format(" from {} to {}", FormatBytesShort(lo), FormatBytesShort(hi));
  return fmt::format("a byte size (an integer, or a string like \"4G\"){}{}", what, range);
}

// A byte size as the reference shows it: "1M", "131072" (exact binary units only).
std::string BytesValueText(uint64_t bytes) { return FormatBytesShort(bytes); }

}  // namespace

bool Range::Contains(double v) const {
  return (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi);
}

std::string Range::Text() const {
  if (std::isinf(hi)) return fmt::format("a number {} {}", lo_open ? ">" : ">=", lo);
  return fmt::format("a number in {}{}, {}{}", lo_open ? "(" : "[", lo, hi, hi_open ? ")" : "]");
}

Range AtLeast(double lo) { return {lo, false, kInf, true}; }
Range Above(double lo) { return {lo, true, kInf, true}; }
Range Closed(double lo, double hi) { return {lo, false, hi, false}; }
Range HalfOpen(double lo, double hi) { return {lo, false, hi, true}; }

std::string ShowValue(const json& v) {
  std::string s = v.dump();
  if (s.size() > kMaxShownValue) s = s.substr(0, kMaxShownValue - 3) + "...";
  return s;
}

std::string TypeWord(const json& v) {
  switch (v.type()) {
    case json::value_t::boolean:
      return "a boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
      return "an integer";
    case json::value_t::number_float:
      return "a number";
    case json::value_t::string:
      return "a string";
    case json::value_t::array:
      return "an array";
    case json::value_t::object:
      return "an object";
    case json::value_t::null:
      return "null";
    default:
      return "not a plain JSON value";
  }
}

bool EqualsIgnoringCase(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

bool AsksNothing(const json& v) {
  if (v.is_null() || v == json(false) || v == json("auto")) return true;
  if (!v.is_object()) return false;
  if (v.contains("enabled") && v["enabled"] == json(false)) return true;
  return std::all_of(v.begin(), v.end(), [](const json& m) { return AsksNothing(m); });
}

bool Reader::Has(std::string_view key) const {
  return object_ != nullptr && object_->contains(std::string(key));
}

std::string Reader::PathOf(std::string_view key) const {
  return path_.empty() ? std::string(key) : path_ + "." + std::string(key);
}

std::string Reader::CanonicalPathOf(std::string_view key) const {
  std::string_view name = key;
  for (const auto& [alias, primary] : aliases_) {
    if (alias == key) name = primary;
  }
  return canonical_path_.empty() ? std::string(name)
                                 : canonical_path_ + "." + std::string(name);
}

void Reader::MarkGiven(std::string_view key) { report_->given.push_back(CanonicalPathOf(key)); }

void Reader::Error(std::string_view key, std::string message) {
  report_->errors.push_back(fmt::format("{}: {}", PathOf(key), message));
}

void Reader::Describe(std::string_view key, KeyInfo::Kind kind, std::string expected,
                      std::string value, unsigned flags, std::string note) {
  std::vector<KeyInfo>* catalog = report_->catalog;
  if (catalog == nullptr) return;
  const std::string path = PathOf(key);  // DescribeConfig reads no aliases: PathOf is primary
  if (kind != KeyInfo::Kind::kAlias) {
    auto known = std::find_if(catalog->begin(), catalog->end(), [&](const KeyInfo& k) {
      return k.path == path && k.kind != KeyInfo::Kind::kAlias;
    });
    if (known != catalog->end()) {
      // A value that is checked and then declared without effect (DeepSpeed's staging sizes).
      if (kind == KeyInfo::Kind::kNoEffect) {
        known->kind = kind;
        known->note = std::move(note);
      }
      return;
    }
  }
  KeyInfo info;
  info.path = path;
  info.kind = kind;
  info.expected = std::move(expected);
  info.value = std::move(value);
  info.accepts_auto = (flags & kAuto) != 0;
  info.accepts_null = (flags & kNull) != 0;
  info.note = std::move(note);
  catalog->push_back(std::move(info));
}

void Reader::Declare(std::string_view key) {
  declared_.emplace_back(key);
  known_paths_->push_back(PathOf(key));
}

const json* Reader::Lookup(std::string_view key, unsigned flags) {
  Declare(key);
  if (!Has(key)) return nullptr;
  const json& v = (*object_)[std::string(key)];
  if ((flags & kAuto) && v == json("auto")) {
    report_->auto_keys.push_back(PathOf(key));
    return nullptr;
  }
  if ((flags & kNull) && v.is_null()) return nullptr;
  return &v;
}

std::string_view Reader::Alias(std::string_view primary, std::string_view alias) {
  Describe(primary, KeyInfo::Kind::kAlias, "", "", kPlain, PathOf(alias));
  Declare(alias);
  aliases_.emplace_back(alias, primary);
  if (Has(primary) && Has(alias)) {
    Error(alias, fmt::format("also given as \"{}\"; expected one of the two names", primary));
  }
  return Has(alias) && !Has(primary) ? alias : primary;
}

void Reader::Uint(std::string_view key, uint64_t* out, uint64_t lo, uint64_t hi, unsigned flags) {
  Describe(key, KeyInfo::Kind::kValue, IntRangeText(lo, hi), std::to_string(*out), flags);
  const json* v = Lookup(key, flags);
  uint64_t x = 0;
  if (v != nullptr && ToUint(key, *v, lo, hi, IntRangeText(lo, hi), &x)) {
    *out = x;
    MarkGiven(key);
  }
}

void Reader::Uint32(std::string_view key, uint32_t* out, uint64_t lo, uint64_t hi, unsigned flags) {
  uint64_t x = *out;
  Uint(key, &x, lo, std::min<uint64_t>(hi, kU32Max), flags);
  *out = static_cast<uint32_t>(x);
}

void Reader::OptUint(std::string_view key, std::optional<uint64_t>* out, uint64_t lo, uint64_t hi,
                     unsigned flags) {
  Describe(key, KeyInfo::Kind::kValue, IntRangeText(lo, hi),
           *out ? std::to_string(**out) : "unset", flags);
  const json* v = Lookup(key, flags);
  uint64_t x = 0;
  if (v != nullptr && ToUint(key, *v, lo, hi, IntRangeText(lo, hi), &x)) {
    *out = x;
    MarkGiven(key);
  }
}

void Reader::Bytes(std::string_view key, uint64_t* out, uint64_t lo, uint64_t hi, Align align,
                   unsigned flags) {
  Describe(key, KeyInfo::Kind::kValue, BytesRangeText(lo, hi, align), BytesValueText(*out),
           flags);
  std::optional<uint64_t> x;
  OptBytes(key, &x, lo, hi, align, flags);
  if (x) *out = *x;
}

void Reader::OptBytes(std::string_view key, std::optional<uint64_t>* out, uint64_t lo, uint64_t hi,
                      Align align, unsigned flags) {
  Describe(key, KeyInfo::Kind::kValue, BytesRangeText(lo, hi, align),
           *out ? BytesValueText(**out) : "unset", flags);
  // "auto" (or null) resets the value: on a base config it must not keep the base's number.
  const bool reset = Has(key) && (((flags & kAuto) && (*object_)[std::string(key)] == json("auto")) ||
                                  ((flags & kNull) && (*object_)[std::string(key)].is_null()));
  const json* v = Lookup(key, flags);
  if (reset) out->reset();
  if (v == nullptr) return;
  const std::string expected = BytesRangeText(lo, hi, align);
  uint64_t x = 0;
  if (v->is_string()) {
    auto parsed = ParseBytes(v->get<std::string>());
    if (!parsed.ok()) {
      Error(key, fmt::format("{} is not a byte size; expected {}", ShowValue(*v), expected));
      return;
    }
    x = *parsed;
  } else if (!ToUint(key, *v, 0, kU64Max, expected, &x)) {
    return;
  }
  const bool aligned = align == Align::kPowerOfTwo ? (x & (x - 1)) == 0
                       : align == Align::kPage     ? x % 4096 == 0
                                                   : true;
  if (x < lo || x > hi || !aligned) {
    Error(key, fmt::format("{} is not allowed; expected {}", ShowValue(*v), expected));
    return;
  }
  *out = x;
  MarkGiven(key);
}

void Reader::Double(std::string_view key, double* out, Range range, unsigned flags) {
  Describe(key, KeyInfo::Kind::kValue, range.Text(), json(*out).dump(), flags);
  std::optional<double> x;
  OptDouble(key, &x, range, flags);
  if (x) *out = *x;
}

void Reader::OptDouble(std::string_view key, std::optional<double>* out, Range range,
                       unsigned flags) {
  Describe(key, KeyInfo::Kind::kValue, range.Text(), *out ? json(**out).dump() : "unset", flags);
  const json* v = Lookup(key, flags);
  double x = 0;
  if (v != nullptr && ToDouble(key, *v, range, &x)) {
    *out = x;
    MarkGiven(key);
  }
}

void Reader::DoublePair(std::string_view key, double* first, double* second, Range range,
                        unsigned flags) {
  Describe(key, KeyInfo::Kind::kValue,
           fmt::format("an array of two numbers, each {}", range.Text()),
           json::array({*first, *second}).dump(), flags);
  const json* v = Lookup(key, flags);
  if (v == nullptr) return;
  if (!v->is_array() || v->size() != 2) {
    Error(key, fmt::format("{} is {}; expected an array of two numbers, each {}", ShowValue(*v),
                           v->is_array() ? fmt::format("an array of {}", v->size()) : TypeWord(*v),
                           range.Text()));
    return;
  }
  double a = 0, b = 0;
  const bool ok_a = ToDouble(fmt::format("{}[0]", key), (*v)[0], range, &a);
  const bool ok_b = ToDouble(fmt::format("{}[1]", key), (*v)[1], range, &b);
  if (ok_a && ok_b) {
    *first = a;
    *second = b;
    MarkGiven(key);
  }
}

void Reader::Bool(std::string_view key, bool* out, unsigned flags) {
  Describe(key, KeyInfo::Kind::kValue, "true or false", json(*out).dump(), flags);
  std::optional<bool> x;
  OptBool(key, &x, flags);
  if (x) *out = *x;
}

void Reader::OptBool(std::string_view key, std::optional<bool>* out, unsigned flags) {
  Describe(key, KeyInfo::Kind::kValue, "true or false", *out ? json(**out).dump() : "unset",
           flags);
  const json* v = Lookup(key, flags);
  if (v == nullptr) return;
  if (!v->is_boolean()) {
    Error(key, fmt::format("{} is {}; expected true or false", ShowValue(*v), TypeWord(*v)));
    return;
  }
  *out = v->get<bool>();
  MarkGiven(key);
}

void Reader::String(std::string_view key, std::string* out, std::string_view what, unsigned flags) {
  Describe(key, KeyInfo::Kind::kValue, fmt::format("a string: {}", what), json(*out).dump(),
           flags);
  const json* v = Lookup(key, flags);
  if (v == nullptr) return;
  if (!v->is_string()) {
    Error(key, fmt::format("{} is {}; expected {}", ShowValue(*v), TypeWord(*v), what));
    return;
  }
  *out = v->get<std::string>();
  MarkGiven(key);
}

void Reader::StringList(std::string_view key, std::vector<std::string>* out,
                        std::string_view what) {
  Describe(key, KeyInfo::Kind::kValue, fmt::format("an array of strings: {}", what),
           json(*out).dump(), kPlain);
  const json* v = Lookup(key, kPlain);
  if (v == nullptr) return;
  if (!v->is_array()) {
    Error(key, fmt::format("{} is {}; expected an array of strings ({})", ShowValue(*v),
                           TypeWord(*v), what));
    return;
  }
  std::vector<std::string> items;
  for (size_t i = 0; i < v->size(); ++i) {
    const json& item = (*v)[i];
    if (!item.is_string() || item.get<std::string>().empty()) {
      Error(fmt::format("{}[{}]", key, i),
            fmt::format("{} is {}; expected a non-empty string ({})", ShowValue(item),
                        item.is_string() ? "empty" : TypeWord(item), what));
      return;
    }
    items.push_back(item.get<std::string>());
  }
  *out = std::move(items);
  MarkGiven(key);
}

void Reader::EnumError(std::string_view key, const json& v, const std::vector<std::string>& names,
                       const std::vector<std::string_view>& refused) {
  std::string expected = "one of";
  for (size_t i = 0; i < names.size(); ++i) {
    expected += fmt::format("{} \"{}\"", i == 0 ? "" : ",", names[i]);
  }
  if (!v.is_string()) {
    Error(key, fmt::format("{} is {}; expected {}", ShowValue(v), TypeWord(v), expected));
    return;
  }
  const std::string s = v.get<std::string>();
  for (std::string_view r : refused) {
    if (EqualsIgnoringCase(s, r)) {
      Error(key, fmt::format("{} is DeepSpeed's but zinf does not implement it; expected {}",
                             ShowValue(v), expected));
      return;
    }
  }
  const std::string near = NearestKey(s, names);
  Error(key, fmt::format("{} is not allowed; expected {}{}", ShowValue(v), expected,
                         near.empty() ? "" : fmt::format(" (did you mean \"{}\"?)", near)));
}

Reader Reader::Object(std::string_view key, unsigned flags) {
  Describe(key, KeyInfo::Kind::kBlock, "an object", "", flags);
  const json* v = Lookup(key, flags);
  if (v != nullptr && !v->is_object()) {
    Error(key, fmt::format("{} is {}; expected an object", ShowValue(*v), TypeWord(*v)));
    v = nullptr;
  }
  return Reader(report_, v, PathOf(key), known_paths_, unknown_, CanonicalPathOf(key));
}

void Reader::Unimplemented(std::string_view key, std::vector<json> neutral) {
  if (report_->catalog != nullptr) {
    std::string values;
    for (const json& n : neutral) values += (values.empty() ? "" : ", ") + n.dump();
    Describe(key, KeyInfo::Kind::kNoEffect, "", "", kPlain, values);
  }
  Declare(key);
  if (!Has(key)) return;
  const json& v = (*object_)[std::string(key)];
  if (AsksNothing(v) || std::find(neutral.begin(), neutral.end(), v) != neutral.end()) return;
  report_->unimplemented.push_back(fmt::format("{}={}", PathOf(key), ShowValue(v)));
}

void Reader::UnimplementedKeys(std::initializer_list<std::string_view> keys) {
  for (std::string_view k : keys) Unimplemented(k);
}

void Reader::Refuse(std::string_view key, std::string_view why) {
  Describe(key, KeyInfo::Kind::kRefused, "", "", kPlain, std::string(why));
  Declare(key);
  if (Has(key)) Error(key, fmt::format("{}: {}", ShowValue((*object_)[std::string(key)]), why));
}

void Reader::Finish() {
  if (object_ == nullptr) return;
  for (const auto& [key, value] : object_->items()) {
    if (std::find(declared_.begin(), declared_.end(), key) != declared_.end()) continue;
    std::string head = fmt::format("{}: unknown key (neither zinf's nor DeepSpeed's)", PathOf(key));
    std::string near = NearestKey(key, declared_);
    if (!near.empty()) {
      unknown_->push_back({fmt::format("{}; did you mean \"{}\"?", head, near), ""});
    } else {
      unknown_->push_back({head, key});  // perhaps the right key at the wrong level
    }
  }
}

bool Reader::ToUint(std::string_view key, const json& v, uint64_t lo, uint64_t hi,
                    const std::string& expected, uint64_t* out) {
  uint64_t x = 0;
  if (v.is_number_unsigned()) {
    x = v.get<uint64_t>();
  } else if (v.is_number_integer()) {  // negative
    Error(key, fmt::format("{} is out of range; expected {}", ShowValue(v), expected));
    return false;
  } else if (v.is_number_float()) {
    // DeepSpeed configs write sizes as 1e9.
    const double d = v.get<double>();
    if (d != std::floor(d) || d < 0 || d >= 18446744073709551616.0) {
      Error(key, fmt::format("{} is {}; expected {}", ShowValue(v),
                             d < 0 ? "out of range" : "not an integer", expected));
      return false;
    }
    x = static_cast<uint64_t>(d);
  } else {
    Error(key, fmt::format("{} is {}; expected {}", ShowValue(v), TypeWord(v), expected));
    return false;
  }
  if (x < lo || x > hi) {
    Error(key, fmt::format("{} is out of range; expected {}", ShowValue(v), expected));
    return false;
  }
  *out = x;
  return true;
}

bool Reader::ToDouble(std::string_view key, const json& v, Range range, double* out) {
  if (!v.is_number()) {
    Error(key, fmt::format("{} is {}; expected {}", ShowValue(v), TypeWord(v), range.Text()));
    return false;
  }
  const double x = v.get<double>();
  if (!range.Contains(x)) {
    Error(key, fmt::format("{} is out of range; expected {}", ShowValue(v), range.Text()));
    return false;
  }
  *out = x;
  return true;
}

}  // namespace zinf::config_internal
