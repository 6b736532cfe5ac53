#include "src/config/config_reference.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <string_view>

#include "src/config/config_schema.h"

namespace zinf {
namespace {

using config_internal::KeyInfo;

struct Meaning {
  std::string_view path;
  std::string_view ds;  // "=": DeepSpeed's key; "": zinf's own; else the relation
  std::string_view text;
};

constexpr Meaning kMeanings[] = {
#include "src/config/config_meanings.inc"
};

// The sections of the page: a block's path prefix (empty: the top level's own values).
struct Section {
  std::string_view prefix;
  std::string_view title;
};
constexpr Section kSections[] = {
    {"zero_optimization", "`zero_optimization`: where the state lives, ZeRO stages"},
    {"aio", "`aio`: the NVMe engine"},
    {"optimizer", "`optimizer`"},
    {"scheduler", "`scheduler`"},
    {"fp16", "`fp16`"},
    {"bf16", "`bf16`"},
    {"", "Batch, clipping and logging (top level)"},
    {"zinf", "`zinf`: what DeepSpeed has no key for"},
};

std::string TopOf(const std::string& path) {
  const size_t dot = path.find('.');
  return dot == std::string::npos ? std::string() : path.substr(0, dot);
}

// Markdown table cells: a pipe would end the cell.
std::string Cell(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c == '|') {
      out += "\\|";
    } else {
      out += c;
    }
  }
  return out;
}

std::string Code(std::string_view s) { return s.empty() ? std::string() : fmt::format("`{}`", s); }

std::string DefaultCell(const KeyInfo& k) {
  std::string d = k.value == "unset" ? "unset" : Code(k.value);
  if (k.accepts_auto) d += " (`\"auto\"` too)";
  return d;
}

std::string KeyCell(const KeyInfo& k) {
  std::string s = Code(k.path);
  for (const std::string& a : k.aliases) s += fmt::format(", alias `{}`", a);
  return s;
}

std::string DeepSpeedCell(const Meaning& m, const KeyInfo& k) {
  if (m.ds == "=") return "same key";
  if (m.ds.empty()) return k.kind == KeyInfo::Kind::kValue ? "zinf's own" : "";
  return std::string(m.ds);
}

constexpr std::string_view kIntro =
    R"(# Configuration reference

<!-- Generated from the schema (src/config/config_schema.cc) and the meanings in
src/config/config_meanings.inc by tests/config/config_reference_test.cc; do not edit by hand:
run that test with ZINF_UPDATE_DOCS=1 to rewrite this page. -->

One JSON file configures a run: `zinf train --config FILE`, `zinf plan --config FILE`, the C ABI
(`zinf_engine_create`) and `zinf.torch.offload(config=...)`. It uses DeepSpeed's key names
where the concept is the same, so a DeepSpeed ZeRO-3 config with NVMe offload loads as it is
(`examples/deepspeed_zero3_nvme.json`), and a `zinf` block for the rest.

How a file is read:
- A key that is neither zinf's nor DeepSpeed's is refused, naming its path and the nearest valid
  key (`did you mean "offload_param"?`). Wrong types and out-of-range values are refused naming
  the field, the value and what is allowed; malformed JSON is reported with line and column.
  Every problem of a file is reported at once.
- DeepSpeed keys zinf accepts without acting on them (listed at the end) are named together in
  one warning unless their value asks for nothing (false, `"auto"`, null, a block with
  `"enabled": false`, or the neutral value listed); with `"zinf": {"strict": true}` (or
  `zinf train --strict`) that warning is an error.
- `"auto"` (which Hugging Face's integration writes) means the default, where the table says so.
- Byte sizes take an integer or a string with a binary suffix (`"512M"`, `"4G"`); DeepSpeed's
  element counts (`buffer_size`, `stage3_*`) stay element counts.
- `zinf train` reads the file onto its default job (a small GPT-2 on NVMe): a key the file leaves
  out keeps the default job's value (the column "zinf train" shows where it differs), except
  DeepSpeed's training semantics: no `scheduler` block means a constant learning rate, no
  `gradient_clipping` means no clipping (neither `bf16` nor `fp16` enabled would mean fp32 in
  DeepSpeed: zinf trains with a bf16 working copy then, and warns). The `optimizer` and `scheduler` blocks and the three batch keys are replaced whole when the file
  gives any part of them. `zinf train --print-config` shows every value and where it came from.

)";

}  // namespace

ConfigReference RenderConfigReference(const Config& defaults, const Config& train_defaults) {
  ConfigReference r;
  const std::vector<KeyInfo> keys = config_internal::DescribeConfig(defaults);
  const std::vector<KeyInfo> train_keys = config_internal::DescribeConfig(train_defaults);
  std::map<std::string, std::string> train_value;
  for (const KeyInfo& k : train_keys) train_value[k.path] = k.value;
  std::map<std::string_view, const Meaning*> meaning;
  for (const Meaning& m : kMeanings) {
    if (!meaning.emplace(m.path, &m).second) {
      r.problems.push_back(fmt::format("{}: two meanings in config_meanings.inc", m.path));
    }
  }
  // Alias names a no-effect key is declared under too (stage3_* and their short names).
  std::vector<std::string> alias_paths;
  for (const KeyInfo& k : keys) {
    alias_paths.insert(alias_paths.end(), k.aliases.begin(), k.aliases.end());
  }
  auto is_alias = [&](const std::string& p) {
    return std::find(alias_paths.begin(), alias_paths.end(), p) != alias_paths.end();
  };

  std::string& md = r.markdown;
  md += kIntro;
  for (const Section& s : kSections) {
    md += fmt::format("## {}\n\n", s.title);
    md += "| Key | Type | Default | zinf train | DeepSpeed | Meaning |\n";
    md += "| --- | --- | --- | --- | --- | --- |\n";
    for (const KeyInfo& k : keys) {
      if (k.kind != KeyInfo::Kind::kValue) continue;
      const bool in_section = s.prefix.empty() ? TopOf(k.path).empty()
                                               : k.path.rfind(std::string(s.prefix) + ".", 0) == 0;
      if (!in_section) continue;
      auto m = meaning.find(k.path);
      if (m == meaning.end()) {
        r.problems.push_back(fmt::format(
            "{}: the schema declares it and config_meanings.inc has no meaning for it", k.path));
        continue;
      }
      const std::string& type = k.expected;
      const std::string train = train_value[k.path];
      md += fmt::format("| {} | {} | {} | {} | {} | {} |\n", KeyCell(k), Cell(type),
                        Cell(DefaultCell(k)),
                        train == k.value ? "" : Cell(train == "unset" ? train : Code(train)),
                        Cell(DeepSpeedCell(*m->second, k)), Cell(m->second->text));
    }
    md += "\n";
  }

  md += "## DeepSpeed keys accepted without effect\n\n";
  md += "zinf does this work its own way (its staging is the pinned budget, it prefetches whole "
        "units, it steps the optimizer a unit at a time), or does not offer the feature. Each "
        "key is checked where its type is shown, and named in the one warning (an error with "
        "`zinf.strict`) unless its value asks for nothing or is the neutral value listed.\n\n";
  md += "| Key | Type | Neutral values |\n| --- | --- | --- |\n";
  for (const KeyInfo& k : keys) {
    if (k.kind != KeyInfo::Kind::kNoEffect || is_alias(k.path)) continue;
    if (meaning.count(k.path) != 0) {
      r.problems.push_back(
          fmt::format("{}: has a meaning in config_meanings.inc but zinf does not act on it", k.path));
    }
    std::string key = KeyCell(k);
    md += fmt::format("| {} | {} | {} |\n", key, Cell(k.expected),
                      Cell(k.note.empty() ? "" : Code(k.note)));
  }
  md += "\n## DeepSpeed keys refused\n\n";
  md += "| Key | Why |\n| --- | --- |\n";
  for (const KeyInfo& k : keys) {
    if (k.kind == KeyInfo::Kind::kRefused) {
      md += fmt::format("| {} | {} |\n", Code(k.path), Cell(k.note));
    }
  }
  for (const KeyInfo& k : keys) {
    if (k.kind == KeyInfo::Kind::kValue && !k.note.empty()) {
      md += fmt::format("| {} values | {} |\n", Code(k.path),
                        Cell(fmt::format("DeepSpeed's, not implemented in zinf ({})", k.note)));
    }
  }
  for (const Meaning& m : kMeanings) {
    const bool declared = std::any_of(keys.begin(), keys.end(), [&](const KeyInfo& k) {
      return k.path == m.path && k.kind == KeyInfo::Kind::kValue;
    });
    if (!declared) {
      r.problems.push_back(fmt::format(
          "{}: config_meanings.inc has a meaning for it and the schema declares no such value",
          m.path));
    }
  }
  return r;
}

}  // namespace zinf
