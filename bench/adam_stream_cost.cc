// bench/adam_stream_cost.cc — what one more 2-byte-per-element stream costs a memory-bound
// Adam step, whether it is written or only read.
//
// Why: issue 3 asks the fused bf16 copy of the new weights to add <= 5% to the fp32 step. By
// bytes it adds 2 to 28 (7.1%). This probe separates the cost of the copy's own store from the
// cost of any extra stream: it times, paired per iteration over the same buffers, the plain
// AVX-512 fp32 Adam step (the loop of kernels/cpu/kernels_avx512.inc without its optional
// parts) and three variants that each add one 2 B/element stream:
//   +write nt    the bf16 copy with non-temporal 64-byte stores (what zinf does)
//   +write       the same with ordinary stores (write-allocate: the line is read first)
//   +read        no copy: a 2 B/element buffer only read (summed so it is not optimised away)
// If "+read" costs about what "+write nt" costs, the copy's price is the memory system's price
// for a fifth stream, not its store.
//
// Usage: adam_stream_cost [--elements N] [--threads T] [--iters K]   (defaults 64M, 2, 31)
// Prints one line per variant: median ms and the median of per-iteration ratios to the plain
// step. x86-64 with AVX-512F/BW/BF16 only; elsewhere it says so and exits 0.
#include <immintrin.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

enum class Extra { kNone, kWriteNt, kWrite, kRead };

struct Coeffs {
  __m512 b1, ob1, b2, ob2, neg_lr, inv_bc2, eps;
};

__attribute__((target("avx512f"))) inline void Core(const Coeffs& c, __m512& p, __m512 g,
                                                     __m512& m, __m512& v) {
  m = _mm512_fmadd_ps(c.b1, m, _mm512_mul_ps(c.ob1, g));
  v = _mm512_fmadd_ps(c.b2, v, _mm512_mul_ps(_mm512_mul_ps(c.ob2, g), g));
  const __m512 d = _mm512_fmadd_ps(_mm512_sqrt_ps(v), c.inv_bc2, c.eps);
  p = _mm512_fmadd_ps(c.neg_lr, _mm512_div_ps(m, d), p);
}

constexpr size_t kPrefetch = 1024;  // bytes ahead per stream, as the production loop

// One chunk [0, n) of every buffer; returns a value derived from the read-only stream.
template <Extra kExtra>
__attribute__((target("avx512f,avx512bw,avx512bf16"))) uint32_t Chunk(float* p, const float* g,
                                                                       float* m, float* v,
                                                                       uint16_t* o, size_t n) {
  const Coeffs c{_mm512_set1_ps(0.9f),    _mm512_set1_ps(0.1f),  _mm512_set1_ps(0.999f),
                 _mm512_set1_ps(0.001f),  _mm512_set1_ps(-1e-3f), _mm512_set1_ps(1.0f),
                 _mm512_set1_ps(1e-8f)};
  __m512i acc = _mm512_setzero_si512();
  for (size_t i = 0; i + 32 <= n; i += 32) {
    for (const void* s : {static_cast<const void*>(p + i), static_cast<const void*>(g + i),
                          static_cast<const void*>(m + i), static_cast<const void*>(v + i)}) {
      _mm_prefetch(static_cast<const char*>(s) + kPrefetch, _MM_HINT_T0);
      _mm_prefetch(static_cast<const char*>(s) + kPrefetch + 64, _MM_HINT_T0);
    }
    __m512 p0 = _mm512_loadu_ps(p + i), p1 = _mm512_loadu_ps(p + i + 16);
    __m512 m0 = _mm512_loadu_ps(m + i), m1 = _mm512_loadu_ps(m + i + 16);
    __m512 v0 = _mm512_loadu_ps(v + i), v1 = _mm512_loadu_ps(v + i + 16);
    Core(c, p0, _mm512_loadu_ps(g + i), m0, v0);
    Core(c, p1, _mm512_loadu_ps(g + i + 16), m1, v1);
    _mm512_storeu_ps(p + i, p0);
    _mm512_storeu_ps(p + i + 16, p1);
    _mm512_storeu_ps(m + i, m0);
    _mm512_storeu_ps(m + i + 16, m1);
    _mm512_storeu_ps(v + i, v0);
    _mm512_storeu_ps(v + i + 16, v1);
    auto* line = reinterpret_cast<__m512i*>(o + i);  // 64-byte aligned: o and i % 32 == 0
    if constexpr (kExtra == Extra::kWriteNt) {
      _mm512_stream_si512(line, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(p1, p0)));
    } else if constexpr (kExtra == Extra::kWrite) {
      _mm512_store_si512(line, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(p1, p0)));
    } else if constexpr (kExtra == Extra::kRead) {
      _mm_prefetch(reinterpret_cast<const char*>(o + i) + kPrefetch, _MM_HINT_T0);
      acc = _mm512_add_epi32(acc, _mm512_load_si512(line));
    }
  }
  if constexpr (kExtra == Extra::kWriteNt) _mm_sfence();
  return static_cast<uint32_t>(_mm512_reduce_add_epi32(acc));
}

using ChunkFn = uint32_t (*)(float*, const float*, float*, float*, uint16_t*, size_t);

struct Buffers {
  float *p, *g, *m, *v;
  uint16_t* o;
  size_t n;
};

void* Alloc(size_t bytes) {
  void* x = std::aligned_alloc(2 << 20, (bytes + (2 << 20) - 1) / (2 << 20) * (2 << 20));
  if (x == nullptr) {
    std::fprintf(stderr, "adam_stream_cost: out of memory (%zu bytes)\n", bytes);
    std::exit(1);
  }
  madvise(x, bytes, MADV_HUGEPAGE);
  std::memset(x, 0, bytes);
  return x;
}

// One step over all elements on `threads` threads taking 32K-element chunks in turn.
double Time(ChunkFn fn, const Buffers& b, int threads, std::atomic<uint32_t>* sink) {
  constexpr size_t kChunk = size_t{32} << 10;
  std::atomic<size_t> next{0};
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      uint32_t local = 0;
      for (size_t s; (s = next.fetch_add(kChunk)) < b.n;) {
        const size_t e = std::min(b.n, s + kChunk);
        local += fn(b.p + s, b.g + s, b.m + s, b.v + s, b.o + s, e - s);
      }
      *sink += local;
    });
  }
  for (auto& th : pool) th.join();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

size_t ParseCount(const char* text) {
  char* end = nullptr;
  const unsigned long long v = std::strtoull(text, &end, 10);
  const std::string suffix = end == nullptr ? "" : end;
  const size_t mult = suffix == "K"   ? 1 << 10
                      : suffix == "M" ? 1 << 20
                      : suffix == "G" ? 1 << 30
                                      : 1;
  if (end == text || (suffix.size() > 0 && mult == 1)) {
    std::fprintf(stderr, "adam_stream_cost: '%s' is not a count (digits, optional K/M/G)\n", text);
    std::exit(2);
  }
  return static_cast<size_t>(v) * mult;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  size_t n = size_t{64} << 20;
  int threads = 2, iters = 31;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "usage: %s [--elements N] [--threads T] [--iters K]\n", argv[0]);
      return 2;
    }
    if (a == "--elements") n = ParseCount(argv[++i]) / 32 * 32;
    else if (a == "--threads") threads = static_cast<int>(ParseCount(argv[++i]));
    else if (a == "--iters") iters = static_cast<int>(ParseCount(argv[++i]));
    else {
      std::fprintf(stderr, "adam_stream_cost: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  if (n == 0 || threads < 1 || iters < 1) {
    std::fprintf(stderr, "adam_stream_cost: elements >= 32, threads >= 1, iters >= 1 expected\n");
    return 2;
  }
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw") ||
      !__builtin_cpu_supports("avx512bf16")) {
    std::printf("adam_stream_cost: this CPU lacks AVX-512F/BW/BF16; nothing measured\n");
    return 0;
  }
  Buffers b{static_cast<float*>(Alloc(4 * n)), static_cast<float*>(Alloc(4 * n)),
            static_cast<float*>(Alloc(4 * n)), static_cast<float*>(Alloc(4 * n)),
            static_cast<uint16_t*>(Alloc(2 * n)), n};
  for (size_t i = 0; i < n; ++i) {
    b.p[i] = 1.0f;
    b.g[i] = 1e-3f * static_cast<float>(i % 7);
  }
  const struct {
    const char* name;
    ChunkFn fn;
  } variants[] = {{"fp32 step", Chunk<Extra::kNone>},
                  {"+write nt (bf16 copy)", Chunk<Extra::kWriteNt>},
                  {"+write (bf16 copy)", Chunk<Extra::kWrite>},
                  {"+read (2 B/element)", Chunk<Extra::kRead>}};
  constexpr int kVariants = 4;
  std::atomic<uint32_t> sink{0};
  for (const auto& v : variants) Time(v.fn, b, threads, &sink);  // warm-up
  std::vector<std::vector<double>> t(kVariants);
  for (int it = 0; it < iters; ++it) {
    for (int k = 0; k < kVariants; ++k) t[k].push_back(Time(variants[k].fn, b, threads, &sink));
  }
  std::printf("adam_stream_cost: %zu elements, %d threads, %d paired iterations\n", n, threads,
              iters);
  for (int k = 0; k < kVariants; ++k) {
    std::vector<double> ratio;
    for (int it = 0; it < iters; ++it) ratio.push_back(t[k][it] / t[0][it]);
    std::printf("  %-24s %8.2f ms   x %.3f of the fp32 step\n", variants[k].name,
                1e3 * Median(t[k]), Median(ratio));
  }
  if (sink.load() == 0xdeadbeef) std::printf(" \n");  // keeps the read stream's sum alive
  return 0;
}
