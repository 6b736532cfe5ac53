// ReadRecordedModel (src/train/weights_io.h): the model sizes a weights file records in its
// metadata, absent ones left out, malformed ones refused naming the file, key and value.
// SaveWeights/LoadWeights run end to end in trainer_test.cc (they need an executor).
#include "src/train/weights_io.h"

#include <gtest/gtest.h>

#include <string>

#include "src/train/safetensors.h"
#include "tests/test_util.h"

namespace zinf::train {
namespace {

std::string WriteWith(const zinf::testing::TempDir& dir, const std::string& name,
                      const SafetensorsMetadata& meta) {
  const float x[2] = {1, 2};
  const std::string path = dir / name;
  EXPECT_TRUE(WriteSafetensors(path, {{"t", Dtype::kF32, {2}, x}}, meta).ok());
  return path;
}

TEST(WeightsIoTest, ReadsTheSizesAFileRecords) {
  zinf::testing::TempDir dir;
  auto all = ReadRecordedModel(WriteWith(dir, "all.safetensors",
                                         {{"n_layer", "3"}, {"n_embd", "64"}, {"n_head", "2"},
                                          {"block_size", "16"}, {"vocab_size", "256"},
                                          {"format", "pt"}}));
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  EXPECT_EQ(all->layers, 3u);
  EXPECT_EQ(all->width, 64u);
  EXPECT_EQ(all->heads, 2u);
  EXPECT_EQ(all->seq_len, 16u);
  EXPECT_EQ(all->vocab, 256u);
  EXPECT_FALSE(all->empty());

  auto some = ReadRecordedModel(WriteWith(dir, "some.safetensors", {{"n_embd", "64"}}));
  ASSERT_TRUE(some.ok()) << some.status().ToString();
  EXPECT_EQ(some->width, 64u);
  EXPECT_FALSE(some->layers.has_value());
  EXPECT_FALSE(some->heads.has_value());

  auto none = ReadRecordedModel(WriteWith(dir, "none.safetensors", {}));
  ASSERT_TRUE(none.ok()) << none.status().ToString();
  EXPECT_TRUE(none->empty());
}

TEST(WeightsIoTest, RefusesAMalformedRecordedSize) {
  zinf::testing::TempDir dir;
  for (const auto& [key, value] : {std::pair<std::string, std::string>{"n_head", "four"},
                                   {"n_layer", "0"},
                                   {"n_embd", "-8"},
                                   {"vocab_size", "1"},
                                   {"block_size", "99999999999"},
                                   {"n_layer", ""}}) {
    const std::string path = WriteWith(dir, "bad.safetensors", {{key, value}});
    auto r = ReadRecordedModel(path);
    ASSERT_FALSE(r.ok()) << key << "=" << value;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    const std::string m = r.status().message();
    for (const std::string& s : {path, key, "\"" + value + "\"", std::string("expected")}) {
      EXPECT_NE(m.find(s), std::string::npos) << s << " not in: " << m;
    }
  }
  auto missing = ReadRecordedModel(dir / "missing.safetensors");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("missing.safetensors"), std::string::npos);
}

}  // namespace
}  // namespace zinf::train
