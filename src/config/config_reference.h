// src/config/config_reference.h — the configuration reference (docs/config.md), generated from
// the schema so that it cannot drift from what the reader accepts.
//
// Contract: RenderConfigReference walks the schema (DescribeConfig) twice, on Config's own
// defaults and on the default job's config of `zinf train` (passed in: src/config does not
// depend on src/train), and writes one Markdown page: per block, each key with its type and
// range, its default, the default job's value where it differs, the DeepSpeed key it mirrors
// and its meaning; then the DeepSpeed keys accepted without effect and those refused. The
// meanings are a table in config_reference.cc keyed by JSON path. `problems` lists every key
// the schema declares without a meaning in that table, and every meaning whose key the schema
// does not declare: a test fails on either, and on a docs/config.md that differs from the
// page rendered here (tests/config/config_reference_test.cc, which also rewrites the page with
// ZINF_UPDATE_DOCS=1).
//
// Thread-safety: a pure function of its arguments.
#pragma once

#include <string>
#include <vector>

#include "src/config/config.h"

namespace zinf {

struct ConfigReference {
  std::string markdown;
  std::vector<std::string> problems;
};

ConfigReference RenderConfigReference(const Config& defaults, const Config& train_defaults);

}  // namespace zinf
