// tests/train/token_file_util.h — writes token files with the exact layouts nanoGPT and llm.c
// use (spelled out here byte by byte, not through the code under test).
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

namespace zinf::testing {

// Little-endian, whatever the host.
inline void PutLe(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

// nanoGPT's prepare.py: np.array(ids, dtype=np.uint16).tofile(path): the tokens, nothing else.
inline std::string NanoGptBytes(const std::vector<uint16_t>& tokens) {
  std::string out;
  for (uint16_t t : tokens) PutLe(out, t, 2);
  return out;
}

// llm.c's write_datafile (GPT-2): 256 int32, [0] magic, [1] version, [2] count, the rest 0;
// then the tokens as uint16.
inline std::string LlmcBytes(const std::vector<uint16_t>& tokens, int32_t magic = 20240520,
                             int32_t version = 1, int64_t count = -1) {
  std::string out;
  PutLe(out, static_cast<uint32_t>(magic), 4);
  PutLe(out, static_cast<uint32_t>(version), 4);
  PutLe(out, static_cast<uint32_t>(count < 0 ? static_cast<int64_t>(tokens.size()) : count), 4);
  out.append(253 * 4, '\0');
  return out + NanoGptBytes(tokens);
}

inline void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// first, first + 1, ..., first + n - 1
inline std::vector<uint16_t> Iota(size_t n, uint16_t first) {
  std::vector<uint16_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint16_t>(first + i);
  return v;
}

}  // namespace zinf::testing
