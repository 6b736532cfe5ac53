#include "src/train/default_job.h"

namespace zinf::train {

Config DefaultJobConfig() {
  Config c;
  c.zinf.model = {.layers = 6, .width = 192, .heads = 6, .seq_len = 128, .vocab = 256};
  c.train.train_micro_batch_size_per_gpu = 8;
  c.optimizer.lr = 2e-3;
  c.optimizer.weight_decay = 0.0;
  c.scheduler.type = SchedulerType::kWarmupCosineLR;
  c.scheduler.warmup_num_steps = 10;
  c.scheduler.warmup_type = WarmupType::kLinear;
  c.scheduler.warmup_min_ratio = 0.0;
  c.scheduler.cos_min_ratio = 0.1;
  c.train.gradient_clipping = 1.0;
  // A device budget that holds the activations (40.6 MiB at 8 x 128 tokens) and three of the six
  // blocks' 16-bit weights, so the device tier pages within every step (about 6 evictions a
  // step); a pinned budget the optimizer slabs and a few shards.
  c.zinf.budgets.device_bytes = 44ull << 20;
  c.zinf.budgets.pinned_bytes = 24ull << 20;
  c.zero.offload_param.device = OffloadDevice::kNvme;
  c.zero.offload_optimizer.device = OffloadDevice::kNvme;
  c.source = kDefaultJobSource;
  return c;
}

}  // namespace zinf::train
