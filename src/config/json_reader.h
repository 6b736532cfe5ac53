// src/config/json_reader.h — internal to src/config: typed, checked reads of one JSON object.
//
// Contract: a Reader walks one JSON object of a config (or nothing, when the block is absent
// or of the wrong type, so that the keys of a level are declared either way). Every getter
// declares its key; Finish() reports each key of the object no getter declared as unknown,
// with the nearest declared key when one is close. A getter leaves its output untouched when
// the key is absent, is "auto" (with kAuto) or null (with kNull), or its value is refused;
// refusals go to the ReadReport as "<json path>: <value> is <what is wrong>; expected <what
// is allowed>", and reading goes on so that one load reports every problem. A getter that
// stores a value records its path in ReadReport::given, an alias under its primary name
// ("zinf.model.n_layer" is recorded as "zinf.model.layers").
//
// Thread-safety: a Reader and what it points at belong to one thread.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "src/config/config_schema.h"

namespace zinf::config_internal {

// How a key treats DeepSpeed's "auto" and JSON null.
enum ReadFlags : unsigned {
  kPlain = 0,
  kAuto = 1,  // "auto" means the default (DeepSpeed keys; Hugging Face writes it)
  kNull = 2,  // null means absent (DeepSpeed keys whose default is None)
};

enum class Align { kAny, kPowerOfTwo, kPage };

// An interval of doubles, each end open or closed; infinite hi means unbounded.
struct Range {
  double lo;
  bool lo_open;
  double hi;
  bool hi_open;

  bool Contains(double v) const;
  std::string Text() const;  // "a number >= 0", "a number in [0, 1)"
};
Range AtLeast(double lo);
Range Above(double lo);
Range Closed(double lo, double hi);
Range HalfOpen(double lo, double hi);

// An unknown key: the message so far, and the key when a hint is still to be added (once every
// level has declared its keys).
struct UnknownKey {
  std::string message;
  std::string key;
};

template <typename E>
using Choices = std::vector<std::pair<std::string_view, E>>;

std::string ShowValue(const nlohmann::json& v);  // the JSON text, shortened
std::string TypeWord(const nlohmann::json& v);   // "a string", "an integer", ...
bool EqualsIgnoringCase(std::string_view a, std::string_view b);
// Whether a value of an unimplemented key leaves everything as it would be without it: false,
// "auto", null, a block with "enabled": false, or a block of such values.
bool AsksNothing(const nlohmann::json& v);

class Reader {
 public:
  // `path` names the object in messages (as the document spells it); `canonical_path` in
  // ReadReport::given (primary names; empty: the same as `path`).
  Reader(ReadReport* report, const nlohmann::json* object, std::string path,
         std::vector<std::string>* known_paths, std::vector<UnknownKey>* unknown,
         std::string canonical_path = {})
      : report_(report),
        object_(object),
        path_(std::move(path)),
        canonical_path_(canonical_path.empty() ? path_ : std::move(canonical_path)),
        known_paths_(known_paths),
        unknown_(unknown) {}

  bool present() const { return object_ != nullptr; }
  bool Has(std::string_view key) const;
  std::string PathOf(std::string_view key) const;  // "zero_optimization.stage"
  void Error(std::string_view key, std::string message);
  // Records `key` (or its primary name, when it is an alias) in ReadReport::given.
  void MarkGiven(std::string_view key);
  // Records `key` under `primary` in ReadReport::given from now on (a key that feeds another
  // field, as aio.io_backend feeds aio.engine); declares nothing.
  void GivenAs(std::string_view key, std::string_view primary) {
    aliases_.emplace_back(key, primary);
  }

  // With ReadReport::catalog set: records `key` there (once; a later description of the same
  // path is ignored, so a getter that calls another describes the key with its own default).
  void Describe(std::string_view key, KeyInfo::Kind kind, std::string expected,
                std::string value, unsigned flags, std::string note = {});

  // Declares `key`; returns its value when present and not an "auto"/null stand-in for the
  // default, else nullptr.
  const nlohmann::json* Lookup(std::string_view key, unsigned flags);
  // Two names for one key (DeepSpeed aliases): declares both, refuses both at once and
  // returns the one given (the primary name when neither is).
  std::string_view Alias(std::string_view primary, std::string_view alias);

  void Uint(std::string_view key, uint64_t* out, uint64_t lo, uint64_t hi, unsigned flags = kPlain);
  void Uint32(std::string_view key, uint32_t* out, uint64_t lo, uint64_t hi,
              unsigned flags = kPlain);
  void OptUint(std::string_view key, std::optional<uint64_t>* out, uint64_t lo, uint64_t hi,
               unsigned flags = kPlain);
  // An integer or a ParseBytes string ("4G"), within [lo, hi] and aligned.
  void Bytes(std::string_view key, uint64_t* out, uint64_t lo, uint64_t hi, Align align,
             unsigned flags = kPlain);
  void OptBytes(std::string_view key, std::optional<uint64_t>* out, uint64_t lo, uint64_t hi,
                Align align, unsigned flags = kPlain);
  void Double(std::string_view key, double* out, Range range, unsigned flags = kPlain);
  void OptDouble(std::string_view key, std::optional<double>* out, Range range,
                 unsigned flags = kPlain);
  // A [first, second] pair of numbers (optimizer betas).
  void DoublePair(std::string_view key, double* first, double* second, Range range,
                  unsigned flags = kPlain);
  void Bool(std::string_view key, bool* out, unsigned flags = kPlain);
  void OptBool(std::string_view key, std::optional<bool>* out, unsigned flags = kPlain);
  void String(std::string_view key, std::string* out, std::string_view what,
              unsigned flags = kPlain);
  void StringList(std::string_view key, std::vector<std::string>* out, std::string_view what);

  // One of `choices` (any case; stored as the choice). `refused` are values DeepSpeed has that
  // zinf does not offer.
  template <typename E>
  void Enum(std::string_view key, E* out, const Choices<E>& choices, unsigned flags = kPlain,
            const std::vector<std::string_view>& refused = {}) {
    if (report_->catalog != nullptr) DescribeEnum(key, *out, choices, flags, refused);
    const nlohmann::json* v = Lookup(key, flags);
    if (v == nullptr) return;
    std::vector<std::string> names;
    for (const auto& [name, value] : choices) names.emplace_back(name);
    if (v->is_string()) {
      const std::string s = v->get<std::string>();
      for (const auto& [name, value] : choices) {
        if (EqualsIgnoringCase(s, name)) {
          *out = value;
          MarkGiven(key);
          return;
        }
      }
    }
    EnumError(key, *v, names, refused);
  }

  // A nested block. Absent, null (with kNull), "auto" or not an object (refused): a reader
  // over nothing, so that its keys are still declared.
  Reader Object(std::string_view key, unsigned flags = kPlain);

  // A DeepSpeed key zinf accepts but does not act on. Silent when its value asks for nothing
  // (AsksNothing) or is one of `neutral` (what zinf does anyway); else reported.
  void Unimplemented(std::string_view key, std::vector<nlohmann::json> neutral = {});
  void UnimplementedKeys(std::initializer_list<std::string_view> keys);
  // A key DeepSpeed knows that zinf refuses outright, saying why.
  void Refuse(std::string_view key, std::string_view why);

  // Records every key of the object that no getter declared.
  void Finish();

 private:
  template <typename E>
  void DescribeEnum(std::string_view key, const E& current, const Choices<E>& choices,
                    unsigned flags, const std::vector<std::string_view>& refused) {
    std::string expected = "one of", value = "unset", note;
    for (size_t i = 0; i < choices.size(); ++i) {
      expected += std::string(i == 0 ? " \"" : ", \"") + std::string(choices[i].first) + "\"";
      if (choices[i].second == current && value == "unset") {
        value = "\"" + std::string(choices[i].first) + "\"";
      }
    }
    for (size_t i = 0; i < refused.size(); ++i) {
      note += std::string(i == 0 ? "refused: \"" : ", \"") + std::string(refused[i]) + "\"";
    }
    Describe(key, KeyInfo::Kind::kValue, expected, value, flags, note);
  }
  void Declare(std::string_view key);
  std::string CanonicalPathOf(std::string_view key) const;  // the primary name's path
  void EnumError(std::string_view key, const nlohmann::json& v,
                 const std::vector<std::string>& names,
                 const std::vector<std::string_view>& refused);
  bool ToUint(std::string_view key, const nlohmann::json& v, uint64_t lo, uint64_t hi,
              const std::string& expected, uint64_t* out);
  bool ToDouble(std::string_view key, const nlohmann::json& v, Range range, double* out);

  ReadReport* report_;
  const nlohmann::json* object_;
  std::string path_;
  std::string canonical_path_;
  std::vector<std::pair<std::string, std::string>> aliases_;  // (alias, primary) of Alias()
  std::vector<std::string>* known_paths_;
  std::vector<UnknownKey>* unknown_;
  std::vector<std::string> declared_;
};

}  // namespace zinf::config_internal
