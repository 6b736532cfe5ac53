// src/base/units.h — byte sizes and lists as people write them on a command line.
//
// Contract: ParseBytes accepts a decimal integer with an optional binary suffix
// K, M, G, T (powers of 1024; "KiB"/"MiB"... and a trailing "B" are accepted too), e.g. "128K",
// "1M", "8MiB", "4096". Anything else is refused with a message naming the text and the
// expected form. ParseList splits on commas and parses each item.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "zinf/status.h"

namespace zinf {

Result<uint64_t> ParseBytes(std::string_view text);
// "a,b,,c" -> {"a", "b", "", "c"}; an empty text gives one empty item.
std::vector<std::string> SplitCommas(std::string_view text);
Result<std::vector<uint64_t>> ParseBytesList(std::string_view text);
Result<std::vector<uint64_t>> ParseUintList(std::string_view text);
// Duration in seconds: "10", "2.5", "500ms", "3s", "1m".
Result<double> ParseSeconds(std::string_view text);

// 1048576 -> "1M", 131072 -> "128K", 1000 -> "1000" (exact binary units only).
std::string FormatBytesShort(uint64_t bytes);
// 1536 -> "1.5 KiB", human-readable and approximate.
std::string FormatBytesHuman(uint64_t bytes);

}  // namespace zinf
