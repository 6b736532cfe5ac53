// LrSchedule against values worked out by hand from deepspeed/runtime/lr_schedules.py.
#include "src/train/lr_schedule.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

namespace zinf::train {
namespace {

constexpr double kTol = 1e-15;

SchedulerConfig Sched(SchedulerType type, uint64_t warmup, WarmupType warmup_type) {
  SchedulerConfig c;
  c.type = type;
  c.warmup_num_steps = warmup;
  c.warmup_type = warmup_type;
  return c;
}

LrSchedule Make(const SchedulerConfig& c, double lr, uint64_t total = 0) {
  auto s = LrSchedule::Create(c, lr, total);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return std::move(s).value();
}

TEST(LrScheduleTest, ConstantWithoutScheduler) {
  LrSchedule s = Make(SchedulerConfig{}, 3e-4);
  EXPECT_EQ(s.InitialLr(), 3e-4);
  EXPECT_EQ(s.Lr(0), 3e-4);
  EXPECT_EQ(s.Lr(123456), 3e-4);
  EXPECT_EQ(s.LrForStep(0), 3e-4);
}

TEST(LrScheduleTest, WarmupLrLog) {
  // min 0, max 0.01, W = 10: lr(s) = 0.01 × ln(s + 1) / ln(10) for s < 10, then 0.01.
  SchedulerConfig c = Sched(SchedulerType::kWarmupLR, 10, WarmupType::kLog);
  c.warmup_max_lr = 0.01;
  LrSchedule s = Make(c, 0.5);
  EXPECT_EQ(s.InitialLr(), 0.0);  // DeepSpeed's get_lr() at last_batch_iteration -1: min_lr
  EXPECT_EQ(s.Lr(0), 0.0);        // ln(1) = 0
  EXPECT_NEAR(s.Lr(4), 0.006989700043360187, kTol);  // 0.01 × ln 5 / ln 10
  EXPECT_NEAR(s.Lr(9), 0.01, kTol);                  // ln 10 / ln 10
  EXPECT_EQ(s.Lr(10), 0.01);
  EXPECT_EQ(s.Lr(1'000'000), 0.01);
  // The engine steps the scheduler after each applied step: step n runs at Lr(n - 1).
  EXPECT_EQ(s.LrForStep(0), 0.0);
  EXPECT_EQ(s.LrForStep(5), s.Lr(4));
}

TEST(LrScheduleTest, WarmupLrLinearAndDefaults) {
  // min 0.001, max absent: the optimizer's lr 0.011. lr(s) = 0.001 + 0.01 × s / 10.
  SchedulerConfig c = Sched(SchedulerType::kWarmupLR, 10, WarmupType::kLinear);
  c.warmup_min_lr = 0.001;
  LrSchedule s = Make(c, 0.011);
  EXPECT_EQ(s.max_lr(), 0.011);
  EXPECT_EQ(s.InitialLr(), 0.001);
  EXPECT_NEAR(s.Lr(0), 0.001, kTol);
  EXPECT_NEAR(s.Lr(5), 0.006, kTol);
  EXPECT_NEAR(s.Lr(9), 0.010, kTol);
  EXPECT_NEAR(s.Lr(10), 0.011, kTol);

  // warmup_num_steps below 2 becomes 2 (DeepSpeed: max(2, warmup_num_steps)).
  c.warmup_num_steps = 1;
  LrSchedule two = Make(c, 0.011);
  EXPECT_EQ(two.warmup_steps(), 2u);
  EXPECT_NEAR(two.Lr(1), 0.006, kTol);  // 1 / 2 of the way
  EXPECT_NEAR(two.Lr(2), 0.011, kTol);
  c.warmup_type = WarmupType::kLog;
  LrSchedule log2 = Make(c, 0.011);
  EXPECT_NEAR(log2.Lr(1), 0.011, kTol);  // ln 2 / ln 2
}

TEST(LrScheduleTest, WarmupDecayLr) {
  // Linear warmup over 10 steps to 0.02, then (30 - s) / (30 - 10) × 0.02 down to min at 30.
  SchedulerConfig c = Sched(SchedulerType::kWarmupDecayLR, 10, WarmupType::kLinear);
  c.warmup_max_lr = 0.02;
  c.total_num_steps = 30;
  LrSchedule s = Make(c, 1.0, /*total=*/999);
  EXPECT_EQ(s.total_steps(), 30u);  // the config's count wins over the trainer's
  EXPECT_NEAR(s.Lr(5), 0.01, kTol);
  EXPECT_NEAR(s.Lr(10), 0.02, kTol);  // (30 - 10) / 20 = 1
  EXPECT_NEAR(s.Lr(20), 0.01, kTol);
  EXPECT_NEAR(s.Lr(25), 0.005, kTol);
  EXPECT_EQ(s.Lr(30), 0.0);
  EXPECT_EQ(s.Lr(40), 0.0);  // max(0, -10 / 20): warmup_min_lr past the end

  // Past the end it stays at warmup_min_lr; absent total_num_steps takes the trainer's.
  c.warmup_min_lr = 0.001;
  c.total_num_steps = 0;
  LrSchedule t = Make(c, 1.0, /*total=*/30);
  EXPECT_EQ(t.total_steps(), 30u);
  EXPECT_NEAR(t.Lr(20), 0.001 + 0.019 * 0.5, kTol);
  EXPECT_EQ(t.Lr(31), 0.001);
  EXPECT_EQ(t.InitialLr(), 0.001);

  // total < warmup (DeepSpeed only warns): after warmup, max(0, (5 - s) / max(1, -5)) = 0.
  c.total_num_steps = 5;
  LrSchedule u = Make(c, 1.0);
  EXPECT_EQ(u.Lr(10), 0.001);
  EXPECT_NEAR(u.Lr(9), 0.001 + 0.019 * 0.9, kTol);
}

TEST(LrScheduleTest, WarmupCosineLr) {
  // lr 0.1, W 10 linear, T 110, warmup_min_ratio 0.1, cos_min_ratio 0.01.
  SchedulerConfig c = Sched(SchedulerType::kWarmupCosineLR, 10, WarmupType::kLinear);
  c.total_num_steps = 110;
  c.warmup_min_ratio = 0.1;
  c.cos_min_ratio = 0.01;
  LrSchedule s = Make(c, 0.1);
  EXPECT_EQ(s.InitialLr(), 0.0);  // DeepSpeed's get_lr() returns [0.0] before the first step()
  EXPECT_EQ(s.LrForStep(0), 0.0);
  EXPECT_NEAR(s.Lr(0), 0.01, kTol);   // ratio 0.1
  EXPECT_NEAR(s.Lr(5), 0.055, kTol);  // 0.1 + 0.5 × 0.9
  // After warmup: k = s - 10 + 1, n = 100, ratio = 0.01 + 0.99 × (1 + cos(pi k / n)) / 2.
  EXPECT_NEAR(s.Lr(10), 0.09997557473810371, kTol);  // k = 1
  EXPECT_NEAR(s.Lr(34), 0.0855017856687341, kTol);   // k = 25
  EXPECT_NEAR(s.Lr(59), 0.0505, kTol);               // k = 50: cos = 0
  EXPECT_NEAR(s.Lr(109), 0.001, kTol);               // k = 100: cos = -1, ratio = cmin
  EXPECT_NEAR(s.Lr(209), 0.1, kTol);                 // k = 200: DeepSpeed's cosine rises again

  // Log warmup: ratio = 0.1 + ln(s + 1) / ln(10) × 0.9.
  c.warmup_type = WarmupType::kLog;
  LrSchedule l = Make(c, 0.1);
  EXPECT_NEAR(l.Lr(3), 0.0641853992195166, kTol);
  EXPECT_NEAR(l.Lr(0), 0.01, kTol);

  // T == W divides by zero in DeepSpeed from s = W on; here the decay's end, cmin × lr.
  c.total_num_steps = 10;
  LrSchedule z = Make(c, 0.1);
  EXPECT_NEAR(z.Lr(10), 0.001, kTol);
  EXPECT_FALSE(std::isnan(z.Lr(11)));
}

TEST(LrScheduleTest, Refusals) {
  auto neg = LrSchedule::Create(SchedulerConfig{}, -1.0, 10);
  EXPECT_EQ(neg.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(neg.status().message().find("optimizer.params.lr"), std::string::npos);

  SchedulerConfig c = Sched(SchedulerType::kWarmupLR, 10, WarmupType::kLog);
  c.warmup_min_lr = 0.02;
  auto inverted = LrSchedule::Create(c, 0.01, 10);
  ASSERT_FALSE(inverted.ok());
  const std::string m = inverted.status().message();
  EXPECT_NE(m.find("scheduler.params.warmup_min_lr"), std::string::npos) << m;
  EXPECT_NE(m.find("0.02"), std::string::npos) << m;
  EXPECT_NE(m.find("0.01"), std::string::npos) << m;

  for (SchedulerType t : {SchedulerType::kWarmupDecayLR, SchedulerType::kWarmupCosineLR}) {
    auto no_total = LrSchedule::Create(Sched(t, 10, WarmupType::kLog), 0.01, 0);
    ASSERT_FALSE(no_total.ok());
    EXPECT_NE(no_total.status().message().find("total_num_steps"), std::string::npos);
  }
  EXPECT_TRUE(
      LrSchedule::Create(Sched(SchedulerType::kWarmupLR, 10, WarmupType::kLog), 0.01, 0).ok());
}

TEST(LrScheduleTest, Describe) {
  SchedulerConfig c = Sched(SchedulerType::kWarmupDecayLR, 1000, WarmupType::kLog);
  c.total_num_steps = 10000;
  EXPECT_EQ(Make(c, 0.001).Describe(),
            "WarmupDecayLR(log warmup 1000 steps, 0 -> 0.001, total 10000)");
}

}  // namespace
}  // namespace zinf::train
