// The C ABI's engine (include/zinf/zinf.h) through libzinf.so only: registered tensors paged
// between the device, pinned memory and NVMe under budgets smaller than the tensors; content
// through every tier; the prefetcher following the caller's loop; the Adam step over registered
// tensors bit for bit equal to zinf_adam_step on plain buffers; leases from several threads; and
// every misuse a clear status naming what failed.
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/test_util.h"
#include "zinf/zinf.h"

namespace {

using zinf::testing::TempDir;

std::string Last() { return zinf_last_error(); }

constexpr uint64_t kMiB = 1 << 20;

// A config with the swap file in `dir`, a device budget of `device_mib` and a pinned budget of
// `pinned_mib`.
std::string ConfigJson(const std::string& dir, uint64_t device_mib, uint64_t pinned_mib) {
  return fmt::format(R"({{"zinf": {{"swap_dir": "{}", "budgets": {{"device_bytes": "{}M",
      "pinned_bytes": "{}M"}}}}, "aio": {{"block_size": 262144}}}})",
                     dir, device_mib, pinned_mib);
}

struct Engine {
  zinf_engine* e = nullptr;
  explicit Engine(const std::string& json, zinf_engine_params p = ZINF_ENGINE_PARAMS_INIT) {
    p.config_json = json.c_str();
    p.device = "host";
    int rc = zinf_engine_open(&p, &e);
    EXPECT_EQ(rc, ZINF_OK) << Last();
  }
  ~Engine() { EXPECT_EQ(zinf_engine_close(e), ZINF_OK) << Last(); }
  uint64_t Register(const char* name, uint64_t bytes, int home, uint32_t unit,
                    int role = ZINF_ROLE_PARAM) {
    zinf_tensor_spec s = ZINF_TENSOR_SPEC_INIT;
    s.name = name;
    s.bytes = bytes;
    s.home = home;
    s.unit = unit;
    s.role = role;
    uint64_t id = ZINF_NO_TENSOR;
    EXPECT_EQ(zinf_tensor_register(e, &s, &id), ZINF_OK) << Last();
    return id;
  }
  nlohmann::json Stats() {
    const char* j = nullptr;
    EXPECT_EQ(zinf_engine_stats(e, &j), ZINF_OK) << Last();
    return nlohmann::json::parse(j);
  }
};

std::vector<uint32_t> Pattern(uint64_t bytes, uint32_t seed) {
  std::vector<uint32_t> v(bytes / 4);
  for (size_t i = 0; i < v.size(); ++i) v[i] = seed * 2654435761u + static_cast<uint32_t>(i);
  return v;
}

// 12 tensors of 1 MiB (8 on NVMe, 4 in pinned memory) through a 3 MiB device budget and a
// 7 MiB pinned budget (one lease at a time in each tier): each step reads every tensor on the device in order and adds one to
// every word; three steps later each holds its pattern plus 3, the prefetcher has followed the
// loop, and neither budget was exceeded.
TEST(CapiEngineTest, TensorsLargerThanTheBudgetsPageThroughEveryTier) {
  TempDir dir;
  zinf_engine_params p = ZINF_ENGINE_PARAMS_INIT;
  p.device_leases[ZINF_ROLE_PARAM] = 1;
  p.host_leases[ZINF_ROLE_PARAM] = 1;
  Engine eng(ConfigJson(dir.path(), 3, 7), p);
  std::vector<uint64_t> ids;
  for (uint32_t i = 0; i < 12; ++i) {
    const std::string name = fmt::format("t{}", i);
    ids.push_back(eng.Register(name.c_str(), kMiB, i % 3 == 2 ? ZINF_TIER_HOST : ZINF_TIER_NVME,
                               i));
  }
  for (uint32_t i = 0; i < 12; ++i) {
    auto p = Pattern(kMiB, i);
    ASSERT_EQ(zinf_tensor_write(eng.e, ids[i], p.data()), ZINF_OK) << Last();
  }
  for (int step = 0; step < 3; ++step) {
    for (uint32_t i = 0; i < 12; ++i) {
      uint64_t lease = 0;
      ASSERT_EQ(zinf_acquire(eng.e, ids[i], ZINF_TIER_DEVICE, ZINF_ACQUIRE_READ, &lease),
                ZINF_OK) << Last();
      void* ptr = nullptr;
      ASSERT_EQ(zinf_lease_wait(eng.e, lease, &ptr), ZINF_OK) << Last();
      auto* w = static_cast<uint32_t*>(ptr);
      const auto want = Pattern(kMiB, i);
      ASSERT_EQ(w[5], want[5] + step) << "tensor " << i << " step " << step;
      for (size_t k = 0; k < kMiB / 4; ++k) w[k] += 1;
      ASSERT_EQ(zinf_release(eng.e, lease, 1), ZINF_OK) << Last();
    }
    ASSERT_EQ(zinf_engine_end_step(eng.e), ZINF_OK) << Last();
  }
  for (uint32_t i = 0; i < 12; ++i) {
    std::vector<uint32_t> got(kMiB / 4);
    ASSERT_EQ(zinf_tensor_read(eng.e, ids[i], got.data()), ZINF_OK) << Last();
    auto want = Pattern(kMiB, i);
    for (auto& x : want) x += 3;
    ASSERT_EQ(got, want) << "tensor " << i;
  }
  const auto s = eng.Stats();
  EXPECT_EQ(s["tensors"], 12);
  EXPECT_EQ(s["leases_held"], 0);
  EXPECT_EQ(s["device"], "host");
  EXPECT_LE(s["peak_bytes"]["device_arena"].get<uint64_t>(), 3 * kMiB) << s.dump();
  EXPECT_LE(s["peak_bytes"]["pinned_pool"].get<uint64_t>(), 7 * kMiB) << s.dump();
  EXPECT_GT(s["bytes"]["nvme_read"].get<uint64_t>(), 8 * kMiB) << s.dump();
  EXPECT_GT(s["bytes"]["nvme_write"].get<uint64_t>(), 8 * kMiB) << s.dump();
  EXPECT_TRUE(s["prefetch"]["trace"].get<bool>()) << s.dump();
  EXPECT_GT(s["prefetch"]["hits"].get<uint64_t>(), 0u) << s.dump();
  EXPECT_GT(s["evictions"]["device"].get<uint64_t>(), 0u) << s.dump();
}

// A device budget smaller than the largest unit of the default zinf.model (387 KiB of bf16
// parameters) is the caller's to size: the engine pages the caller's tensors, not zinf.model,
// so the open does not judge the budget against the model (it once refused 256 KiB so).
TEST(CapiEngineTest, SmallDeviceBudgetsAreJudgedByTheTensorsNotTheModel) {
  TempDir dir;
  zinf_engine_params p = ZINF_ENGINE_PARAMS_INIT;
  p.device_leases[ZINF_ROLE_PARAM] = 1;
  p.host_leases[ZINF_ROLE_PARAM] = 1;
  const std::string json = fmt::format(
      R"({{"zinf": {{"swap_dir": "{}", "budgets": {{"device_bytes": "256K",
      "pinned_bytes": "1M"}}}}, "aio": {{"block_size": 65536}}}})", dir.path());
  Engine eng(json, p);
  ASSERT_NE(eng.e, nullptr);
  constexpr uint64_t kBytes = 128 << 10;
  std::vector<uint64_t> ids;
  for (uint32_t i = 0; i < 4; ++i) {
    const std::string name = fmt::format("s{}", i);
    ids.push_back(eng.Register(name.c_str(), kBytes, ZINF_TIER_NVME, i));
  }
  for (uint32_t i = 0; i < 4; ++i) {
    auto w = Pattern(kBytes, i);
    ASSERT_EQ(zinf_tensor_write(eng.e, ids[i], w.data()), ZINF_OK) << Last();
  }
  for (uint32_t i = 0; i < 4; ++i) {
    uint64_t lease = 0;
    ASSERT_EQ(zinf_acquire(eng.e, ids[i], ZINF_TIER_DEVICE, ZINF_ACQUIRE_READ, &lease), ZINF_OK)
        << Last();
    void* ptr = nullptr;
    ASSERT_EQ(zinf_lease_wait(eng.e, lease, &ptr), ZINF_OK) << Last();
    EXPECT_EQ(static_cast<uint32_t*>(ptr)[7], Pattern(kBytes, i)[7]) << "tensor " << i;
    ASSERT_EQ(zinf_release(eng.e, lease, 0), ZINF_OK) << Last();
  }
  EXPECT_LE(eng.Stats()["peak_bytes"]["device_arena"].get<uint64_t>(), 256u << 10);
}

// The Adam step over registered tensors (weights, moments on NVMe, a bf16 copy) equals
// zinf_adam_step on plain buffers bit for bit, step after step, with the tensors evicted
// between uses.
TEST(CapiEngineTest, AdamOverRegisteredTensorsEqualsThePlainStep) {
  TempDir dir;
  zinf_engine_params p = ZINF_ENGINE_PARAMS_INIT;
  for (int r = 0; r < ZINF_ROLES; ++r) {
    p.device_leases[r] = 0;
    p.host_leases[r] = 1;  // one step at a time
  }
  Engine eng(ConfigJson(dir.path(), 2, 3), p);
  constexpr uint64_t n = 100003;  // odd
  constexpr int kParams = 4;
  zinf_adam_params ap = ZINF_ADAM_PARAMS_INIT;
  ap.weight_decay = 0.01f;
  ap.adamw = 1;
  ap.threads = 2;
  zinf_adam* adam = nullptr;
  ASSERT_EQ(zinf_adam_create(&ap, &adam), ZINF_OK) << Last();
  struct Plain {
    std::vector<float> w, m, v;
    std::vector<uint16_t> w16;
  };
  std::vector<Plain> plain(kParams);
  std::vector<uint64_t> w(kParams), m(kParams), v(kParams), w16(kParams);
  for (int i = 0; i < kParams; ++i) {
    const std::string name = fmt::format("p{}", i);
    w[i] = eng.Register((name + ".w").c_str(), n * 4, ZINF_TIER_NVME, i, ZINF_ROLE_MASTER);
    m[i] = eng.Register((name + ".m").c_str(), n * 4, ZINF_TIER_NVME, i, ZINF_ROLE_EXP_AVG);
    v[i] = eng.Register((name + ".v").c_str(), n * 4, ZINF_TIER_NVME, i, ZINF_ROLE_EXP_AVG_SQ);
    w16[i] = eng.Register((name + ".w16").c_str(), n * 2, ZINF_TIER_HOST, i, ZINF_ROLE_PARAM);
  }
  for (int i = 0; i < kParams; ++i) {
    Plain& pl = plain[i];
    pl.w.resize(n);
    for (uint64_t k = 0; k < n; ++k) pl.w[k] = 0.01f * static_cast<float>((k * 37 + i) % 101);
    pl.m.assign(n, 0.0f);
    pl.v.assign(n, 0.0f);
    pl.w16.assign(n, 0);
    ASSERT_EQ(zinf_tensor_write(eng.e, w[i], pl.w.data()), ZINF_OK) << Last();
    ASSERT_EQ(zinf_tensor_write(eng.e, m[i], pl.m.data()), ZINF_OK) << Last();
    ASSERT_EQ(zinf_tensor_write(eng.e, v[i], pl.v.data()), ZINF_OK) << Last();
  }
  std::vector<float> grad(n);
  for (int step = 1; step <= 4; ++step) {
    for (int i = 0; i < kParams; ++i) {
      for (uint64_t k = 0; k < n; ++k) {
        grad[k] = 0.001f * static_cast<float>(static_cast<int>((k * 13 + step * 7 + i) % 61) - 30);
      }
      Plain& pl = plain[i];
      ASSERT_EQ(zinf_adam_step(adam, step, -1, pl.w.data(), grad.data(), ZINF_DTYPE_F32,
                               pl.m.data(), pl.v.data(), n, pl.w16.data(), ZINF_DTYPE_BF16),
                ZINF_OK) << Last();
      ASSERT_EQ(zinf_engine_adam_step(eng.e, adam, step, -1, w[i], grad.data(), ZINF_DTYPE_F32,
                                      m[i], v[i], w16[i], ZINF_DTYPE_BF16),
                ZINF_OK) << Last();
    }
    ASSERT_EQ(zinf_engine_end_step(eng.e), ZINF_OK) << Last();
  }
  for (int i = 0; i < kParams; ++i) {
    std::vector<float> got(n);
    std::vector<uint16_t> got16(n);
    ASSERT_EQ(zinf_tensor_read(eng.e, w[i], got.data()), ZINF_OK) << Last();
    EXPECT_EQ(std::memcmp(got.data(), plain[i].w.data(), n * 4), 0) << "weights " << i;
    ASSERT_EQ(zinf_tensor_read(eng.e, m[i], got.data()), ZINF_OK) << Last();
    EXPECT_EQ(std::memcmp(got.data(), plain[i].m.data(), n * 4), 0) << "exp_avg " << i;
    ASSERT_EQ(zinf_tensor_read(eng.e, v[i], got.data()), ZINF_OK) << Last();
    EXPECT_EQ(std::memcmp(got.data(), plain[i].v.data(), n * 4), 0) << "exp_avg_sq " << i;
    ASSERT_EQ(zinf_tensor_read(eng.e, w16[i], got16.data()), ZINF_OK) << Last();
    EXPECT_EQ(got16, plain[i].w16) << "bf16 copy " << i;
  }
  const auto s = eng.Stats();
  EXPECT_GT(s["evictions"]["host"].get<uint64_t>(), 0u) << s.dump();  // the state was paged
  EXPECT_LE(s["peak_bytes"]["pinned_pool"].get<uint64_t>(), 3 * kMiB) << s.dump();
  // Wrong sizes and a wrong handle are named.
  EXPECT_EQ(zinf_engine_adam_step(eng.e, adam, 1, -1, w[0], grad.data(), ZINF_DTYPE_F32, w16[0],
                                  v[0], ZINF_NO_TENSOR, 0),
            ZINF_E_INVALID_ARGUMENT);
  EXPECT_NE(Last().find("tensor p0.w16 holds"), std::string::npos) << Last();
  EXPECT_EQ(zinf_engine_adam_step(eng.e, adam, 1, -1, w[0], grad.data(), ZINF_DTYPE_F32, m[0],
                                  999, ZINF_NO_TENSOR, 0),
            ZINF_E_NOT_FOUND);
  EXPECT_NE(Last().find("tensor 999 is not registered"), std::string::npos) << Last();
  zinf_adam_destroy(adam);
}

// Two threads lease disjoint tensors at once, each within the declared leases.
TEST(CapiEngineTest, ThreadsLeaseAtOnce) {
  TempDir dir;
  Engine eng(ConfigJson(dir.path(), 4, 8));
  std::vector<uint64_t> ids;
  for (uint32_t i = 0; i < 8; ++i) {
    const std::string name = fmt::format("t{}", i);
    ids.push_back(eng.Register(name.c_str(), 256 * 1024, ZINF_TIER_NVME, i));
  }
  for (uint32_t i = 0; i < 8; ++i) {
    auto p = Pattern(256 * 1024, i);
    ASSERT_EQ(zinf_tensor_write(eng.e, ids[i], p.data()), ZINF_OK) << Last();
  }
  auto work = [&](uint32_t first) {
    for (int round = 0; round < 20; ++round) {
      for (uint32_t i = first; i < 8; i += 2) {
        uint64_t lease = 0;
        ASSERT_EQ(zinf_acquire(eng.e, ids[i], round % 2 ? ZINF_TIER_DEVICE : ZINF_TIER_HOST,
                               ZINF_ACQUIRE_UNTRACED, &lease),
                  ZINF_OK) << Last();
        void* ptr = nullptr;
        ASSERT_EQ(zinf_lease_wait(eng.e, lease, &ptr), ZINF_OK) << Last();
        ASSERT_EQ(static_cast<uint32_t*>(ptr)[7], Pattern(256 * 1024, i)[7]);
        ASSERT_EQ(zinf_release(eng.e, lease, 0), ZINF_OK) << Last();
      }
    }
  };
  std::thread a(work, 0), b(work, 1);
  a.join();
  b.join();
  EXPECT_EQ(eng.Stats()["leases_held"], 0);
}

TEST(CapiEngineTest, MisuseIsAStatusNamingWhatFailed) {
  TempDir dir;
  zinf_engine_params p = ZINF_ENGINE_PARAMS_INIT;
  p.device_leases[ZINF_ROLE_PARAM] = 1;
  Engine eng(ConfigJson(dir.path(), 2, 4), p);
  const uint64_t a = eng.Register("a", 4096, ZINF_TIER_NVME, 0);
  const uint64_t b = eng.Register("b", 4096, ZINF_TIER_HOST, 1);
  zinf_tensor_spec s = ZINF_TENSOR_SPEC_INIT;
  uint64_t id = 0;
  s.bytes = 0;
  EXPECT_EQ(zinf_tensor_register(eng.e, &s, &id), ZINF_E_INVALID_ARGUMENT);
  EXPECT_NE(Last().find("bytes is 0"), std::string::npos) << Last();
  s.bytes = 16;
  s.home = 7;
  EXPECT_EQ(zinf_tensor_register(eng.e, &s, &id), ZINF_E_INVALID_ARGUMENT);
  EXPECT_NE(Last().find("home 7"), std::string::npos) << Last();
  s.home = ZINF_TIER_HOST;
  s.role = 9;
  EXPECT_EQ(zinf_tensor_register(eng.e, &s, &id), ZINF_E_INVALID_ARGUMENT);
  EXPECT_NE(Last().find("role 9"), std::string::npos) << Last();
  s.size = 8;
  EXPECT_EQ(zinf_tensor_register(eng.e, &s, &id), ZINF_E_INVALID_ARGUMENT);

  uint64_t l1 = 0, l2 = 0;
  EXPECT_EQ(zinf_acquire(eng.e, 5, ZINF_TIER_HOST, ZINF_ACQUIRE_READ, &l1), ZINF_E_NOT_FOUND);
  EXPECT_NE(Last().find("tensor 5 is not registered (2 are)"), std::string::npos) << Last();
  EXPECT_EQ(zinf_acquire(eng.e, a, ZINF_TIER_NVME, ZINF_ACQUIRE_READ, &l1),
            ZINF_E_INVALID_ARGUMENT);
  EXPECT_NE(Last().find("tensor a: tier 2"), std::string::npos) << Last();
  EXPECT_EQ(zinf_acquire(eng.e, a, ZINF_TIER_DEVICE, ZINF_ACQUIRE_OVERWRITE, &l1),
            ZINF_E_INVALID_ARGUMENT);
  EXPECT_NE(Last().find("host tier only"), std::string::npos) << Last();
  // One device lease of PARAM declared: a second is refused, not waited for.
  ASSERT_EQ(zinf_acquire(eng.e, a, ZINF_TIER_DEVICE, ZINF_ACQUIRE_READ, &l1), ZINF_OK) << Last();
  EXPECT_EQ(zinf_acquire(eng.e, b, ZINF_TIER_DEVICE, ZINF_ACQUIRE_READ, &l2),
            ZINF_E_FAILED_PRECONDITION);
  EXPECT_FALSE(Last().empty());
  // Registering after the first acquire (the seal).
  s = ZINF_TENSOR_SPEC_INIT;
  s.bytes = 4096;
  s.name = "late";
  EXPECT_EQ(zinf_tensor_register(eng.e, &s, &id), ZINF_E_FAILED_PRECONDITION);
  EXPECT_NE(Last().find("tensor late: the engine is sealed"), std::string::npos) << Last();
  // A write while leased.
  std::vector<char> buf(4096, 1);
  EXPECT_NE(zinf_tensor_write(eng.e, a, buf.data()), ZINF_OK);
  EXPECT_FALSE(Last().empty());
  ASSERT_EQ(zinf_release(eng.e, l1, 0), ZINF_OK) << Last();
  EXPECT_EQ(zinf_release(eng.e, l1, 0), ZINF_E_NOT_FOUND);
  EXPECT_NE(Last().find("released already"), std::string::npos) << Last();
  EXPECT_EQ(zinf_release(eng.e, 77, 0), ZINF_E_NOT_FOUND);
  EXPECT_NE(Last().find("lease 77 is not held (never acquired)"), std::string::npos) << Last();
  void* ptr = nullptr;
  EXPECT_EQ(zinf_lease_wait(eng.e, l1, &ptr), ZINF_E_NOT_FOUND);
  EXPECT_EQ(zinf_tensor_write(eng.e, a, nullptr), ZINF_E_INVALID_ARGUMENT);
  EXPECT_EQ(zinf_engine_seal(eng.e), ZINF_OK) << Last();  // sealed already: fine
  EXPECT_EQ(zinf_acquire(nullptr, a, ZINF_TIER_HOST, 0, &l1), ZINF_E_INVALID_ARGUMENT);
  EXPECT_EQ(zinf_engine_close(nullptr), ZINF_OK);
}

TEST(CapiEngineTest, BadConfigsAndPlansAreRefusedWithTheirNumbers) {
  TempDir dir;
  zinf_engine* e = nullptr;
  zinf_engine_params p = ZINF_ENGINE_PARAMS_INIT;
  p.config_json = R"({"zinf": {"budgets": {"device_bytes": "lots"}}})";
  EXPECT_EQ(zinf_engine_open(&p, &e), ZINF_E_INVALID_ARGUMENT);
  EXPECT_NE(Last().find("zinf.budgets.device_bytes"), std::string::npos) << Last();
  EXPECT_EQ(e, nullptr);
  p.config_json = nullptr;
  const std::string missing = dir / "missing.json";
  p.config_path = missing.c_str();
  EXPECT_NE(zinf_engine_open(&p, &e), ZINF_OK);
  EXPECT_NE(Last().find("missing.json"), std::string::npos) << Last();
  p.config_path = nullptr;
  p.device = "tpu";
  EXPECT_EQ(zinf_engine_open(&p, &e), ZINF_E_INVALID_ARGUMENT);
  EXPECT_NE(Last().find("params.device"), std::string::npos) << Last();

  {  // NVMe home without a swap directory: refused at registration.
    Engine eng("{}");
    zinf_tensor_spec s = ZINF_TENSOR_SPEC_INIT;
    s.name = "w";
    s.bytes = 4096;
    uint64_t id = 0;
    EXPECT_EQ(zinf_tensor_register(eng.e, &s, &id), ZINF_E_FAILED_PRECONDITION);
    EXPECT_NE(Last().find("zinf.swap_dir"), std::string::npos) << Last();
  }
  {  // Four device leases of 1 MiB tensors cannot fit a 2 MiB device budget: the seal says so.
    Engine eng(ConfigJson(dir.path(), 2, 16));
    for (int i = 0; i < 6; ++i) eng.Register("big", kMiB, ZINF_TIER_NVME, i);
    EXPECT_EQ(zinf_engine_seal(eng.e), ZINF_E_RESOURCE_EXHAUSTED);
    EXPECT_NE(Last().find("zinf.budgets.device_bytes"), std::string::npos) << Last();
    uint64_t l = 0;
    EXPECT_EQ(zinf_acquire(eng.e, 0, ZINF_TIER_HOST, 0, &l), ZINF_E_RESOURCE_EXHAUSTED);
  }
  {  // A tensor larger than the whole pinned budget.
    Engine eng(ConfigJson(dir.path(), 64, 2));
    eng.Register("huge", 4 * kMiB, ZINF_TIER_NVME, 0);
    EXPECT_EQ(zinf_engine_seal(eng.e), ZINF_E_RESOURCE_EXHAUSTED);
    EXPECT_NE(Last().find("huge"), std::string::npos) << Last();
    EXPECT_NE(Last().find("pinned budget"), std::string::npos) << Last();
  }
}

}  // namespace
