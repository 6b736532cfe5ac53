// The GPT-2 model code (src/train/gpt.h) against PyTorch: a tiny model's loss and the gradient of
// every parameter, from ResidentForwardBackward on the CPU backend (double and float), against
// nanoGPT's GPT (model.py: pre-LN blocks with biases, learned positions, GELU-tanh, causal
// attention scaled by 1/sqrt(head_dim), lm_head tied to wte, mean cross-entropy) in float64 torch.
// The weights travel as a safetensors file under nanoGPT's names, so the test also pins the names
// and shapes --init/--save use: the script refuses a name or shape nanoGPT does not have.
// Runs Debian's /usr/bin/python3 (python3-torch, 1.13) with tests/train/gpt_torch_ref.py; skips
// when it or torch is missing.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "src/train/cpu_backend.h"
#include "src/train/gpt.h"
#include "src/train/model.h"
#include "src/train/safetensors.h"
#include "tests/test_util.h"

namespace zinf::train {
namespace {

constexpr const char* kPython = "/usr/bin/python3";

struct TorchCase {
  const char* name;
  GptDims d;
  int B, T;             // T <= d.seq: positions T.. of wpe are unused (zero gradient)
  float weight_scale;   // multiplies InitUnit's matrices and embeddings
  Dtype file_dtype;     // how the weights travel (both are exact: the weights are floats)
  uint64_t seed;
};

// "init": GPT-2's init as the trainer starts from it. Its attention is nearly uniform and its
// logits nearly flat, so a mistake in the attention's scale or the softmax would move the
// gradients by only ~1e-3 relative (still 1e7 times the tolerance below); "sharp" scales the
// weights by 10 (std 0.2) so attention is peaked, GELU works in its curved part and the logits
// are well away from uniform, and runs a sequence shorter than wpe (nanoGPT's t < block_size).
const TorchCase kInit{"init", {.L = 2, .C = 16, .NH = 4, .V = 37, .seq = 8}, 3, 8, 1.0f,
                      Dtype::kF64, 5};
const TorchCase kSharp{"sharp", {.L = 2, .C = 16, .NH = 4, .V = 37, .seq = 11}, 2, 7, 10.0f,
                       Dtype::kF32, 9};

struct Inputs {
  std::vector<std::vector<float>> params;  // per unit; the model (float-representable)
  std::vector<int32_t> tokens, targets;
};

// InitUnit's weights, then LayerNorm weights 1 + N(0, 0.1²) and biases N(0, 0.05²) so that
// neither is a special case (LN weight 1 hides a missing multiply, bias 0 a missing add).
Inputs MakeInputs(const TorchCase& c) {
  Inputs in;
  std::mt19937_64 rng(c.seed);
  std::normal_distribution<double> ln_noise(0.0, 0.1), bias_noise(0.0, 0.05);
  for (uint32_t u = 0; u < c.d.units(); ++u) {
    std::vector<float> w(c.d.UnitParams(u));
    InitUnit(c.d, u, c.seed, w.data());
    for (const TensorInfo& t : UnitTensors(c.d, u)) {
      float* p = w.data() + t.offset;
      const bool bias = t.name.ends_with(".bias");
      const bool ln = t.name.find("ln_") != std::string::npos;
      for (uint64_t i = 0; i < t.elems; ++i) {
        if (bias) {
          p[i] = static_cast<float>(bias_noise(rng));
        } else if (ln) {
          p[i] = static_cast<float>(1.0 + ln_noise(rng));
        } else {
          p[i] *= c.weight_scale;
        }
      }
    }
    in.params.push_back(std::move(w));
  }
  std::mt19937 trng(static_cast<uint32_t>(c.seed));
  for (int i = 0; i < c.B * c.T; ++i) {
    in.tokens.push_back(static_cast<int32_t>(trng() % static_cast<uint32_t>(c.d.V)));
    in.targets.push_back(static_cast<int32_t>(trng() % static_cast<uint32_t>(c.d.V)));
  }
  return in;
}

// Writes CASE.weights.safetensors (nanoGPT's names, the dims in __metadata__) and
// CASE.batch.safetensors (tokens, targets as I32 (B, T)).
void WriteInputs(const std::string& dir, const TorchCase& c, const Inputs& in) {
  std::vector<std::vector<double>> as_f64;
  for (const auto& p : in.params) as_f64.emplace_back(p.begin(), p.end());
  std::vector<TensorToWrite> tensors;
  for (uint32_t u = 0; u < c.d.units(); ++u) {
    for (const TensorInfo& t : UnitTensors(c.d, u)) {
      TensorToWrite w;
      w.name = t.name;
      w.dtype = c.file_dtype;
      for (int64_t s : t.shape) w.shape.push_back(static_cast<uint64_t>(s));
      w.data = c.file_dtype == Dtype::kF64 ? static_cast<const void*>(as_f64[u].data() + t.offset)
                                           : static_cast<const void*>(in.params[u].data() + t.offset);
      tensors.push_back(std::move(w));
    }
  }
  SafetensorsMetadata meta = {{"n_layer", std::to_string(c.d.L)},
                              {"n_head", std::to_string(c.d.NH)},
                              {"n_embd", std::to_string(c.d.C)},
                              {"vocab_size", std::to_string(c.d.V)},
                              {"block_size", std::to_string(c.d.seq)}};
  Status s = WriteSafetensors(dir + "/" + c.name + ".weights.safetensors", tensors, meta);
  ASSERT_TRUE(s.ok()) << s.ToString();
  const std::vector<uint64_t> bt = {static_cast<uint64_t>(c.B), static_cast<uint64_t>(c.T)};
  s = WriteSafetensors(dir + "/" + c.name + ".batch.safetensors",
                       {{"tokens", Dtype::kI32, bt, in.tokens.data()},
                        {"targets", Dtype::kI32, bt, in.targets.data()}});
  ASSERT_TRUE(s.ok()) << s.ToString();
}

// torch's loss and gradients, read back from CASE.grads.safetensors into the units' layout.
struct Reference {
  double loss = 0;
  std::vector<std::vector<double>> grads;  // per unit
};

Reference ReadReference(const std::string& dir, const TorchCase& c) {
  Reference ref;
  auto f = SafetensorsFile::Open(dir + "/" + c.name + ".grads.safetensors");
  EXPECT_TRUE(f.ok()) << f.status().ToString();
  if (!f.ok()) return ref;
  Status s = f->Read("loss", &ref.loss, sizeof(double));
  EXPECT_TRUE(s.ok()) << s.ToString();
  size_t names = 1;
  for (uint32_t u = 0; u < c.d.units(); ++u) {
    ref.grads.emplace_back(c.d.UnitParams(u));
    for (const TensorInfo& t : UnitTensors(c.d, u)) {
      const SafetensorsTensor* st = f->Find(t.name);
      EXPECT_TRUE(st != nullptr) << "torch wrote no gradient for " << t.name;
      if (st == nullptr) continue;
      EXPECT_EQ(st->dtype, Dtype::kF64) << t.name;
      s = f->Read(t.name, ref.grads[u].data() + t.offset, t.elems * sizeof(double));
      EXPECT_TRUE(s.ok()) << s.ToString();
      ++names;
    }
  }
  EXPECT_EQ(f->tensors().size(), names) << "torch has parameters our model does not";
  return ref;
}

// Runs our model on the inputs in precision T; returns the loss, fills grads (per unit).
template <typename T>
double RunOurs(const TorchCase& c, const Inputs& in, T loss_scale,
               std::vector<std::vector<double>>& grads_out) {
  auto be = MakeCpuBackend<T>({.threads = 1});
  std::vector<std::vector<T>> params, grads;
  std::vector<const T*> p;
  std::vector<T*> g;
  for (const auto& x : in.params) {
    params.emplace_back(x.begin(), x.end());
    grads.emplace_back(x.size(), T(0));
  }
  for (auto& x : params) p.push_back(x.data());
  for (auto& x : grads) g.push_back(x.data());
  auto loss = ResidentForwardBackward<T>(*be, c.d, p, g, in.tokens.data(), in.targets.data(), c.B,
                                         c.T, loss_scale);
  EXPECT_TRUE(loss.ok()) << loss.status().ToString();
  grads_out.clear();
  for (auto& x : grads) grads_out.emplace_back(x.begin(), x.end());
  return loss.ok() ? *loss : NAN;
}

// Every element of every tensor: |ours / scale - torch| <= tol * (largest |torch| in the tensor).
// Returns the largest error over that bound's scale (the tolerance actually used, in units of
// each tensor's largest gradient).
double CompareGradients(const TorchCase& c, const std::vector<std::vector<double>>& ours,
                        const Reference& ref, double scale, double tol, const char* what) {
  double worst = 0;
  for (uint32_t u = 0; u < c.d.units(); ++u) {
    for (const TensorInfo& t : UnitTensors(c.d, u)) {
      double gmax = 0;
      for (uint64_t i = 0; i < t.elems; ++i) {
        gmax = std::max(gmax, std::abs(ref.grads[u][t.offset + i]));
      }
      // A tensor whose gradient is zero would make the comparison vacuous.
      EXPECT_GT(gmax, 0.0) << t.name;
      int failures = 0;
      for (uint64_t i = 0; i < t.elems; ++i) {
        const double want = ref.grads[u][t.offset + i];
        const double got = ours[u][t.offset + i] / scale;
        const double err = std::abs(got - want) / gmax;
        worst = std::max(worst, err);
        if (!(err <= tol) && ++failures <= 3) {
          ADD_FAILURE() << c.name << " " << what << ": " << t.name << "[" << i << "] = " << got
                        << ", torch " << want << " (error " << err << " of the tensor's largest "
                        << gmax << ", tolerance " << tol << ")";
        }
      }
    }
  }
  return worst;
}

class GptVsTorch : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(kPython)) GTEST_SKIP() << kPython << " not found";
    ASSERT_FALSE(dir_.path().empty());
  }

  // Writes the case's inputs, runs the script; false (with the test skipped) without torch.
  bool RunTorch(const TorchCase& c, const Inputs& in) {
    WriteInputs(dir_.path(), c, in);
    if (HasFatalFailure()) return false;
    const std::string cmd = std::string(kPython) + " " + ZINF_GPT_TORCH_SCRIPT + " " +
                            dir_.path() + " " + c.name;
    const int status = std::system(cmd.c_str());
    EXPECT_TRUE(WIFEXITED(status)) << cmd;
    if (!WIFEXITED(status)) return false;
    if (WEXITSTATUS(status) == 77) {
      skipped_ = true;
      return false;
    }
    EXPECT_EQ(WEXITSTATUS(status), 0) << cmd;
    return WEXITSTATUS(status) == 0;
  }

  // The whole comparison for one case.
  void Check(const TorchCase& c) {
    const Inputs in = MakeInputs(c);
    if (!RunTorch(c, in)) {
      if (skipped_) GTEST_SKIP() << "torch is not importable by " << kPython;
      return;
    }
    const Reference ref = ReadReference(dir_.path(), c);
    if (HasFailure()) return;
    // Not a degenerate model: the loss is near log(V) (init) or above it (sharp logits).
    EXPECT_GT(ref.loss, 0.5 * std::log(c.d.V));
    EXPECT_LT(ref.loss, 10 * std::log(c.d.V));

    // Double vs torch's float64. Both evaluate the same expression on the same (exactly
    // representable) weights in IEEE double; they differ only in the order of the additions
    // (GEMM blocking, reductions, softmax/LayerNorm sums) and in exp/tanh/sqrt's last-ulp
    // rounding. Each gradient element is a sum of at most a few thousand products through ~30
    // chained ops, each rounding within 2^-53 ≈ 1.1e-16 of the magnitude of what it combines, so
    // the difference is ~1e-13 of the tensor's gradient scale (cancellation in one element does
    // not matter: the bound is against the tensor's largest gradient, not the element's own).
    // 1e-10 leaves a 1000x margin above that and is ~1e7 below any real mistake (a wrong term,
    // scale or mask moves gradients by >= 1e-3 relative here).
    std::vector<std::vector<double>> gd;
    const double ld = RunOurs<double>(c, in, 1.0, gd);
    EXPECT_NEAR(ld, ref.loss, 1e-12 * ref.loss);
    const double worst_d = CompareGradients(c, gd, ref, 1.0, 1e-10, "double");

    // The loss scale multiplies the gradients (not the loss); 1024 is a power of two, so the
    // scaled gradients are the unscaled ones to the same tolerance.
    std::vector<std::vector<double>> gs;
    const double ls = RunOurs<double>(c, in, 1024.0, gs);
    EXPECT_NEAR(ls, ref.loss, 1e-12 * ref.loss);
    CompareGradients(c, gs, ref, 1024.0, 1e-10, "double, loss scale 1024");

    // Float (the training precision) vs torch's float64: the same argument with fp32's
    // 2^-24 ≈ 6e-8 per operation gives ~1e-6 of the tensor's scale (measured: see the printout);
    // we allow 2e-5 relative to the tensor's largest gradient, and 1e-6 relative on the loss.
    std::vector<std::vector<double>> gf;
    const double lf = RunOurs<float>(c, in, 1.0f, gf);
    EXPECT_NEAR(lf, ref.loss, 1e-6 * ref.loss);
    const double worst_f = CompareGradients(c, gf, ref, 1.0, 2e-5, "float");

    std::printf("%s: torch loss %.17g; ours: double %.17g (diff %.2e), float %.9g (diff %.2e); "
                "largest gradient error / tensor's largest gradient: double %.2e, float %.2e\n",
                c.name, ref.loss, ld, ld - ref.loss, lf, lf - ref.loss, worst_d, worst_f);
  }

  testing::TempDir dir_;
  bool skipped_ = false;
};

TEST_F(GptVsTorch, InitWeightsMatchNanoGpt) { Check(kInit); }

TEST_F(GptVsTorch, SharpWeightsAndShortSequenceMatchNanoGpt) { Check(kSharp); }

}  // namespace
}  // namespace zinf::train
