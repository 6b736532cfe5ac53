// ConfigSources (src/config/config_sources.h): the latest layer to set a value or a block
// holding it is its source, and the annotated config is one value a line with its source,
// loadable as a config file.
#include "src/config/config_sources.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

namespace zinf {
namespace {

TEST(ConfigSourcesTest, TheLatestSetAtOrAboveAPathWins) {
  ConfigSources s;
  EXPECT_EQ(s.Of("optimizer.params.lr"), "default");
  s.Set("optimizer.params.lr", "a.json");
  EXPECT_EQ(s.Of("optimizer.params.lr"), "a.json");
  EXPECT_EQ(s.Of("optimizer.params.eps"), "default");
  EXPECT_EQ(s.Of("optimizer.params"), "default");
  s.Set("optimizer.params.lr", "--lr");
  EXPECT_EQ(s.Of("optimizer.params.lr"), "--lr");

  // A block covers what is under it ...
  s.Set("scheduler.params.warmup_num_steps", "--old");
  s.Set("scheduler", "b.json");
  EXPECT_EQ(s.Of("scheduler.params.warmup_num_steps"), "b.json");
  EXPECT_EQ(s.Of("scheduler.type"), "b.json");
  // ... until something under it is set later.
  s.Set("scheduler.type", "--schedule");
  EXPECT_EQ(s.Of("scheduler.type"), "--schedule");
  EXPECT_EQ(s.Of("scheduler.params.cos_min_ratio"), "b.json");
  // A name that merely starts like a block is not under it.
  s.Set("zinf.model", "c.json");
  EXPECT_EQ(s.Of("zinf.model_x"), "default");

  s.SetAll({"train_batch_size", "gradient_accumulation_steps"}, "--grad-accum");
  EXPECT_EQ(s.Of("train_batch_size"), "--grad-accum");
  EXPECT_EQ(s.Of("gradient_accumulation_steps"), "--grad-accum");
}

TEST(ConfigSourcesTest, AnnotatesEachValueAndLoadsBackAsAConfig) {
  auto c = Config::FromString(R"({"optimizer": {"type": "Adam", "params": {"lr": 0.25}},
                                  "zinf": {"stripe_paths": ["/a", "/b"]}})");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ConfigSources s;
  s.SetAll(c->given_keys, "x.json");
  s.Set("zinf.seed", "--seed");
  const std::string text = s.Annotate(*c);

  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  ASSERT_GT(lines.size(), 50u) << text;
  EXPECT_EQ(lines.front(), "{");
  EXPECT_EQ(lines.back(), "}");
  auto line_of = [&](const std::string& key) {
    for (const std::string& l : lines) {
      if (l.find("\"" + key + "\": ") != std::string::npos) return l;
    }
    ADD_FAILURE() << "no line for " << key << " in\n" << text;
    return std::string();
  };
  EXPECT_EQ(line_of("lr").substr(line_of("lr").find("//")), "// x.json");
  EXPECT_EQ(line_of("type").substr(line_of("type").find("//")), "// x.json");
  EXPECT_EQ(line_of("seed").substr(line_of("seed").find("//")), "// --seed");
  EXPECT_EQ(line_of("eps").substr(line_of("eps").find("//")), "// default");
  EXPECT_NE(line_of("stripe_paths").find("[\"/a\", \"/b\"],"), std::string::npos);
  // No scheduler is written as null, a value of its own.
  EXPECT_NE(line_of("scheduler").find("null,"), std::string::npos) << line_of("scheduler");
  // The comments start in one column.
  const size_t column = line_of("lr").find("//");
  for (const std::string& l : lines) {
    if (l.find("//") != std::string::npos) {
      EXPECT_EQ(l.find("//"), column) << l;
    }
  }
  // A config file zinf reads (comments allowed) giving the same config.
  auto again = Config::FromString(text);
  ASSERT_TRUE(again.ok()) << again.status().ToString() << "\n" << text;
  EXPECT_EQ(again->ToJson(), c->ToJson());
}

}  // namespace
}  // namespace zinf
