// Checkpoints of optimizer state on NVMe striped over several swap files (zinf.stripe_paths):
// the manifest names every member and the stripe unit, shard offsets are logical, and
// everything that reads a checkpoint (verify, resume, export) maps them through the stripes.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "src/ckpt/manifest.h"
#include "src/train/checkpoint.h"
#include "src/train/checkpoint_export.h"
#include "src/train/trainer.h"
#include "tests/test_util.h"
#include "tests/train/checkpoint_test_util.h"

namespace zinf::train {
namespace {

namespace fs = std::filesystem;

constexpr uint64_t kSteps = 6;

// Two stripe directories and a 4 KiB stripe unit: every shard of the model spans both.
Config Striped(const testing::TempDir& dir, const std::string& tag) {
  const std::string a = dir / (tag + "-a"), b = dir / (tag + "-b");
  fs::create_directories(b);
  Config c = testing_ckpt::Offloaded(a);
  c.zinf.stripe_paths = {a, b};
  c.zinf.stripe_bytes = 4096;
  return c;
}

TrainOptions Options(const Config& c, const std::string& dir, const std::string& tag) {
  return testing_ckpt::Options(c, dir, tag, kSteps);
}

std::vector<std::string> Losses(const std::string& path) { return testing_ckpt::Losses({path}); }
using testing_ckpt::Slurp;

TEST(StripedCheckpointTest, VerifiesResumesBitwiseAndExports) {
  testing::TempDir dir;
  auto ref = Train(Options(Striped(dir, "ref"), dir.path(), "ref"));
  ASSERT_TRUE(ref.ok()) << ref.status().ToString();

  Config c = Striped(dir, "run");
  c.zinf.checkpoint.dir = dir / "ckpt";
  c.zinf.checkpoint.every = 2;
  c.zinf.checkpoint.keep = 2;
  auto run = Train(Options(c, dir.path(), "run"));
  ASSERT_TRUE(run.ok()) << run.status().ToString();
  EXPECT_TRUE(Slurp(dir / "run.safetensors") == Slurp(dir / "ref.safetensors"));

  const auto kept = ckpt::Committed(dir / "ckpt");
  ASSERT_EQ(kept.size(), 2u);
  auto m4 = ckpt::Read(kept[0].dir);
  ASSERT_TRUE(m4.ok()) << m4.status().ToString();
  EXPECT_EQ(m4->step, 4u);
  const ckpt::FileEntry* swap = nullptr;
  for (const auto& f : m4->files) {
    if (f.kind == "swap") swap = &f;
  }
  ASSERT_NE(swap, nullptr);
  ASSERT_EQ(swap->members.size(), 2u);
  EXPECT_EQ(swap->stripe_bytes, 4096u);
  EXPECT_EQ(fs::path(swap->members[1]).parent_path(), fs::weakly_canonical(dir / "run-b"));
  // Some shard's bytes lie in both members.
  bool spans = false;
  for (const auto& s : m4->shards) spans |= m4->Locate(s, 0, s.length).size() > 1;
  EXPECT_TRUE(spans);
  for (const auto& k : kept) {
    auto m = ckpt::Read(k.dir);
    ASSERT_TRUE(m.ok());
    Status v = ckpt::Verify(*m);
    EXPECT_TRUE(v.ok()) << k.dir << ": " << v.ToString();
  }

  // The last checkpoint's F32 export is the run's --save, byte for byte.
  auto m6 = ckpt::Read(kept[1].dir);
  ASSERT_TRUE(m6.ok());
  auto exported = Export(*m6, {.out = dir / "export.safetensors"});
  ASSERT_TRUE(exported.ok()) << exported.status().ToString();
  EXPECT_TRUE(Slurp(dir / "export.safetensors") == Slurp(dir / "ref.safetensors"));

  // The older kept checkpoint resumes to the end bit for bit (through both members).
  fs::remove_all(kept[1].dir);
  Config rc = c;
  rc.zinf.checkpoint.resume = kept[0].dir;
  auto resumed = Train(Options(rc, dir.path(), "resumed"));
  ASSERT_TRUE(resumed.ok()) << resumed.status().ToString();
  EXPECT_EQ(resumed->resumed_from_step, 4u);
  std::vector<std::string> want = Losses(dir / "ref.losses");
  want.erase(want.begin(), want.begin() + 4);
  EXPECT_EQ(Losses(dir / "resumed.losses"), want);
  EXPECT_TRUE(Slurp(dir / "resumed.safetensors") == Slurp(dir / "ref.safetensors"));

  // A byte flipped in the second member is found and named; nothing trains on it.
  auto m = ckpt::Read(ckpt::Committed(dir / "ckpt").back().dir);
  ASSERT_TRUE(m.ok());
  const ckpt::ShardEntry* victim = nullptr;
  ckpt::FilePiece where;
  for (const auto& s : m->shards) {
    for (const auto& p : m->Locate(s, 0, s.length)) {
      if (victim == nullptr && p.path == swap->members[1]) {
        victim = &s;
        where = p;
      }
    }
  }
  ASSERT_NE(victim, nullptr);
  {
    std::fstream f(where.path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(where.offset + 8));
    char ch = 0;
    f.read(&ch, 1);
    ch = static_cast<char>(ch ^ 0x10);
    f.seekp(static_cast<std::streamoff>(where.offset + 8));
    f.write(&ch, 1);
  }
  Status v = ckpt::Verify(*m);
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.code(), StatusCode::kDataLoss);
  EXPECT_NE(v.message().find(victim->role), std::string::npos) << v.ToString();
  EXPECT_NE(v.message().find(swap->members[1]), std::string::npos) << v.ToString();
  rc.zinf.checkpoint.resume = m->dir;
  TrainOptions more = Options(rc, dir.path(), "bad");
  more.steps = kSteps + 2;
  auto refused = Train(more);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kDataLoss) << refused.status().ToString();
}

}  // namespace
}  // namespace zinf::train
