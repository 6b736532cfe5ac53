// ckpt::Manifest: commit and read back, what counts as committed, which files a manifest may
// name (path escapes refused), verification naming the first bad shard, and checkpoints across
// ranks (a global manifest naming its parts by hash; the "unit-chunks" rule).
#include "src/ckpt/manifest.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "src/base/atomic_file.h"
#include "src/base/hash.h"
#include "tests/test_util.h"

namespace zinf::ckpt {
namespace {

namespace fs = std::filesystem;
using zinf::testing::TempDir;

// A checkpoint of `step` under root with one data file of two F32 shards of 4 values.
Manifest MakeCheckpoint(const std::string& root, uint64_t step, float fill = 1.0f) {
  const std::string dir = (fs::path(root) / CheckpointDirName(step)).string();
  fs::create_directories(dir);
  std::vector<float> a(4, fill), b(4, fill + 1);
  std::string bytes(reinterpret_cast<const char*>(a.data()), 16);
  bytes.append(reinterpret_cast<const char*>(b.data()), 16);
  EXPECT_TRUE(WriteFileAtomically(dir + "/host.bin", bytes).ok());
  Manifest m;
  m.step = step;
  m.model = {{"layers", 1}};
  m.training = {{"lr", 0.001}};
  m.data = {{"train", {{"position", step}}}};
  m.state = {{"applied_steps", step}};
  m.files = {{"host.bin", "data", 32}};
  m.shards = {{"master", 0, "F32", {4}, "host.bin", 0, 16, Xxh64(a.data(), 16)},
              {"exp_avg", 0, "F32", {4}, "host.bin", 16, 16, Xxh64(b.data(), 16)}};
  EXPECT_TRUE(Commit(dir, m).ok());
  m.dir = dir;
  return m;
}

TEST(ManifestTest, CommitReadAndVerifyRoundTrip) {
  TempDir root;
  const Manifest m = MakeCheckpoint(root.path(), 12);
  auto r = Read(m.dir);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->step, 12u);
  EXPECT_EQ(r->model, m.model);
  EXPECT_EQ(r->data, m.data);
  ASSERT_EQ(r->shards.size(), 2u);
  EXPECT_EQ(r->shards[1].role, "exp_avg");
  EXPECT_EQ(r->shards[1].xxh64, m.shards[1].xxh64);
  EXPECT_EQ(r->PathOf(r->shards[0]), m.dir + "/host.bin");
  int verified = 0;
  EXPECT_TRUE(Verify(*r, [&](const ShardEntry&) { ++verified; }).ok());
  EXPECT_EQ(verified, 2);
}

TEST(ManifestTest, TheLatestIsResolvedFromCommittedManifestsOnly) {
  TempDir root;
  MakeCheckpoint(root.path(), 4);
  MakeCheckpoint(root.path(), 8);
  // A checkpoint whose manifest is gone, and one with only a stray temporary manifest: neither
  // is committed.
  const Manifest gone = MakeCheckpoint(root.path(), 12);
  fs::remove(gone.dir + "/manifest.json");
  const Manifest torn = MakeCheckpoint(root.path(), 16);
  fs::rename(torn.dir + "/manifest.json", torn.dir + "/manifest.json.tmp.123.abcdef0123456789");
  auto all = Committed(root.path());
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].step, 4u);
  EXPECT_EQ(all[1].step, 8u);
  auto latest = Resolve(root.path());
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(*latest, (fs::path(root.path()) / "step-0000000008").string());
  EXPECT_EQ(*Resolve(all[0].dir), all[0].dir);  // a named checkpoint is itself
  TempDir empty;
  EXPECT_EQ(Resolve(empty.path()).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(Resolve(empty / "nope").status().code(), StatusCode::kNotFound);
  // A committed manifest that does not read is damaged: an error naming it, not the older one.
  const Manifest bad = MakeCheckpoint(root.path(), 20);
  std::ofstream(bad.dir + "/manifest.json") << "{\"format\": \"zinf-checkpoint\"";
  auto damaged = Resolve(root.path());
  ASSERT_FALSE(damaged.ok());
  EXPECT_NE(damaged.status().message().find(bad.dir), std::string::npos) << damaged.status().ToString();
  EXPECT_EQ(*Resolve(all[1].dir), all[1].dir);  // named, the older one still resolves
}

TEST(ManifestTest, AFlippedByteOrATruncatedFileIsReportedNamingShardFileAndOffset) {
  TempDir root;
  const Manifest m = MakeCheckpoint(root.path(), 3);
  {
    std::fstream f(m.dir + "/host.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(20);
    f.put('\x7f');
  }
  auto r = Read(m.dir);
  ASSERT_TRUE(r.ok());
  Status s = Verify(*r);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("shard exp_avg of unit 0"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("offset 16 of " + m.dir + "/host.bin"), std::string::npos)
      << s.message();
  ASSERT_EQ(::truncate((m.dir + "/host.bin").c_str(), 24), 0);
  s = Verify(*r);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
  EXPECT_NE(s.message().find("ends at offset 24"), std::string::npos) << s.message();
}

// Edits manifest.json of `dir` with `edit` and commits it back.
void EditManifest(const std::string& dir, const std::function<void(nlohmann::json&)>& edit) {
  auto text = ReadWholeFile(dir + "/manifest.json");
  ASSERT_TRUE(text.ok());
  nlohmann::json j = nlohmann::json::parse(*text);
  edit(j);
  ASSERT_TRUE(WriteFileAtomically(dir + "/manifest.json", j.dump()).ok());
}

TEST(ManifestTest, AManifestNamingAFileOutsideTheCheckpointOrTheRunsSwapFilesIsRefused) {
  TempDir root;
  const Manifest m = MakeCheckpoint(root.path(), 5);
  struct Case {
    const char* what;
    std::function<void(nlohmann::json&)> edit;
    const char* expect;
  };
  const Case cases[] = {
      {"a relative escape", [](auto& j) { j["files"][0]["name"] = "../../etc/passwd";
                                          j["shards"][0]["file"] = "../../etc/passwd"; },
       "path escape"},
      {"an absolute data file", [](auto& j) { j["files"][0]["name"] = "/etc/passwd";
                                              j["shards"][0]["file"] = "/etc/passwd"; },
       "path escape"},
      {"a swap file that is not one", [](auto& j) {
         j["files"].push_back({{"name", "/etc/passwd"}, {"kind", "swap"}, {"bytes", 16}});
         j["shards"][0]["file"] = "/etc/passwd"; },
       "not a zinf swap file"},
      {"an unlisted file", [](auto& j) { j["shards"][0]["file"] = "other.bin"; },
       "neither a data file of this checkpoint nor one of its listed swap files"},
      {"a shard past its file", [](auto& j) { j["shards"][1]["offset"] = 24; }, "lie outside"},
      {"a length that disagrees with the shape", [](auto& j) { j["shards"][0]["length"] = 12; },
       "but 4 F32 values make 16"},
      {"a bad hash", [](auto& j) { j["shards"][0]["xxh64"] = "xyz"; }, "16 hex digits"},
      {"another format version", [](auto& j) { j["format_version"] = 9; }, "format_version 9"},
      {"several ranks", [](auto& j) { j["world"]["size"] = 4; }, "world size 4"},
      {"a striped member that is not a swap file", [](auto& j) {
         j["files"].push_back({{"name", "/s/zinf.swap.0"}, {"kind", "swap"}, {"bytes", 64},
                               {"members", {"/s/zinf.swap.0", "/etc/passwd"}},
                               {"stripe_bytes", 4096}});
         j["shards"][0]["file"] = "/s/zinf.swap.0"; },
       "\"/etc/passwd\" is not a zinf swap file"},
      {"a striped member given relative", [](auto& j) {
         j["files"].push_back({{"name", "/s/zinf.swap.0"}, {"kind", "swap"}, {"bytes", 64},
                               {"members", {"/s/zinf.swap.0", "../t/zinf.swap.1"}},
                               {"stripe_bytes", 4096}});
         j["shards"][0]["file"] = "/s/zinf.swap.0"; },
       "not a zinf swap file"},
      {"one striped member", [](auto& j) {
         j["files"].push_back({{"name", "/s/zinf.swap.0"}, {"kind", "swap"}, {"bytes", 64},
                               {"members", {"/s/zinf.swap.0"}}, {"stripe_bytes", 4096}});
         j["shards"][0]["file"] = "/s/zinf.swap.0"; },
       "two or more members"},
      {"no stripe unit", [](auto& j) {
         j["files"].push_back({{"name", "/s/zinf.swap.0"}, {"kind", "swap"}, {"bytes", 64},
                               {"members", {"/s/zinf.swap.0", "/t/zinf.swap.1"}},
                               {"stripe_bytes", 0}});
         j["shards"][0]["file"] = "/s/zinf.swap.0"; },
       "stripe_bytes > 0"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const Manifest fresh = MakeCheckpoint(root.path(), 5);
    EditManifest(fresh.dir, c.edit);
    auto r = Read(fresh.dir);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find(c.expect), std::string::npos) << r.status().message();
  }
  // A swap file named like zinf's is accepted unless the run says which are its own.
  const Manifest fresh = MakeCheckpoint(root.path(), 6);
  const std::string swap = root / "zinf.swap";
  std::ofstream(swap) << std::string(64, '\0');
  EditManifest(fresh.dir, [&](auto& j) {
    j["files"].push_back({{"name", swap}, {"kind", "swap"}, {"bytes", 64}});
    j["shards"][0]["file"] = swap;
  });
  EXPECT_TRUE(Read(fresh.dir).ok());
  auto mine = Read(fresh.dir, std::vector<std::string>{swap});
  ASSERT_TRUE(mine.ok());
  EXPECT_EQ(mine->PathOf(mine->shards[0]), swap);
  auto other = Read(fresh.dir, std::vector<std::string>{"/data/run2/zinf.swap"});
  ASSERT_FALSE(other.ok());
  EXPECT_NE(other.status().message().find("not one of this run's swap files"), std::string::npos);
  // Striped: every member must be one of the run's, and a shard's bytes map through stripes.
  EditManifest(fresh.dir, [&](auto& j) {
    j["files"].push_back({{"name", "/s/zinf.swap.0"}, {"kind", "swap"}, {"bytes", 4 * 4096},
                          {"members", {"/s/zinf.swap.0", "/t/zinf.swap.1"}},
                          {"stripe_bytes", 4096}});
    j["shards"][1]["file"] = "/s/zinf.swap.0";
    j["shards"][1]["offset"] = 4096 - 8;  // 16 bytes: the end of unit 0, the start of unit 1
  });
  auto striped = Read(fresh.dir, std::vector<std::string>{swap, "/s/zinf.swap.0", "/t/zinf.swap.1"});
  ASSERT_TRUE(striped.ok()) << striped.status().ToString();
  const auto pieces = striped->Locate(striped->shards[1], 0, 16);
  ASSERT_EQ(pieces.size(), 2u);
  EXPECT_EQ(pieces[0].path, "/s/zinf.swap.0");
  EXPECT_EQ(pieces[0].offset, 4096u - 8);
  EXPECT_EQ(pieces[0].length, 8u);
  EXPECT_EQ(pieces[1].path, "/t/zinf.swap.1");
  EXPECT_EQ(pieces[1].offset, 0u);
  EXPECT_EQ(pieces[1].length, 8u);
  auto not_mine = Read(fresh.dir, std::vector<std::string>{swap, "/s/zinf.swap.0"});
  ASSERT_FALSE(not_mine.ok());
  EXPECT_NE(not_mine.status().message().find("/t/zinf.swap.1"), std::string::npos)
      << not_mine.status().message();
  // A repeated key is refused, not silently resolved.
  ASSERT_TRUE(WriteFileAtomically(fresh.dir + "/manifest.json",
                                  R"({"format": "zinf-checkpoint", "format": "x"})").ok());
  EXPECT_NE(Read(fresh.dir).status().message().find("repeated"), std::string::npos);
}

// The "unit-chunks" rule: ceil(n / world) elements a chunk, the last ones shorter or empty.
TEST(ManifestTest, UnitChunksSplitEachUnitInRankOrder) {
  EXPECT_EQ(ChunkOfUnit(10, 4, 0).lo, 0u);
  EXPECT_EQ(ChunkOfUnit(10, 4, 0).len, 3u);
  EXPECT_EQ(ChunkOfUnit(10, 4, 3).lo, 9u);
  EXPECT_EQ(ChunkOfUnit(10, 4, 3).len, 1u);
  EXPECT_EQ(ChunkOfUnit(10, 4, 3).per, 3u);
  EXPECT_EQ(ChunkOfUnit(2, 4, 3).len, 0u);  // more ranks than elements: empty chunks
  EXPECT_EQ(ChunkOfUnit(2, 4, 3).lo, 2u);
  EXPECT_EQ(ChunkOfUnit(7, 1, 0).len, 7u);
  for (uint64_t n : {1u, 5u, 64u, 1001u}) {
    for (uint32_t w : {1u, 2u, 3u, 4u, 7u}) {
      uint64_t covered = 0;
      for (uint32_t r = 0; r < w; ++r) {
        const UnitChunk c = ChunkOfUnit(n, w, r);
        EXPECT_EQ(c.lo, std::min<uint64_t>(n, covered == n ? n : covered));
        covered += c.len;
      }
      EXPECT_EQ(covered, n) << n << " over " << w;
    }
  }
}

// HYBRID_SHARD's parts: C chunks of a world of N, part r holding chunk r mod C; the chunks
// are recorded only when they are not the world size, and read back.
TEST(ManifestTest, APartHoldsItsChunkOfTheNodesChunks) {
  Manifest m;
  m.world_size = 4;
  m.partition = kPartitionUnitChunks;
  m.chunks = 2;
  m.rank = 3;
  EXPECT_EQ(m.Chunks(), 2u);
  EXPECT_EQ(m.PartChunk(10).lo, 5u);  // chunk 1 of 2
  EXPECT_EQ(m.PartChunk(10).len, 5u);
  EXPECT_EQ(m.ToJson()["world"]["chunks"], 2);
  m.chunks = 4;
  EXPECT_FALSE(m.ToJson()["world"].contains("chunks"));
  EXPECT_EQ(m.PartChunk(10).lo, 9u);  // chunk 3 of 4
  m.chunks = 0;
  EXPECT_EQ(m.Chunks(), 4u);
  m.partition = kPartitionReplicated;
  EXPECT_EQ(m.PartChunk(10).len, 10u);  // every part holds the whole unit
  m.rank.reset();
  m.partition = kPartitionUnitChunks;
  EXPECT_EQ(m.PartChunk(10).len, 10u);  // the global manifest: no part of its own
}

// Two parts in rank<r>/ and the global manifest naming them: read back, each part checked
// against it, verified through it; what does not fit is refused.
TEST(ManifestTest, ACheckpointAcrossRanksNamesItsPartsByHash) {
  TempDir root;
  const std::string dir = (fs::path(root.path()) / CheckpointDirName(6)).string();
  Manifest global;
  global.step = 6;
  global.model = {{"layers", 1}};
  global.training = {{"lr", 0.001}};
  global.data = {{"train", {{"position", 6}}}};
  global.state = {{"applied_steps", 6}};
  global.world_size = 2;
  global.partition = kPartitionUnitChunks;
  for (uint32_t r = 0; r < 2; ++r) {
    const Manifest part0 = MakeCheckpoint(root.path() + "/tmp" + std::to_string(r), 6, 1.0f + r);
    Manifest part = part0;
    part.world_size = 2;
    part.partition = kPartitionUnitChunks;
    part.rank = r;
    const std::string pdir = dir + "/" + RankPartDirName(r);
    fs::create_directories(pdir);
    fs::copy_file(part0.dir + "/host.bin", pdir + "/host.bin");
    ASSERT_TRUE(Commit(pdir, part).ok());
    auto text = ReadWholeFile(pdir + "/manifest.json");
    ASSERT_TRUE(text.ok());
    global.parts.push_back({r, RankPartDirName(r), Xxh64(text->data(), text->size())});
  }
  ASSERT_TRUE(Commit(dir, global).ok());
  auto g = Read(dir);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_TRUE(g->HasParts());
  ASSERT_EQ(g->parts.size(), 2u);
  auto p1 = ReadPart(*g, 1);
  ASSERT_TRUE(p1.ok()) << p1.status().ToString();
  EXPECT_EQ(p1->rank, std::optional<uint32_t>(1));
  EXPECT_EQ(p1->shards.size(), 2u);
  int verified = 0;
  EXPECT_TRUE(Verify(*g, [&](const ShardEntry&) { ++verified; }).ok());
  EXPECT_EQ(verified, 4);  // both parts'
  ASSERT_EQ(Committed(root.path()).size(), 1u);  // the parts are not checkpoints of their own

  // A part's manifest changed after the commit: its hash no longer matches.
  const std::string p1path = dir + "/rank1/manifest.json";
  const std::string saved = *ReadWholeFile(p1path);
  std::ofstream(p1path, std::ios::trunc) << saved << "\n";
  EXPECT_EQ(ReadPart(*g, 1).status().code(), StatusCode::kDataLoss);
  EXPECT_NE(Verify(*g).ToString().find("not the one committed"), std::string::npos);
  std::ofstream(p1path, std::ios::trunc) << saved;
  EXPECT_TRUE(Verify(*g).ok());
  // A byte of rank 1's data flipped: named by Verify through the global manifest.
  {
    std::fstream f(dir + "/rank1/host.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(3);
    f.put('\x55');
  }
  const Status bad = Verify(*g);
  EXPECT_EQ(bad.code(), StatusCode::kDataLoss);
  EXPECT_NE(bad.ToString().find("rank1/host.bin"), std::string::npos) << bad.ToString();
  EXPECT_EQ(ReadPart(*g, 2).status().code(), StatusCode::kInvalidArgument);  // no such rank

  // The global manifest edited: every refusal names the field.
  struct Case {
    const char* what;
    std::function<void(nlohmann::json&)> edit;
    const char* expect;
  };
  const Case cases[] = {
      {"a part missing", [](auto& j) { j["parts"].erase(1); }, "one per rank"},
      {"a part elsewhere", [](auto& j) { j["parts"][1]["dir"] = "../x"; }, "expected rank 1 in"},
      {"an unknown rule", [](auto& j) { j["world"]["partition"] = "rows"; },
       "partition \"rows\""},
      {"shards in the global manifest",
       [](auto& j) {
         j["files"] = {{{"name", "a.bin"}, {"kind", "data"}, {"bytes", 16}}};
         j["shards"] = {{{"role", "master"}, {"unit", 0}, {"dtype", "F32"}, {"shape", {4}},
                         {"file", "a.bin"}, {"offset", 0}, {"length", 16},
                         {"xxh64", "0000000000000000"}}};
       },
       "keeps its files and shards in its parts"},
      {"a rank outside the world", [](auto& j) { j["world"]["rank"] = 2; }, "world.rank 2"},
      {"chunks not dividing the world", [](auto& j) { j["world"]["chunks"] = 3; },
       "world.chunks 3"},
      {"chunks of a replicated state",
       [](auto& j) {
         j["world"]["partition"] = "replicated";
         j["world"]["chunks"] = 1;
       },
       "expected chunks only with \"unit-chunks\""},
      {"a part disagreeing on the chunks", [](auto& j) { j["world"]["chunks"] = 1; }, ""},
  };
  const std::string text = *ReadWholeFile(dir + "/manifest.json");
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    auto j = nlohmann::json::parse(text);
    c.edit(j);
    std::ofstream(dir + "/manifest.json", std::ios::trunc) << j.dump();
    auto r = Read(dir);
    if (std::string(c.expect).empty()) {
      // A valid global manifest whose parts say otherwise: refused by ReadPart.
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      auto part = ReadPart(*r, 0);
      EXPECT_EQ(part.status().code(), StatusCode::kDataLoss);
      EXPECT_NE(part.status().ToString().find("in 1 chunks"), std::string::npos)
          << part.status().ToString();
      continue;
    }
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().ToString().find(c.expect), std::string::npos) << r.status().ToString();
  }
  // Parts in a manifest of one rank.
  const Manifest one = MakeCheckpoint(root.path(), 9);
  EditManifest(one.dir, [](auto& j) { j["parts"] = nlohmann::json::array(); });
  EXPECT_NE(Read(one.dir).status().ToString().find("\"parts\" in a manifest of one rank"),
            std::string::npos);
}

}  // namespace
}  // namespace zinf::ckpt
