// bench/adam_vs_deepspeed.cc — zinf's CPU Adam (kernels/cpu/adam.h) against DeepSpeed's
// (csrc/includes/cpu_adam.h, Adam_Optimizer::Step_AVX<8>, what DeepSpeedCPUAdam runs for fp32)
// at each tensor size, paired in one process on the same buffers.
//
// Built only when CMake is given -DZINF_DEEPSPEED_SRC=<a DeepSpeed checkout>: DeepSpeed's
// header is compiled into this file with DeepSpeed's own flags for its CPU Adam (-O3
// -march=native -fopenmp -D__AVX512__), torch replaced by bench/deepspeed_shim. zinf's kernel
// is the library's, as zinf ships it (runtime dispatch, oneTBB threads).
//
// Per size: fp32 parameters, gradients and moments; each timed sample is `calls` back-to-back
// steps (64M elements' worth, at least one: tens of milliseconds, so that waking the threads
// after the pause below is amortized as in a long optimizer step), and small tensors pay their
// per-call cost as a framework stepping many of them does. The two kernels alternate (the order
// flips every round), each after a pause that lets the other's idle threads stop spinning:
// with no pause, OpenMP's spinning worker takes a core from zinf's next sample and halves its
// speed at 256K elements on 2 cores (with OMP_WAIT_POLICY=passive the reverse). libgomp's
// worker spins 6.1-6.2 ms after a parallel region (measured with its thread CPU clock), so the
// default pause is 10 ms. Longer pauses also leave this VM's cores idle before each sample;
// --pause-ms 30 (the earlier default) measures that cold start, where oneTBB 2021.8's worker,
// asleep between calls, wakes late for the first calls (README, issue 13's table). Each
// round's ratio t(DeepSpeed) / t(zinf) is kept: above 1, zinf is faster. The medians over the
// rounds are printed, one line per size, with a bootstrap 95% interval.
//
//   adam_vs_deepspeed [--sizes 16K,256K,1M,64M] [--threads 2] [--rounds 9] [--weight-decay 0]
//                     [--zinf-chunk 32K] [--pause-ms 10]
#include <omp.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cpu_adam.h"  // DeepSpeed's
#include "kernels/cpu/adam.h"

namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

size_t ParseSize(const std::string& s) {
  char* end = nullptr;
  size_t n = std::strtoull(s.c_str(), &end, 10);
  if (*end == 'K' || *end == 'k') n <<= 10;
  if (*end == 'M' || *end == 'm') n <<= 20;
  if (*end == 'G' || *end == 'g') n <<= 30;
  return n;
}

float* Alloc(size_t n) {
  const size_t bytes = std::max<size_t>(n * 4, 2 << 20);
  const size_t rounded = (bytes + (2 << 20) - 1) / (2 << 20) * (2 << 20);
  auto* p = static_cast<float*>(std::aligned_alloc(2 << 20, rounded));
  if (p == nullptr) {
    std::fprintf(stderr, "adam_vs_deepspeed: cannot allocate %zu bytes\n", rounded);
    std::exit(1);
  }
  madvise(p, rounded, MADV_HUGEPAGE);
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  std::string sizes = "16K,64K,256K,1M,4M,16M,64M,256M";
  int threads = 2, rounds = 9;
  float weight_decay = 0.0f;
  size_t chunk = 0;  // zinf's chunk_elems; 0: its default
  int pause_ms = 10;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--sizes") sizes = v;
    else if (k == "--threads") threads = std::atoi(v.c_str());
    else if (k == "--rounds") rounds = std::atoi(v.c_str());
    else if (k == "--weight-decay") weight_decay = std::strtof(v.c_str(), nullptr);
    else if (k == "--zinf-chunk") chunk = ParseSize(v);
    else if (k == "--pause-ms") pause_ms = std::atoi(v.c_str());
    else {
      std::fprintf(stderr, "adam_vs_deepspeed: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  if (threads < 1 || rounds < 1 || pause_ms < 0) {
    std::fprintf(stderr, "adam_vs_deepspeed: --threads and --rounds must be >= 1, --pause-ms >= 0\n");
    return 2;
  }
  omp_set_num_threads(threads);
  std::printf("zinf CPU Adam vs DeepSpeed Step_AVX<8> (fp32, AdamW, weight_decay %g), %d "
              "threads, medians of %d alternated rounds, %d ms pauses\n",
              weight_decay, threads, rounds, pause_ms);
  std::printf("%10s %7s %12s %12s %14s   %s\n", "elements", "calls", "zinf ns/el", "DS ns/el",
              "DS/zinf time", "95% interval");
  size_t from = 0;
  while (from <= sizes.size()) {
    const size_t comma = std::min(sizes.find(',', from), sizes.size());
    const size_t n = ParseSize(sizes.substr(from, comma - from));
    from = comma + 1;
    if (n == 0 || n % 128 != 0) {
      std::fprintf(stderr, "adam_vs_deepspeed: sizes must be multiples of 128 elements\n");
      return 2;
    }
    float *p = Alloc(n), *g = Alloc(n), *m = Alloc(n), *v = Alloc(n);
    for (size_t i = 0; i < n; ++i) {
      p[i] = 0.01f * static_cast<float>(i % 197) - 1.0f;
      g[i] = 1e-3f * (static_cast<float>(i % 89) - 44.0f);
      m[i] = 0.0f;
      v[i] = 0.0f;
    }
    const size_t calls = std::clamp<size_t>((size_t{64} << 20) / n, 1, 100000);
    zinf::kernels::AdamHyper hyper;
    hyper.adamw = true;
    hyper.weight_decay = weight_decay;
    zinf::kernels::AdamOptions zopt;
    zopt.threads = threads;
    if (chunk != 0) zopt.chunk_elems = chunk;
    zinf::kernels::AdamBuffers b;
    b.param = p;
    b.grad = g;
    b.exp_avg = m;
    b.exp_avg_sq = v;
    b.n = n;
    Adam_Optimizer ds(hyper.lr, hyper.beta1, hyper.beta2, hyper.eps, weight_decay, true);
    int64_t step = 0;
    auto zinf_step = [&] {
      hyper.step = ++step;
      if (!zinf::kernels::AdamStep(hyper, b, zopt).ok()) std::abort();
    };
    auto ds_step = [&] {
      ++step;
      ds.IncrementStep(static_cast<size_t>(step), hyper.beta1, hyper.beta2);
      ds.update_state(hyper.lr, hyper.eps, weight_decay, true);
      size_t rounded = 0;
      ds.Step_AVX<8>(&rounded, p, g, m, v, n);
      if (rounded != n) std::abort();
    };
    auto time = [&](auto& f) {
      // The other kernel's threads stop spinning (OpenMP's and oneTBB's workers spin a while
      // after their work, and on a machine with as many cores as threads they would take the
      // cores this kernel needs); then one untimed call wakes this one's threads and caches.
      std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms));
      f();
      const auto t0 = std::chrono::steady_clock::now();
      for (size_t c = 0; c < calls; ++c) f();
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() /
             static_cast<double>(calls);
    };
    std::vector<double> tz, td, ratio;
    for (int r = 0; r < rounds; ++r) {
      double a, d;
      if (r % 2 == 0) {
        a = time(zinf_step);
        d = time(ds_step);
      } else {
        d = time(ds_step);
        a = time(zinf_step);
      }
      tz.push_back(a);
      td.push_back(d);
      ratio.push_back(d / a);
    }
    // A 95% interval for the median ratio: the median of 4000 resamples of the rounds' paired
    // ratios (with replacement), their 2.5th and 97.5th percentiles.
    std::mt19937_64 rng(12345);
    std::uniform_int_distribution<size_t> pick(0, ratio.size() - 1);
    std::vector<double> boot, resample(ratio.size());
    for (int k = 0; k < 4000; ++k) {
      for (double& x : resample) x = ratio[pick(rng)];
      boot.push_back(Median(resample));
    }
    std::sort(boot.begin(), boot.end());
    std::printf("%10zu %7zu %12.3f %12.3f %14.3f   [%.3f, %.3f]\n", n, calls,
                Median(tz) * 1e9 / n, Median(td) * 1e9 / n, Median(ratio),
                boot[boot.size() * 25 / 1000], boot[boot.size() * 975 / 1000]);
    std::fflush(stdout);
    std::free(p);
    std::free(g);
    std::free(m);
    std::free(v);
  }
  return 0;
}
