// src/train/default_job.h — the default job of `zinf train`: the one set of defaults it starts
// from, with or without a config file.
//
// Contract: DefaultJobConfig() is the config `zinf train` runs with no file and no flags: a
// 2.7M-parameter GPT-2 (6 blocks of width 192, 6 heads, 128 tokens, byte vocabulary), 8
// sequences a step, AdamW at lr 2e-3 without weight decay under WarmupCosineLR (10 linear
// warm-up steps from 0, down to 0.1 × lr), gradient clipping 1.0, and the 16-bit weights,
// master weights and Adam moments homed on NVMe behind a 44 MiB device budget and a 24 MiB
// pinned budget, so that every unit pages. Everything else is Config's own default.
// The NVMe paths are left empty (the caller picks the swap directory), so the result does not
// pass Config::Validate() as is. `zinf train --config FILE` reads FILE onto this config
// (ConfigParseOptions::base): a key the file gives replaces the default, the others stay,
// except DeepSpeed's training semantics: a file without a scheduler block or gradient_clipping
// gets DeepSpeed's constant lr and no clipping, not this job's warm-up, cosine and clip.
// Config's struct defaults (DeepSpeed's) are unchanged for every other user.
//
// Thread-safety: a pure function.
#pragma once

#include "src/config/config.h"

namespace zinf::train {

// Config::source of the result.
inline constexpr char kDefaultJobSource[] = "<zinf train defaults>";

Config DefaultJobConfig();

}  // namespace zinf::train
