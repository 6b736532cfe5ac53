// layer_flops: one decoder layer's forward + backward on the CPU backend, GPT-2's block against a
// Llama layer of the same width, alternated, in GFLOP/s of their GEMMs and attention (issue 39:
// the Llama layer at 0.9x the GPT-2 block's rate or better). Both run through the model seam
// (src/train/model.h) as the layer executor runs them: LayerForward then LayerBackward.
//
// FLOPs counted (multiply-adds x2), the same rule for both: every GEMM of the forward (GPT-2:
// qkv, attention proj, fc, fc proj; Llama: q/k/v, o, gate/up, down), the causal attention's two
// products over the T(T+1)/2 visible pairs, and backward as twice the forward. Elementwise
// work (norms, RoPE, GELU/SwiGLU, residuals) is not counted: it is what the rate pays for.
//
// usage: layer_flops [width heads kv_heads intermediate batch seq reps threads]
//   defaults: 1024 16 4 2816 4 256 5 0 (0: all cores); prints one JSON line per model and the
//   ratio, medians of `reps` alternated runs.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "src/train/cpu_backend.h"
#include "src/train/model.h"

namespace zinf::train {
namespace {

struct Bench {
  Model model;
  std::unique_ptr<Backend<float>> be;
  int B, T;
  std::vector<float> w, dw, x, y, acts, scratch, dres;
  double flops = 0;
};

Bench Make(Model m, int B, int T, int threads, double flops) {
  Bench b{std::move(m), MakeCpuBackend<float>({.threads = threads}), B, T};
  const uint64_t NC = uint64_t(B) * T * b.model.width();
  std::mt19937 rng(1);
  std::normal_distribution<float> n(0.0f, 0.02f);
  b.w.resize(b.model.UnitParams(1));
  b.model.InitUnit(1, 7, b.w.data());
  b.dw.assign(b.w.size(), 0.0f);
  b.x.resize(NC);
  for (float& v : b.x) v = n(rng) * 50;
  b.y.resize(NC);
  b.dres.resize(NC);
  b.acts.resize(b.model.LayerActsElems(B, T));
  b.scratch.resize(b.model.LayerScratchElems(*b.be, B, T));
  b.flops = flops;
  return b;
}

double RunOnce(Bench& b) {
  std::fill(b.dres.begin(), b.dres.end(), 1e-3f);
  const auto t0 = std::chrono::steady_clock::now();
  Status s = b.model.LayerForward<float>(*b.be, b.w.data(), b.x.data(), b.y.data(),
                                         b.acts.data(), b.scratch.data(), b.B, b.T);
  if (s.ok()) {
    s = b.model.LayerBackward<float>(*b.be, b.w.data(), b.dw.data(), b.x.data(), b.acts.data(),
                                     b.dres.data(), b.scratch.data(), b.B, b.T);
  }
  if (!s.ok()) {
    std::fprintf(stderr, "layer_flops: %s\n", s.ToString().c_str());
    std::exit(1);
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int Main(int argc, char** argv) {
  auto arg = [&](int i, int def) { return argc > i ? std::atoi(argv[i]) : def; };
  const int C = arg(1, 1024), H = arg(2, 16), KV = arg(3, 4), I = arg(4, 2816);
  const int B = arg(5, 4), T = arg(6, 256), reps = arg(7, 5), threads = arg(8, 0);
  const double N = double(B) * T, d = double(C) / H, pairs = double(B) * H * T * (T + 1) / 2;
  const double attention = 2 * 2 * pairs * d;  // QK^T and AV over the visible pairs
  const double gpt_fwd = 2 * N * (3.0 * C * C + C * C + 4.0 * C * C + 4.0 * C * C) + attention;
  const double q = H * d, k = KV * d;
  const double llama_fwd = 2 * N * (C * (q + 2 * k) + q * C + 2.0 * C * I + double(I) * C) +
                           attention;
  model::ModelShape s{.arch = model::Arch::kLlama, .layers = 1, .hidden = C, .heads = H,
                      .kv_heads = KV, .head_dim = C / H, .intermediate = I, .vocab = 256,
                      .max_positions = T};
  auto llama = llama::Dims::Make(s, T);
  if (!llama.ok()) {
    std::fprintf(stderr, "layer_flops: %s\n", llama.status().ToString().c_str());
    return 2;
  }
  Bench gpt = Make(GptDims{.L = 1, .C = C, .NH = H, .V = 256, .seq = T}, B, T, threads,
                   3 * gpt_fwd);
  Bench lla = Make(Model(std::move(*llama)), B, T, threads, 3 * llama_fwd);
  RunOnce(gpt);  // warm: first touches, the BLAS's buffers
  RunOnce(lla);
  std::vector<double> tg, tl;
  for (int r = 0; r < reps; ++r) {  // alternated, so a drift of the machine hits both
    tg.push_back(RunOnce(gpt));
    tl.push_back(RunOnce(lla));
  }
  const double rg = gpt.flops / Median(tg) / 1e9, rl = lla.flops / Median(tl) / 1e9;
  std::printf("{\"model\": \"gpt2 block\", \"width\": %d, \"heads\": %d, \"batch\": %d, \"seq\": %d, "
              "\"gflop\": %.2f, \"median_s\": %.4f, \"gflops\": %.2f}\n",
              C, H, B, T, gpt.flops / 1e9, Median(tg), rg);
  std::printf("{\"model\": \"llama layer\", \"width\": %d, \"heads\": %d, \"kv_heads\": %d, "
              "\"intermediate\": %d, \"batch\": %d, \"seq\": %d, \"gflop\": %.2f, "
              "\"median_s\": %.4f, \"gflops\": %.2f}\n",
              C, H, KV, I, B, T, lla.flops / 1e9, Median(tl), rl);
  std::printf("{\"llama_over_gpt2\": %.3f, \"reps\": %d}\n", rl / rg, reps);
  return 0;
}

}  // namespace
}  // namespace zinf::train

int main(int argc, char** argv) { return zinf::train::Main(argc, argv); }
