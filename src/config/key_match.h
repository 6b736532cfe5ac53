// src/config/key_match.h — "did you mean?" for misspelt config keys and enum values.
//
// Contract: EditDistance is the optimal-string-alignment distance (insertions, deletions,
// substitutions and swaps of two adjacent characters each cost 1), compared case-insensitively.
// NearestKey returns the candidate closest to `key` when it is a plausible typo (at most
// max(1, min(3, size/3)) edits; ties go to the earliest candidate); failing that, the longest
// candidate of which `key` is a prefix or that is a prefix of `key`, 4 characters at least
// ("stage3_prefetch" → "stage3_prefetch_bucket_size"); else an empty string.
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace zinf {

size_t EditDistance(std::string_view a, std::string_view b);
std::string NearestKey(std::string_view key, const std::vector<std::string>& candidates);

}  // namespace zinf
