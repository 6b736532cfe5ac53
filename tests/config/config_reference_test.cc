// docs/config.md is the page RenderConfigReference writes from the schema: every key the schema
// declares has a meaning, every meaning names a declared key, and the page in the repository is
// the one rendered now. ZINF_UPDATE_DOCS=1 rewrites the page instead of failing on a difference.
#include "src/config/config_reference.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "src/config/config_schema.h"
#include "src/train/default_job.h"

namespace zinf {
namespace {

const char kPage[] = ZINF_SOURCE_DIR "/docs/config.md";

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(ConfigReferenceTest, EveryKeyHasAMeaningAndEveryMeaningAKey) {
  const ConfigReference r = RenderConfigReference(Config(), train::DefaultJobConfig());
  for (const std::string& p : r.problems) ADD_FAILURE() << p;
}

TEST(ConfigReferenceTest, TheDocsPageIsTheRenderedOne) {
  const ConfigReference r = RenderConfigReference(Config(), train::DefaultJobConfig());
  const char* update = std::getenv("ZINF_UPDATE_DOCS");
  if (update != nullptr && std::string(update) == "1") {
    std::ofstream(kPage) << r.markdown;
  }
  EXPECT_EQ(ReadFile(kPage), r.markdown)
      << kPage << " differs from the reference the schema renders; run this test with "
      << "ZINF_UPDATE_DOCS=1 to rewrite it, and commit the page with the schema change";
}

TEST(ConfigReferenceTest, EveryValueKeyOfTheSchemaIsOnThePage) {
  const ConfigReference r = RenderConfigReference(Config(), train::DefaultJobConfig());
  for (const auto& k : config_internal::DescribeConfig(Config())) {
    if (k.kind == config_internal::KeyInfo::Kind::kBlock) continue;
    EXPECT_NE(r.markdown.find("`" + k.path + "`"), std::string::npos) << k.path;
  }
}

// The catalog reports what the reader does: a default read onto another base is that base's
// value, an alias is folded into its key, a checked DeepSpeed size without effect says so.
TEST(ConfigReferenceTest, TheCatalogDescribesWhatTheReaderDoes) {
  Config base;
  base.aio.queue_depth = 32;
  const auto keys = config_internal::DescribeConfig(base);
  auto find = [&](const std::string& path) -> const config_internal::KeyInfo* {
    for (const auto& k : keys) {
      if (k.path == path) return &k;
    }
    return nullptr;
  };
  const auto* qd = find("aio.queue_depth");
  ASSERT_NE(qd, nullptr);
  EXPECT_EQ(qd->value, "32");
  EXPECT_EQ(qd->expected, "an integer from 1 to 4096");
  EXPECT_TRUE(qd->accepts_auto);
  const auto* layers = find("zinf.model.layers");
  ASSERT_NE(layers, nullptr);
  ASSERT_EQ(layers->aliases.size(), 1u);
  EXPECT_EQ(layers->aliases[0], "zinf.model.n_layer");
  EXPECT_EQ(find("zinf.model.n_layer"), nullptr);
  const auto* bc = find("zero_optimization.offload_param.buffer_count");
  ASSERT_NE(bc, nullptr);
  EXPECT_EQ(bc->kind, config_internal::KeyInfo::Kind::kNoEffect);
  EXPECT_EQ(bc->note, "5");
  const auto* io = find("aio.io_backend");
  ASSERT_NE(io, nullptr);
  EXPECT_EQ(io->value, "unset");
}

}  // namespace
}  // namespace zinf
