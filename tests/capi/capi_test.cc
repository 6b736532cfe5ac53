// The C ABI (include/zinf/zinf.h) through libzinf.so only: versions and status names, pinned
// buffers, file I/O round trips (buffered and O_DIRECT, odd sizes, several queued, reads past
// the end), the CPU Adam against a double-precision reference and bit for bit against zinf's
// kernel, and every call's error path naming what failed.
#include "zinf/zinf.h"

#include <cmath>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/cpu/adam.h"
#include "tests/test_util.h"

namespace {

using zinf::testing::TempDir;

std::string Last() { return zinf_last_error(); }

TEST(CapiTest, VersionAndStatusNames) {
  EXPECT_STREQ(zinf_version(), "0.1.0");
  EXPECT_EQ(zinf_version_number(), ZINF_VERSION_NUMBER);
  for (int code = ZINF_OK; code >= ZINF_E_INTERNAL; --code) {
    EXPECT_STRNE(zinf_strerror(code), "unknown status") << code;
  }
  EXPECT_STREQ(zinf_strerror(ZINF_E_OUT_OF_RANGE), "out of range");
  EXPECT_STREQ(zinf_strerror(7), "unknown status");
}

// XXH64 (seed 0) as xxHash's own test vectors give it: what checkpoints record.
TEST(CapiTest, Xxh64IsXxHashsSeedZero) {
  EXPECT_EQ(zinf_xxh64("", 0), 0xef46db3751d8e999ull);
  EXPECT_EQ(zinf_xxh64(nullptr, 0), 0xef46db3751d8e999ull);
  EXPECT_EQ(zinf_xxh64("abc", 3), 0x44bc2cf5ad770999ull);
}

TEST(CapiTest, PinnedBuffersAreAlignedAndTracked) {
  void* p = nullptr;
  ASSERT_EQ(zinf_pinned_alloc(10000, &p), ZINF_OK) << Last();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 4096, 0u);
  std::memset(p, 1, 10000);
  int local = 0;
  EXPECT_EQ(zinf_pinned_free(&local), ZINF_E_INVALID_ARGUMENT);
  EXPECT_NE(Last().find("was not returned by zinf_pinned_alloc"), std::string::npos) << Last();
  EXPECT_EQ(zinf_pinned_free(p), ZINF_OK);
  EXPECT_EQ(zinf_pinned_free(p), ZINF_E_INVALID_ARGUMENT);  // twice
  EXPECT_EQ(zinf_pinned_free(nullptr), ZINF_OK);
  EXPECT_EQ(zinf_pinned_alloc(0, &p), ZINF_E_INVALID_ARGUMENT);
  EXPECT_EQ(zinf_pinned_alloc(4096, nullptr), ZINF_E_INVALID_ARGUMENT);
}

TEST(CapiTest, IoRoundTripsBufferedWithOddSizes) {
  TempDir dir;
  zinf_io_params params = ZINF_IO_PARAMS_INIT;
  params.direct = 0;
  params.block_size = 4096;  // a transfer in several pieces
  zinf_io* io = nullptr;
  ASSERT_EQ(zinf_io_open(&params, &io), ZINF_OK) << Last();
  EXPECT_FALSE(std::string(zinf_io_engine(io)).empty());
  const std::string path = dir / "odd.bin";
  std::vector<unsigned char> out(100003), in(out.size());
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<unsigned char>(i * 7 + 3);
  // Three writes queued (the last at an odd offset), one wait.
  ASSERT_EQ(zinf_io_pwrite(io, out.data(), 50000, path.c_str(), 0), ZINF_OK) << Last();
  ASSERT_EQ(zinf_io_pwrite(io, out.data() + 50000, 50000, path.c_str(), 50000), ZINF_OK);
  ASSERT_EQ(zinf_io_pwrite(io, out.data() + 100000, 3, path.c_str(), 100000), ZINF_OK);
  uint64_t done = 0;
  ASSERT_EQ(zinf_io_wait(io, &done), ZINF_OK) << Last();
  EXPECT_EQ(done, 3u);
  ASSERT_EQ(zinf_io_sync_pread(io, in.data(), in.size(), path.c_str(), 0), ZINF_OK) << Last();
  EXPECT_EQ(in, out);
  // Past the end: an error at the wait, never a short count.
  ASSERT_EQ(zinf_io_pread(io, in.data(), 10, path.c_str(), out.size() - 5), ZINF_OK);
  EXPECT_EQ(zinf_io_wait(io, &done), ZINF_E_OUT_OF_RANGE);
  EXPECT_NE(Last().find("odd.bin"), std::string::npos) << Last();
  EXPECT_EQ(zinf_io_close(io), ZINF_OK);
}

TEST(CapiTest, IoDirectNeedsAlignmentAndNamesIt) {
  TempDir dir;
  zinf_io_params params = ZINF_IO_PARAMS_INIT;  // O_DIRECT
  zinf_io* io = nullptr;
  ASSERT_EQ(zinf_io_open(&params, &io), ZINF_OK) << Last();
  void* buf = nullptr;
  ASSERT_EQ(zinf_pinned_alloc(1 << 20, &buf), ZINF_OK);
  std::memset(buf, 0x5a, 1 << 20);
  const std::string path = dir / "direct.bin";
  ASSERT_EQ(zinf_io_sync_pwrite(io, buf, 1 << 20, path.c_str(), 0), ZINF_OK) << Last();
  std::memset(buf, 0, 1 << 20);
  ASSERT_EQ(zinf_io_sync_pread(io, buf, 1 << 20, path.c_str(), 0), ZINF_OK) << Last();
  EXPECT_EQ(static_cast<unsigned char*>(buf)[12345], 0x5a);
  // A misaligned length on an O_DIRECT file (when the file system gives it O_DIRECT).
  const int rc = zinf_io_pread(io, buf, 1000, path.c_str(), 0);
  if (rc != ZINF_OK) {
    EXPECT_EQ(rc, ZINF_E_INVALID_ARGUMENT);
    EXPECT_NE(Last().find("align"), std::string::npos) << Last();
  } else {
    EXPECT_EQ(zinf_io_wait(io, nullptr), ZINF_OK) << "a buffered file system: " << Last();
  }
  EXPECT_EQ(zinf_io_close(io), ZINF_OK);
  EXPECT_EQ(zinf_pinned_free(buf), ZINF_OK);
}

TEST(CapiTest, IoErrorsNameTheCallAndThePath) {
  TempDir dir;
  zinf_io* io = nullptr;
  EXPECT_EQ(zinf_io_open(nullptr, &io), ZINF_E_INVALID_ARGUMENT);
  zinf_io_params params = ZINF_IO_PARAMS_INIT;
  params.size = 8;
  EXPECT_EQ(zinf_io_open(&params, &io), ZINF_E_INVALID_ARGUMENT);
  EXPECT_NE(Last().find("size 8"), std::string::npos) << Last();
  params = ZINF_IO_PARAMS_INIT;
  params.engine = "bogus";
  EXPECT_EQ(zinf_io_open(&params, &io), ZINF_E_INVALID_ARGUMENT);
  EXPECT_NE(Last().find("bogus"), std::string::npos) << Last();
  params = ZINF_IO_PARAMS_INIT;
  params.direct = 0;
  ASSERT_EQ(zinf_io_open(&params, &io), ZINF_OK) << Last();
  char buf[64];
  const std::string missing = dir / "missing.bin";
  EXPECT_EQ(zinf_io_pread(io, buf, sizeof buf, missing.c_str(), 0), ZINF_E_NOT_FOUND);
  EXPECT_NE(Last().find("zinf_io_pread"), std::string::npos) << Last();
  EXPECT_NE(Last().find("missing.bin"), std::string::npos) << Last();
  EXPECT_EQ(zinf_io_pread(nullptr, buf, 1, missing.c_str(), 0), ZINF_E_INVALID_ARGUMENT);
  EXPECT_EQ(zinf_io_pread(io, nullptr, 1, missing.c_str(), 0), ZINF_E_INVALID_ARGUMENT);
  EXPECT_EQ(zinf_io_pwrite(io, buf, 1, nullptr, 0), ZINF_E_INVALID_ARGUMENT);
  EXPECT_EQ(zinf_io_wait(nullptr, nullptr), ZINF_E_INVALID_ARGUMENT);
  // A directory where a file should be.
  EXPECT_NE(zinf_io_pwrite(io, buf, 1, dir.path().c_str(), 0), ZINF_OK);
  EXPECT_NE(Last().find(dir.path()), std::string::npos) << Last();
  EXPECT_EQ(zinf_io_close(io), ZINF_OK);
  EXPECT_EQ(zinf_io_close(nullptr), ZINF_OK);
}

// Against double precision over 100 steps (AdamW, bias correction), then bit for bit against
// zinf's kernel called directly, with bf16 gradients and a bf16 copy.
TEST(CapiTest, AdamMatchesItsFormulaAndZinfsKernel) {
  constexpr int kN = 4099;
  zinf_adam_params ap = ZINF_ADAM_PARAMS_INIT;
  ap.lr = 1e-2f;
  ap.weight_decay = 0.01f;
  zinf_adam* adam = nullptr;
  ASSERT_EQ(zinf_adam_create(&ap, &adam), ZINF_OK) << Last();
  std::vector<float> p(kN), m(kN, 0), v(kN, 0);
  std::vector<double> rp(kN), rm(kN, 0), rv(kN, 0);
  for (int i = 0; i < kN; ++i) rp[i] = p[i] = 0.1f * std::sin(0.37f * i);
  std::vector<float> g(kN);
  for (int step = 1; step <= 100; ++step) {
    for (int i = 0; i < kN; ++i) g[i] = 0.01f * std::cos(0.11f * i + step);
    ASSERT_EQ(zinf_adam_step(adam, step, -1.0f, p.data(), g.data(), ZINF_DTYPE_F32, m.data(),
                             v.data(), kN, nullptr, 0),
              ZINF_OK)
        << Last();
    const double bc1 = 1 - std::pow(0.9, step), bc2 = 1 - std::pow(0.999, step);
    for (int i = 0; i < kN; ++i) {
      rm[i] = 0.9 * rm[i] + 0.1 * g[i];
      rv[i] = 0.999 * rv[i] + 0.001 * double(g[i]) * g[i];
      rp[i] = rp[i] * (1 - 1e-2 * 0.01) -
              1e-2 * (rm[i] / bc1) / (std::sqrt(rv[i] / bc2) + 1e-8);
    }
  }
  double worst = 0;
  for (int i = 0; i < kN; ++i) worst = std::max(worst, std::abs(p[i] - rp[i]));
  EXPECT_LT(worst, 2e-6) << "100 steps drift from double precision";

  // bf16 gradients and a bf16 copy, against zinf's kernel on the same inputs.
  std::vector<uint16_t> g16(kN), out16(kN), ref16(kN);
  for (int i = 0; i < kN; ++i) g16[i] = static_cast<uint16_t>(0x3c00 + (i % 97));
  std::vector<float> p2 = p, m2 = m, v2 = v;
  ASSERT_EQ(zinf_adam_step(adam, 101, 5e-3f, p.data(), g16.data(), ZINF_DTYPE_BF16, m.data(),
                           v.data(), kN, out16.data(), ZINF_DTYPE_BF16),
            ZINF_OK)
      << Last();
  zinf::kernels::AdamHyper h;
  h.lr = 5e-3f;
  h.weight_decay = 0.01f;
  h.adamw = true;
  h.step = 101;
  zinf::kernels::AdamBuffers b{p2.data(), g16.data(), zinf::kernels::DType::kBf16, m2.data(),
                               v2.data(), zinf::kernels::DType::kF32, ref16.data(),
                               zinf::kernels::DType::kBf16, kN};
  ASSERT_TRUE(zinf::kernels::AdamStep(h, b).ok());
  EXPECT_EQ(std::memcmp(p.data(), p2.data(), 4 * kN), 0);
  EXPECT_EQ(std::memcmp(m.data(), m2.data(), 4 * kN), 0);
  EXPECT_EQ(std::memcmp(v.data(), v2.data(), 4 * kN), 0);
  EXPECT_EQ(out16, ref16);
  EXPECT_EQ(zinf_adam_destroy(adam), ZINF_OK);
}

TEST(CapiTest, AdamErrorsNameTheField) {
  zinf_adam* adam = nullptr;
  zinf_adam_params ap = ZINF_ADAM_PARAMS_INIT;
  ap.beta1 = 1.0f;
  EXPECT_EQ(zinf_adam_create(&ap, &adam), ZINF_E_INVALID_ARGUMENT);
  EXPECT_NE(Last().find("params.beta1"), std::string::npos) << Last();
  ap = ZINF_ADAM_PARAMS_INIT;
  ap.eps = 0;
  EXPECT_EQ(zinf_adam_create(&ap, &adam), ZINF_E_INVALID_ARGUMENT);
  EXPECT_EQ(zinf_adam_create(nullptr, &adam), ZINF_E_INVALID_ARGUMENT);
  ap = ZINF_ADAM_PARAMS_INIT;
  ASSERT_EQ(zinf_adam_create(&ap, &adam), ZINF_OK);
  float p[4] = {}, g[4] = {}, m[4] = {}, v[4] = {};
  EXPECT_EQ(zinf_adam_step(adam, 0, -1, p, g, ZINF_DTYPE_F32, m, v, 4, nullptr, 0),
            ZINF_E_INVALID_ARGUMENT);
  EXPECT_NE(Last().find("step 0"), std::string::npos) << Last();
  EXPECT_EQ(zinf_adam_step(adam, 1, -1, p, g, 9, m, v, 4, nullptr, 0), ZINF_E_INVALID_ARGUMENT);
  EXPECT_NE(Last().find("grad_dtype 9"), std::string::npos) << Last();
  EXPECT_EQ(zinf_adam_step(adam, 1, -1, p, g, ZINF_DTYPE_F32, m, v, 4, p, ZINF_DTYPE_F32),
            ZINF_E_INVALID_ARGUMENT);
  EXPECT_NE(Last().find("param16_dtype"), std::string::npos) << Last();
  EXPECT_EQ(zinf_adam_step(adam, 1, -1, nullptr, g, ZINF_DTYPE_F32, m, v, 4, nullptr, 0),
            ZINF_E_INVALID_ARGUMENT);
  EXPECT_NE(Last().find("param is NULL"), std::string::npos) << Last();
  EXPECT_EQ(zinf_adam_step(nullptr, 1, -1, p, g, ZINF_DTYPE_F32, m, v, 4, nullptr, 0),
            ZINF_E_INVALID_ARGUMENT);
  EXPECT_EQ(zinf_adam_destroy(adam), ZINF_OK);
  EXPECT_EQ(zinf_adam_destroy(nullptr), ZINF_OK);
}

// Many tensors in one call equal each stepped alone through zinf_adam_step, bit for bit; a
// larger element size (a later header's struct) is the array's stride; errors name the index.
TEST(CapiTest, AdamStepManyEqualsOneCallPerTensor) {
  zinf_adam_params ap = ZINF_ADAM_PARAMS_INIT;
  ap.weight_decay = 0.01f;
  ap.threads = 2;
  zinf_adam* adam = nullptr;
  ASSERT_EQ(zinf_adam_create(&ap, &adam), ZINF_OK) << Last();
  const uint64_t sizes[] = {5, 0, 4096, 33, 70000};
  struct Bufs {
    std::vector<float> p, g, m, v;
    std::vector<uint16_t> p16;
  };
  auto make = [&] {
    std::vector<Bufs> out;
    uint32_t x = 12345;
    auto next = [&] { x = x * 1664525u + 1013904223u; return float(x >> 8) / 16777216.0f - 0.5f; };
    for (uint64_t n : sizes) {
      Bufs b{std::vector<float>(n), std::vector<float>(n), std::vector<float>(n),
             std::vector<float>(n), std::vector<uint16_t>(n)};
      for (uint64_t i = 0; i < n; ++i) {
        b.p[i] = next();
        b.g[i] = next();
        b.m[i] = next() * 0.1f;
        b.v[i] = std::fabs(next()) * 0.01f;
      }
      out.push_back(std::move(b));
    }
    return out;
  };
  std::vector<Bufs> alone = make(), many = make();
  for (size_t i = 0; i < alone.size(); ++i) {
    Bufs& b = alone[i];
    ASSERT_EQ(zinf_adam_step(adam, int64_t(3 + i), 2e-3f, b.p.data(), b.g.data(), ZINF_DTYPE_F32,
                             b.m.data(), b.v.data(), sizes[i], i % 2 ? nullptr : b.p16.data(),
                             ZINF_DTYPE_BF16),
              ZINF_OK) << Last();
  }
  // Elements of a grown struct: zinf_adam_tensor followed by 8 bytes a later version might add.
  struct Grown {
    zinf_adam_tensor t;
    uint64_t later;
  };
  std::vector<Grown> ts(many.size());
  for (size_t i = 0; i < many.size(); ++i) {
    Bufs& b = many[i];
    ts[i].t = {sizeof(Grown), int64_t(3 + i), b.p.data(), b.g.data(), b.m.data(), b.v.data(),
               i % 2 ? nullptr : b.p16.data(), sizes[i], ZINF_DTYPE_F32, ZINF_DTYPE_BF16};
  }
  ASSERT_EQ(zinf_adam_step_many(adam, 2e-3f, &ts[0].t, ts.size()), ZINF_OK) << Last();
  for (size_t i = 0; i < many.size(); ++i) {
    EXPECT_EQ(many[i].p, alone[i].p) << "tensor " << i;
    EXPECT_EQ(many[i].m, alone[i].m) << "tensor " << i;
    EXPECT_EQ(many[i].v, alone[i].v) << "tensor " << i;
    EXPECT_EQ(many[i].p16, alone[i].p16) << "tensor " << i;
  }
  // Errors: each names the element and nothing is stepped.
  const std::vector<float> p_before = many[2].p;
  ts[3].t.exp_avg = nullptr;
  EXPECT_EQ(zinf_adam_step_many(adam, -1, &ts[0].t, ts.size()), ZINF_E_INVALID_ARGUMENT);
  EXPECT_NE(Last().find("tensors[3].exp_avg is NULL"), std::string::npos) << Last();
  ts[3].t.exp_avg = many[3].m.data();
  ts[4].t.grad_dtype = 7;
  EXPECT_EQ(zinf_adam_step_many(adam, -1, &ts[0].t, ts.size()), ZINF_E_INVALID_ARGUMENT);
  EXPECT_NE(Last().find("tensors[4].grad_dtype 7"), std::string::npos) << Last();
  ts[4].t.grad_dtype = ZINF_DTYPE_F32;
  ts[1].t.step = 0;  // n = 0: not looked at, as zinf_adam_step does not look
  ts[1].t.grad_dtype = 99;
  ts[3].t.step = 0;
  EXPECT_EQ(zinf_adam_step_many(adam, -1, &ts[0].t, ts.size()), ZINF_E_INVALID_ARGUMENT);
  EXPECT_NE(Last().find("tensors[3].step is 0"), std::string::npos) << Last();
  ts[3].t.step = 1;
  ts[2].t.size = sizeof(zinf_adam_tensor);
  EXPECT_EQ(zinf_adam_step_many(adam, -1, &ts[0].t, ts.size()), ZINF_E_INVALID_ARGUMENT);
  EXPECT_NE(Last().find("tensors[2].size"), std::string::npos) << Last();
  EXPECT_EQ(many[2].p, p_before);
  ts[2].t.size = sizeof(Grown);
  ts[0].t.size = sizeof(Grown) + 4;  // a stride that would misalign the next elements
  EXPECT_EQ(zinf_adam_step_many(adam, -1, &ts[0].t, ts.size()), ZINF_E_INVALID_ARGUMENT);
  EXPECT_NE(Last().find("expected a multiple of 8"), std::string::npos) << Last();
  ts[0].t.size = 8;
  EXPECT_EQ(zinf_adam_step_many(adam, -1, &ts[0].t, ts.size()), ZINF_E_INVALID_ARGUMENT);
  EXPECT_EQ(zinf_adam_step_many(adam, -1, nullptr, 2), ZINF_E_INVALID_ARGUMENT);
  EXPECT_NE(Last().find("tensors is NULL"), std::string::npos) << Last();
  EXPECT_EQ(zinf_adam_step_many(nullptr, -1, &ts[0].t, 1), ZINF_E_INVALID_ARGUMENT);
  EXPECT_EQ(zinf_adam_step_many(adam, -1, nullptr, 0), ZINF_OK);
  EXPECT_EQ(zinf_adam_destroy(adam), ZINF_OK);
}

}  // namespace
