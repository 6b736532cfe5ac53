#include "src/train/executor.h"

// The layer executor's --profile: each bound of a step measured alone.
#include <chrono>
#include <cstring>

#include <fmt/format.h>

#include "io/aligned_buffer.h"
#include "kernels/cpu/cast.h"
#include "src/base/units.h"
#include "src/train/executor_internal.h"

namespace zinf::train {

using namespace detail;  // NOLINT: the executor's own helpers

Result<ProfileBounds> LayerExecutor::MeasureBounds(const int32_t* tokens, const int32_t* targets,
                                                   uint64_t micro_batches) {
  ZINF_RETURN_IF_ERROR(FinishOptimizerStep());
  const Model& d = model_;
  const int B = batch_, T = seq_, L = d.layers();
  const uint64_t NC = static_cast<uint64_t>(B) * T * d.width();
  ProfileBounds b;
  // Compute alone: the same ops as ForwardBackward, no fetches, no gradient hand-over.
  ZINF_RETURN_IF_ERROR(Upload(tokens, targets));
  ZINF_RETURN_IF_ERROR(FetchWeights(0, wemb_));
  ZINF_RETURN_IF_ERROR(FetchWeights(L > 0 ? 1 : d.final_unit(), wbuf_));
  auto time_compute = [&]() -> Result<double> {
    auto t0 = Clock::now();
    for (uint64_t m = 0; m < micro_batches; ++m) {
      ZINF_RETURN_IF_ERROR(d.EmbeddingForward<float>(be_, wemb_, d_tokens_, xs_, B, T));
      for (int l = 0; l < L; ++l) {
        ZINF_RETURN_IF_ERROR(d.LayerForward<float>(be_, wbuf_, xs_ + NC * l, xs_ + NC * (l + 1),
                                                   acts_, scratch_, B, T));
      }
      // wbuf_ (a layer's weights, in a buffer of the largest unit's size) stands in for the
      // final unit's: the time is the same whatever the values.
      ZINF_RETURN_IF_ERROR(d.HeadForward<float>(be_, wbuf_, wemb_, xs_ + NC * L, d_targets_,
                                                head_, B, T));
      ZINF_RETURN_IF_ERROR(be_.Zero(gemb_, d.UnitParams(0)));
      ZINF_RETURN_IF_ERROR(d.HeadBackward<float>(be_, wbuf_, gbuf_, wemb_, gemb_, xs_ + NC * L,
                                                 d_targets_, head_, dres_, 1.0f, B, T));
      for (int l = L - 1; l >= 0; --l) {
        ZINF_RETURN_IF_ERROR(d.LayerForward<float>(be_, wbuf_, xs_ + NC * l, xs_ + NC * (l + 1),
                                                   acts_, scratch_, B, T));
        ZINF_RETURN_IF_ERROR(be_.Zero(gbuf_, d.UnitParams(L > 0 ? 1 : 0)));
        ZINF_RETURN_IF_ERROR(d.LayerBackward<float>(be_, wbuf_, gbuf_, xs_ + NC * l, acts_, dres_,
                                                    scratch_, B, T));
      }
      ZINF_RETURN_IF_ERROR(d.EmbeddingBackward<float>(be_, gemb_, d_tokens_, dres_, B, T));
      ZINF_RETURN_IF_ERROR(be_.Synchronize());
    }
    return Since(t0);
  };
  // Timed kComputeRepeats times; the median is the bound (one sample on a shared machine
  // swings by tens of percent).
  constexpr int kComputeRepeats = 3;
  std::vector<double> compute_times;
  for (int rep = 0; rep < kComputeRepeats; ++rep) {
    ZINF_ASSIGN_OR_RETURN(double t, time_compute());
    compute_times.push_back(t);
  }
  std::sort(compute_times.begin(), compute_times.end());
  b.compute_seconds = compute_times[kComputeRepeats / 2];

  // NVMe alone: the optimizer state's extents (or the 16-bit weights' when the optimizer state
  // is in memory), read and then written back unchanged, one unit at a time at full depth.
  // None when the state is in memory and the 16-bit weights are derived from it: 0 s.
  if (rt_.swap != nullptr) {
    std::vector<offload::Extent> extents;
    for (const auto& ou : opt_units_) {
      for (const offload::Extent* e : {&ou.master, &ou.exp_avg, &ou.exp_avg_sq, &ou.param16}) {
        if (e->bytes > 0) extents.push_back(*e);
      }
    }
    uint64_t max_bytes = 0, total = 0;
    for (const auto& e : extents) {
      max_bytes = std::max(max_bytes, rt_.swap->Padded(e.bytes));
      total += rt_.swap->Padded(e.bytes);
    }
    ZINF_ASSIGN_OR_RETURN(auto buf, io::AlignedBuffer::Allocate(std::max<uint64_t>(max_bytes, 4096), 4096));
    double read_s = 0, write_s = 0;
    for (const auto& e : extents) {
      const uint64_t n = rt_.swap->Padded(e.bytes);
      auto r0 = Clock::now();
      ZINF_RETURN_IF_ERROR(rt_.swap->engine().Read(rt_.swap->file(), e.offset, buf.data(), n));
      read_s += Since(r0);
      auto w0 = Clock::now();
      ZINF_RETURN_IF_ERROR(rt_.swap->engine().Write(rt_.swap->file(), e.offset, buf.data(), n));
      write_s += Since(w0);
    }
    if (read_s > 0) b.read_gbps = static_cast<double>(total) / read_s / 1e9;
    if (write_s > 0) b.write_gbps = static_cast<double>(total) / write_s / 1e9;
  }

  // Adam alone, over scratch state of each unit's size in memory.
  const uint64_t max_n = d.MaxUnitParams();
  std::vector<float> p(max_n, 0.01f), g(max_n, 1e-3f), m(max_n, 0.0f), v(max_n, 0.0f);
  // 16-bit gradients when the shards hold them: 0x3a83 is ~1e-3 in bf16 (~0.81 in fp16; only
  // the time is measured).
  std::vector<uint16_t> p16(max_n), g16(max_n, 0x3a83);
  const void* grads = GradType() == kernels::DType::kF32 ? static_cast<const void*>(g.data())
                                                         : g16.data();
  kernels::AdamHyper hyper;
  hyper.adamw = true;
  auto a0 = Clock::now();
  for (uint32_t u = 0; u < d.units(); ++u) {
    kernels::AdamBuffers ab{p.data(), grads, GradType(), m.data(), v.data(),
                            options_.moment_type, p16.data(), options_.param16_type,
                            StateElems(u)};
    ZINF_RETURN_IF_ERROR(kernels::AdamStep(hyper, ab, options_.adam).status());
  }
  b.adam_seconds = Since(a0);
  if (ReducesGrads()) {
    ZINF_ASSIGN_OR_RETURN(b.comm_seconds, TimeCollectives(micro_batches));
  }
  return b;
}

Result<double> LayerExecutor::TimeCollectives(uint64_t micro_batches) {
  comm::Communicator& c = *options_.comm;
  const auto w = static_cast<uint64_t>(c.world());
  uint64_t most = 0;
  for (uint32_t u = 0; u < model_.units(); ++u) most = std::max(most, ChunkOf(u).per);
  // Scratch of the largest unit padded to world chunks: fp32 in, fp32 out, 16-bit gathered.
  std::vector<float> in(std::max(most * w, model_.MaxUnitParams()), 1.0f), out(in.size());
  std::vector<uint16_t> in16(in.size(), 0x3f80), all16(in.size());
  auto pass = [&]() -> Status {
    const uint32_t units = model_.units();
    auto gather = [&](uint32_t u) {
      const Chunk ch = ChunkOf(u);
      return c.AllGather(in16.data() + ch.lo, all16.data(), ch.per, comm::DType::kBf16).Wait();
    };
    for (uint32_t u = 0; u < units; ++u) {
      const Chunk ch = ChunkOf(u);
      if (!partitioned_) {  // stage 0
        ZINF_RETURN_IF_ERROR(c.AllReduce(in.data(), comm::DType::kF32, out.data(),
                                         comm::DType::kF32, model_.UnitParams(u))
                                 .Wait());
      } else if (!partitioned_grads_) {  // ZeRO-1
        ZINF_RETURN_IF_ERROR(c.ReduceScatter(in.data(), comm::DType::kF32, out.data(),
                                             comm::DType::kF32, ch.per)
                                 .Wait());
        ZINF_RETURN_IF_ERROR(gather(u));
      } else {  // ZeRO-2 and 3
        for (uint64_t m = 0; m < micro_batches; ++m) {
          if (partitioned_params_) {
            ZINF_RETURN_IF_ERROR(gather(u));  // forward
            const bool layer = u >= 1 && u <= static_cast<uint32_t>(model_.layers());
            if (layer) ZINF_RETURN_IF_ERROR(gather(u));  // recompute
          }
          ZINF_RETURN_IF_ERROR(c.ReduceScatter(in16.data(), comm::DType::kBf16, out.data(),
                                               comm::DType::kF32, ch.per)
                                   .Wait());
        }
        if (!partitioned_params_) ZINF_RETURN_IF_ERROR(gather(u));
      }
    }
    return Status::Ok();
  };
  std::vector<double> times;
  for (int rep = 0; rep < 3; ++rep) {
    auto t0 = Clock::now();
    ZINF_RETURN_IF_ERROR(pass().WithContext("--profile: timing the collectives alone"));
    times.push_back(Since(t0));
  }
  std::sort(times.begin(), times.end());
  return times[1];
}

}  // namespace zinf::train
