// Tests kernels/cpu/adam.h against PyTorch: 10 steps of torch.optim.Adam (with L2 weight
// decay) and torch.optim.AdamW on a 1M-element tensor, same inputs and hyper-parameters.
// Runs Debian's /usr/bin/python3 (python3-torch); skips when it or torch is missing.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/adam.h"
#include "tests/kernels/kernel_test_util.h"

namespace zinf::kernels {
namespace {

namespace fs = std::filesystem;

constexpr const char* kPython = "/usr/bin/python3";
constexpr size_t kN = size_t{1} << 20;
constexpr int kSteps = 10;

struct TorchCase {
  const char* mode;
  bool adamw;
  float weight_decay;
};

constexpr TorchCase kCases[] = {{"adam", false, 0.01f}, {"adamw", true, 0.1f}};
constexpr float kLr = 1e-3f, kBeta1 = 0.9f, kBeta2 = 0.999f, kEps = 1e-8f;

void WriteF32(const fs::path& path, const std::vector<float>& v) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * 4));
  ASSERT_TRUE(out.good()) << path;
}

std::vector<float> ReadF32(const fs::path& path, size_t n) {
  std::vector<float> v(n);
  std::ifstream in(path, std::ios::binary);
  in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(n * 4));
  EXPECT_EQ(in.gcount(), static_cast<std::streamsize>(n * 4)) << path;
  return v;
}

// Runs kSteps of AdamStep with `variant` and checks the result against PyTorch's.
void ExpectMatchesTorch(KernelVariant variant, const TorchCase& c, const std::vector<float>& p0,
                        const std::vector<float>& grads, const std::vector<float>& p_torch,
                        const std::vector<float>& m_torch, const std::vector<float>& v_torch) {
  std::vector<float> p = p0, m(kN, 0.0f), v(kN, 0.0f);
  // Error budgets in double (see the tolerance below).
  std::vector<double> m_mag(kN, 0.0), m_err(kN, 0.0), v_err(kN, 0.0), p_err(kN, 0.0);
  AdamOptions o;
  o.variant = variant;
  for (int k = 0; k < kSteps; ++k) {
    AdamHyper h;
    h.lr = kLr;
    h.beta1 = kBeta1;
    h.beta2 = kBeta2;
    h.eps = kEps;
    h.weight_decay = c.weight_decay;
    h.adamw = c.adamw;
    h.step = k + 1;
    for (size_t i = 0; i < kN; ++i) {
      const double l2 = c.adamw ? 0.0 : c.weight_decay * std::fabs(p[i]);
      m_mag[i] = kBeta1 * m_mag[i] + (1 - kBeta1) * (std::fabs(grads[k * kN + i]) + l2);
      p_err[i] += std::fabs(p[i]);
    }
    AdamBuffers b{p.data(), grads.data() + k * kN, DType::kF32, m.data(), v.data(), DType::kF32,
                  nullptr,  DType::kBf16,          kN};
    Result<AdamStepInfo> info = AdamStep(h, b, o);
    ASSERT_TRUE(info.ok()) << info.status().ToString();
    const double bc1 = 1 - std::pow(double{kBeta1}, k + 1);
    const double bc2 = 1 - std::pow(double{kBeta2}, k + 1);
    for (size_t i = 0; i < kN; ++i) {
      m_err[i] = kBeta1 * m_err[i] + m_mag[i];
      v_err[i] = kBeta2 * v_err[i] + v[i];
      const double denom = std::sqrt(double{v[i]}) / std::sqrt(bc2) + kEps;
      p_err[i] += kLr / bc1 * m_err[i] / denom;
    }
  }
  // Tolerance: one step's rounding is within 1e-6 of the magnitude of the terms it combines
  // (cpu_adam_test.cc derives this bound). PyTorch's fp32 arithmetic is held to the same
  // bound, and over 10 steps the per-step errors carry forward: m's and v's with the decay
  // of their recurrences (m_err = sum of beta1^j * magnitude), param's undamped, plus the
  // update's error through m (p_err = sum over steps of |p| + step_size * m_err / denom).
  // So |ours - torch| <= 1e-6 * that budget (1e-44 absolute for underflowed v).
  double worst_p = 0, worst_m = 0, worst_v = 0;
  int failures = 0;
  for (size_t i = 0; i < kN; ++i) {
    const double dp = std::fabs(double{p[i]} - p_torch[i]);
    const double dm = std::fabs(double{m[i]} - m_torch[i]);
    const double dv = std::fabs(double{v[i]} - v_torch[i]);
    const double tol_p = 1e-6 * p_err[i];
    const double tol_m = 1e-6 * m_err[i];
    const double tol_v = 1e-6 * v_err[i] + 1e-44;
    // Reported: the largest share of its bound an error uses (1 = at the bound).
    worst_p = std::max(worst_p, dp / tol_p);
    worst_m = std::max(worst_m, dm / tol_m);
    worst_v = std::max(worst_v, dv / tol_v);
    if ((dp > tol_p || dm > tol_m || dv > tol_v) && ++failures <= 5) {
      ADD_FAILURE() << VariantName(variant) << " element " << i << ": p " << p[i] << " vs "
                    << p_torch[i] << " (tol " << tol_p << "), m " << m[i] << " vs " << m_torch[i]
                    << " (tol " << tol_m << "), v " << v[i] << " vs " << v_torch[i] << " (tol "
                    << tol_v << ")";
    }
  }
  std::printf(
      "%s vs torch.optim.%s, %d steps: largest error / bound: param %.3f, "
      "exp_avg %.3f, exp_avg_sq %.3f\n",
      std::string(VariantName(variant)).c_str(), c.adamw ? "AdamW" : "Adam", kSteps, worst_p,
      worst_m, worst_v);
}

class AdamVsTorch : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(kPython)) GTEST_SKIP() << kPython << " not found";
    // 44 MB of exchange files: memory-backed /dev/shm when there is one, so the test neither
    // waits on nor disturbs a disk that may be busy (benchmarks run on this machine too).
    std::error_code ec;
    const fs::path base =
        fs::is_directory("/dev/shm", ec) ? fs::path("/dev/shm") : fs::temp_directory_path();
    dir_ = base / ("zinf_adam_torch_" + std::to_string(getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    if (!dir_.empty()) fs::remove_all(dir_, ec);
  }
  fs::path dir_;
};

// One Python run (importing torch takes seconds) computes both optimizers.
TEST_F(AdamVsTorch, TenStepsOfAdamAndAdamWMatch) {
  std::mt19937 rng(2024);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> p0(kN), grads(kN * kSteps);
  for (float& x : p0) x = normal(rng);
  for (int k = 0; k < kSteps; ++k) {
    const float scale = std::ldexp(1.0f, k % 5 - 2);  // gradients change scale between steps
    for (size_t i = 0; i < kN; ++i) grads[k * kN + i] = scale * normal(rng);
  }
  WriteF32(dir_ / "param0.f32", p0);
  WriteF32(dir_ / "grads.f32", grads);
  std::string cmd = std::string(kPython) + " " + ZINF_TORCH_ADAM_SCRIPT + " " + dir_.string() +
                    " " + std::to_string(kN) + " " + std::to_string(kSteps);
  for (float x : {kLr, kBeta1, kBeta2, kEps}) {
    char buf[64];
    std::snprintf(buf, sizeof buf, " %.17g", double{x});
    cmd += buf;
  }
  for (const TorchCase& c : kCases) {
    char buf[64];
    std::snprintf(buf, sizeof buf, " %s:%.17g", c.mode, double{c.weight_decay});
    cmd += buf;
  }
  const int status = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(status)) << cmd;
  if (WEXITSTATUS(status) == 77) GTEST_SKIP() << "torch is not importable by " << kPython;
  ASSERT_EQ(WEXITSTATUS(status), 0) << cmd;

  for (const TorchCase& c : kCases) {
    const std::string prefix = std::string(c.mode) + "_";
    const std::vector<float> p_torch = ReadF32(dir_ / (prefix + "param.f32"), kN);
    const std::vector<float> m_torch = ReadF32(dir_ / (prefix + "exp_avg.f32"), kN);
    const std::vector<float> v_torch = ReadF32(dir_ / (prefix + "exp_avg_sq.f32"), kN);
    for (KernelVariant variant : testing::ConcreteVariants()) {
      if (!testing::CpuHas(variant)) continue;
      ExpectMatchesTorch(variant, c, p0, grads, p_torch, m_torch, v_torch);
    }
  }
}

}  // namespace
}  // namespace zinf::kernels
