#include "src/config/key_match.h"

#include <algorithm>
#include <cctype>

namespace zinf {
namespace {

char Lower(char c) { return static_cast<char>(std::tolower(static_cast<unsigned char>(c))); }

bool IsPrefixIgnoringCase(std::string_view prefix, std::string_view s) {
  if (prefix.size() > s.size()) return false;
  for (size_t i = 0; i < prefix.size(); ++i) {
    if (Lower(prefix[i]) != Lower(s[i])) return false;
  }
  return true;
}

}  // namespace

size_t EditDistance(std::string_view a, std::string_view b) {
  const size_t n = a.size(), m = b.size();
  // Three rows: two back for the transposition, one back, current.
  std::vector<size_t> prev2(m + 1), prev(m + 1), cur(m + 1);
  for (size_t j = 0; j <= m; ++j) prev[j] = j;
  for (size_t i = 1; i <= n; ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= m; ++j) {
      const size_t cost = Lower(a[i - 1]) == Lower(b[j - 1]) ? 0 : 1;
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost});
      if (i > 1 && j > 1 && Lower(a[i - 1]) == Lower(b[j - 2]) &&
          Lower(a[i - 2]) == Lower(b[j - 1])) {
        cur[j] = std::min(cur[j], prev2[j - 2] + 1);
      }
    }
    std::swap(prev2, prev);
    std::swap(prev, cur);
  }
  return prev[m];
}

std::string NearestKey(std::string_view key, const std::vector<std::string>& candidates) {
  const size_t limit = std::max<size_t>(1, std::min<size_t>(3, key.size() / 3));
  std::string best;
  size_t best_distance = limit + 1;
  for (const auto& c : candidates) {
    size_t d = EditDistance(key, c);
    if (d < best_distance) {
      best = c;
      best_distance = d;
    }
  }
  if (!best.empty()) return best;
  // A truncated or over-long key ("stage3_prefetch" for "stage3_prefetch_bucket_size"): the
  // candidate sharing the longest prefix.
  size_t best_common = 3;
  for (const auto& c : candidates) {
    const size_t common = std::min(key.size(), c.size());
    if (common > best_common && (IsPrefixIgnoringCase(key, c) || IsPrefixIgnoringCase(c, key))) {
      best = c;
      best_common = common;
    }
  }
  return best;
}

}  // namespace zinf
