// LossScaler traced against DeepSpeed's DynamicLossScaler.update_scale, worked out by hand.
#include "src/train/loss_scaler.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace zinf::train {
namespace {

Fp16Config Dynamic(uint32_t power, uint32_t window, uint32_t hysteresis, bool consecutive,
                   double min_scale = 1.0) {
  Fp16Config c;
  c.enabled = true;
  c.loss_scale = 0.0;
  c.initial_scale_power = power;
  c.loss_scale_window = window;
  c.hysteresis = hysteresis;
  c.consecutive_hysteresis = consecutive;
  c.min_loss_scale = min_scale;
  return c;
}

LossScaler Make(const Fp16Config& c, bool raise = true) {
  auto s = LossScaler::FromConfig(c, raise);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return std::move(s).value();
}

struct Expect {
  bool overflow;
  double scale_after;
  uint32_t hysteresis_after;
};

void Trace(LossScaler& s, const std::vector<Expect>& steps) {
  for (size_t i = 0; i < steps.size(); ++i) {
    auto skip = s.Update(steps[i].overflow);
    ASSERT_TRUE(skip.ok()) << "step " << i << ": " << skip.status().ToString();
    EXPECT_EQ(*skip, steps[i].overflow) << "step " << i;
    EXPECT_EQ(s.scale(), steps[i].scale_after) << "step " << i;
    EXPECT_EQ(s.hysteresis_left(), steps[i].hysteresis_after) << "step " << i;
  }
}

TEST(LossScalerTest, DeepSpeedDefaults) {
  LossScaler s = Make(Dynamic(16, 1000, 2, false));
  EXPECT_TRUE(s.dynamic());
  EXPECT_EQ(s.scale(), 65536.0);
  // (cur_iter - last_overflow_iter) % 1000 == 0 with last_overflow_iter -1: first at iter 999.
  for (int i = 0; i < 999; ++i) ASSERT_FALSE(*s.Update(false));
  EXPECT_EQ(s.scale(), 65536.0);
  ASSERT_FALSE(*s.Update(false));
  EXPECT_EQ(s.scale(), 131072.0);
  EXPECT_EQ(s.iteration(), 1000u);
  EXPECT_EQ(s.skipped_steps(), 0u);
}

TEST(LossScalerTest, HysteresisWithoutConsecutive) {
  // init 16, window 3, hysteresis 2. The hysteresis is refilled only when the scale grows.
  LossScaler s = Make(Dynamic(4, 3, 2, false));
  Trace(s, {
               {true, 16, 1},   // iter 0: hysteresis 2 -> 1, scale kept, step skipped
               {false, 16, 1},  // iter 1: 1 - 0 = 1, not a multiple of 3
               {true, 8, 1},    // iter 2: hysteresis is 1: halve
               {true, 4, 1},    // iter 3: still 1: halve again
               {false, 4, 1},   // iter 4: 4 - 3 = 1
               {false, 4, 1},   // iter 5: 2
               {false, 8, 2},   // iter 6: 3 % 3 == 0: double, refill the hysteresis
               {true, 8, 1},    // iter 7: tolerated
               {false, 8, 1},   // iter 8: 1
               {false, 8, 1},   // iter 9: 2
               {false, 16, 2},  // iter 10: 3
               {false, 16, 2},  // iter 11: 4
               {false, 16, 2},  // iter 12: 5
               {false, 32, 2},  // iter 13: 6 % 3 == 0
           });
  EXPECT_EQ(s.skipped_steps(), 4u);
  EXPECT_EQ(s.iteration(), 14u);
  EXPECT_EQ(s.state().last_overflow_iteration, 7);
}

TEST(LossScalerTest, ConsecutiveHysteresis) {
  // With consecutive_hysteresis, any clean step refills it: only 2 overflows in a row halve.
  LossScaler s = Make(Dynamic(4, 100, 2, true));
  Trace(s, {
               {true, 16, 1},
               {false, 16, 2},
               {true, 16, 1},
               {true, 8, 1},
               {true, 4, 1},
               {false, 4, 2},
               {true, 4, 1},
           });
  // The same sequence without it halves on every overflow after the first.
  LossScaler n = Make(Dynamic(4, 100, 2, false));
  Trace(n, {
               {true, 16, 1},
               {false, 16, 1},
               {true, 8, 1},
               {true, 4, 1},
               {true, 2, 1},
               {false, 2, 1},
               {true, 1, 1},
           });
  EXPECT_EQ(n.skipped_steps(), 5u);
}

TEST(LossScalerTest, WindowOneDoublesEveryCleanStep) {
  LossScaler s = Make(Dynamic(3, 1, 1, false));
  Trace(s, {{false, 16, 1}, {true, 8, 1}, {false, 16, 1}, {false, 32, 1}});
}

TEST(LossScalerTest, FloorAndErrorAtMinimum) {
  // hysteresis 1 halves at once; min 1.5 floors 4 -> 2 -> 1.5.
  LossScaler s = Make(Dynamic(2, 1000, 1, false, 1.5));
  Trace(s, {{true, 2, 1}, {true, 1.5, 1}});
  auto at_min = s.Update(true);
  ASSERT_FALSE(at_min.ok());
  EXPECT_EQ(at_min.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(at_min.status().message().find("fp16.min_loss_scale 1.5"), std::string::npos)
      << at_min.status().message();
  EXPECT_EQ(s.iteration(), 2u);  // unchanged, as DeepSpeed raises before updating
  EXPECT_EQ(s.skipped_steps(), 2u);

  LossScaler quiet = Make(Dynamic(1, 1000, 1, false, 1.0), /*raise=*/false);
  Trace(quiet, {{true, 1, 1}, {true, 1, 1}, {true, 1, 1}});
  EXPECT_EQ(quiet.skipped_steps(), 3u);
}

TEST(LossScalerTest, Static) {
  Fp16Config c = Dynamic(16, 1000, 2, false);
  c.loss_scale = 128;
  LossScaler s = Make(c);
  EXPECT_FALSE(s.dynamic());
  EXPECT_EQ(s.scale(), 128.0);
  EXPECT_TRUE(*s.Update(true));
  EXPECT_FALSE(*s.Update(false));
  EXPECT_TRUE(*s.Update(true));
  EXPECT_EQ(s.scale(), 128.0);
  EXPECT_EQ(s.skipped_steps(), 2u);

  LossScaler off = Make(Fp16Config{});  // fp16 disabled: scale 1, never changes
  EXPECT_FALSE(off.dynamic());
  EXPECT_EQ(off.scale(), 1.0);
  for (int i = 0; i < 2000; ++i) ASSERT_FALSE(*off.Update(false));
  EXPECT_EQ(off.scale(), 1.0);
}

TEST(LossScalerTest, SaveAndRestore) {
  const Fp16Config c = Dynamic(4, 3, 2, false);
  LossScaler a = Make(c);
  const std::vector<bool> first = {true, false, true, false};
  for (bool o : first) ASSERT_TRUE(a.Update(o).ok());
  LossScaler b = Make(c);
  ASSERT_TRUE(b.Restore(a.state()).ok());
  for (bool o : {false, false, true, false, false, false, false}) {
    ASSERT_TRUE(a.Update(o).ok());
    ASSERT_TRUE(b.Update(o).ok());
    EXPECT_EQ(a.scale(), b.scale());
    EXPECT_EQ(a.hysteresis_left(), b.hysteresis_left());
  }
  EXPECT_EQ(a.skipped_steps(), b.skipped_steps());

  LossScalerState bad = a.state();
  bad.hysteresis_left = 3;
  EXPECT_EQ(b.Restore(bad).code(), StatusCode::kInvalidArgument);
  bad = a.state();
  bad.scale = 0;
  EXPECT_EQ(b.Restore(bad).code(), StatusCode::kInvalidArgument);
}

TEST(LossScalerTest, Refusals) {
  auto expect_refused = [](Fp16Config c, const std::string& key) {
    auto s = LossScaler::FromConfig(c);
    ASSERT_FALSE(s.ok()) << key;
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.status().message().find(key), std::string::npos) << s.status().message();
  };
  Fp16Config c = Dynamic(16, 1000, 2, false);
  c.loss_scale = -1;
  expect_refused(c, "fp16.loss_scale: -1");
  c = Dynamic(64, 1000, 2, false);
  expect_refused(c, "fp16.initial_scale_power: 64");
  c = Dynamic(16, 0, 2, false);
  expect_refused(c, "fp16.loss_scale_window: 0");
  c = Dynamic(16, 1000, 0, false);
  expect_refused(c, "fp16.hysteresis: 0");
  c = Dynamic(16, 1000, 2, false, 0.0);
  expect_refused(c, "fp16.min_loss_scale: 0");
  EXPECT_EQ(Make(Dynamic(63, 1, 1, false)).scale(), 9223372036854775808.0);
}

}  // namespace
}  // namespace zinf::train
