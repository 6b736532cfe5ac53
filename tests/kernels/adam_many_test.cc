// Tests of AdamStepMany (kernels/cpu/adam.h): many tensors of every size, type and
// hyper-parameter set stepped in one call equal each stepped alone, bit for bit, in every
// variant, thread count and chunk; the padding between tensors touches nothing; a non-finite
// gradient anywhere leaves every tensor untouched; errors name the tensor.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/adam.h"
#include "tests/kernels/kernel_test_util.h"

namespace zinf::kernels {
namespace {

using testing::FillMixed;

constexpr size_t kGuard = 8;  // elements after each tensor that must stay untouched

// One tensor's buffers (with guard elements) and what to step it with.
struct Tensor {
  size_t n;
  AdamHyper hyper;
  DType grad_type, state_type;
  bool p16;
  std::vector<float> param;
  std::vector<uint8_t> grad, m, v;
  std::vector<uint16_t> param16;
  AdamBuffers Buffers() {
    AdamBuffers b;
    b.param = param.data();
    b.grad = grad.data();
    b.grad_type = grad_type;
    b.exp_avg = m.data();
    b.exp_avg_sq = v.data();
    b.state_type = state_type;
    b.param16_out = p16 ? param16.data() : nullptr;
    b.param16_type = DType::kBf16;
    b.n = n;
    b.stochastic_state = state_type == DType::kBf16;
    b.state_seed = 1234 + n;
    b.state_index_base = n % 7 * 1000;
    return b;
  }
};

// A mixed group: sizes around the SIMD widths and chunks, every gradient type, fp32 and bf16
// moments, with and without a 16-bit copy, Adam and AdamW, different steps and rates.
std::vector<Tensor> MakeGroup(uint32_t seed) {
  const size_t sizes[] = {0, 1, 17, 63, 64, 65, 1000, 4097, 40000, 3, 70001};
  const DType grads[] = {DType::kF32, DType::kBf16, DType::kF16};
  std::mt19937 rng(seed);
  std::vector<Tensor> ts;
  for (size_t i = 0; i < std::size(sizes); ++i) {
    Tensor t;
    t.n = sizes[i];
    t.grad_type = grads[i % 3];
    t.state_type = i % 4 == 3 ? DType::kBf16 : DType::kF32;
    t.p16 = i % 2 == 0;
    t.hyper.adamw = i % 2 == 1;
    t.hyper.weight_decay = 0.01f * float(i % 3);
    t.hyper.lr = 1e-3f * float(1 + i);
    t.hyper.step = int64_t(1 + 3 * i);
    t.hyper.grad_scale = i == 5 ? 0.5f : 1.0f;
    const size_t all = t.n + kGuard;
    const size_t gs = DTypeSize(t.grad_type), ss = DTypeSize(t.state_type);
    t.param.assign(all, 0.0f);
    t.grad.assign(all * gs, 0);
    t.m.assign(all * ss, 0);
    t.v.assign(all * ss, 0);
    t.param16.assign(all, 0xabcd);
    FillMixed(t.param.data(), DType::kF32, all, rng, 1e4f);
    FillMixed(t.grad.data(), t.grad_type, all, rng, 1e3f);
    FillMixed(t.m.data(), t.state_type, all, rng, 1e2f);
    FillMixed(t.v.data(), t.state_type, all, rng, 1e2f, true);
    ts.push_back(std::move(t));
  }
  return ts;
}

// AdamStepMany's arguments for a group.
struct Args {
  std::vector<AdamHyper> hypers;
  std::vector<AdamBuffers> bufs;
  explicit Args(std::vector<Tensor>& ts) {
    for (Tensor& t : ts) {
      hypers.push_back(t.hyper);
      bufs.push_back(t.Buffers());
    }
  }
};

bool SameBits(const Tensor& a, const Tensor& b) {
  return a.param == b.param && a.grad == b.grad && a.m == b.m && a.v == b.v &&
         a.param16 == b.param16;
}

class AdamManyPerVariant : public ::testing::TestWithParam<KernelVariant> {};

TEST_P(AdamManyPerVariant, ManyTensorsEqualEachSteppedAlone) {
  const KernelVariant variant = GetParam();
  ZINF_SKIP_IF_CPU_LACKS(variant);
  std::vector<Tensor> alone = MakeGroup(5);
  const std::vector<Tensor> before = alone;
  for (Tensor& t : alone) {
    AdamOptions o;
    o.variant = variant;
    o.threads = 1;
    ASSERT_TRUE(AdamStep(t.hyper, t.Buffers(), o).ok());
  }
  for (const auto& [threads, chunk] : {std::pair{1, size_t{1} << 20}, std::pair{2, size_t{64}},
                                       std::pair{2, size_t{4096}}, std::pair{3, size_t{1000}},
                                       std::pair{2, kDefaultChunkElems}}) {
    std::vector<Tensor> many = before;
    const Args args(many);
    AdamOptions o;
    o.variant = variant;
    o.threads = threads;
    o.chunk_elems = chunk;
    Result<AdamStepInfo> info = AdamStepMany(args.hypers, args.bufs, o);
    ASSERT_TRUE(info.ok()) << info.status().ToString();
    EXPECT_FALSE(info->found_nonfinite);
    for (size_t i = 0; i < many.size(); ++i) {
      // Equal to the tensor alone, guards included (so the padding wrote nothing), and not
      // the inputs (the step ran) unless the tensor is empty.
      EXPECT_TRUE(SameBits(many[i], alone[i]))
          << "tensor " << i << " (n " << many[i].n << "), " << threads << " threads, chunk "
          << chunk;
      if (many[i].n > 0) EXPECT_NE(many[i].param, before[i].param) << "tensor " << i;
    }
  }
}

TEST_P(AdamManyPerVariant, ANonFiniteGradientAnywhereLeavesEveryTensorUntouched) {
  const KernelVariant variant = GetParam();
  ZINF_SKIP_IF_CPU_LACKS(variant);
  for (size_t bad_tensor : {size_t{1}, size_t{8}, size_t{10}}) {
    std::vector<Tensor> many = MakeGroup(9);
    Tensor& t = many[bad_tensor];
    StoreFromFloat(t.grad.data(), t.grad_type, t.n - 1, NAN);
    const std::vector<Tensor> before = many;
    const Args args(many);
    AdamOptions o;
    o.variant = variant;
    o.threads = 2;
    o.chunk_elems = 1024;
    o.check_finite = true;
    Result<AdamStepInfo> info = AdamStepMany(args.hypers, args.bufs, o);
    ASSERT_TRUE(info.ok()) << info.status().ToString();
    EXPECT_TRUE(info->found_nonfinite) << "NaN in tensor " << bad_tensor;
    for (size_t i = 0; i < many.size(); ++i)
      EXPECT_TRUE(SameBits(many[i], before[i])) << "tensor " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Variants, AdamManyPerVariant,
                         ::testing::ValuesIn(testing::ConcreteVariants()),
                         [](const ::testing::TestParamInfo<KernelVariant>& info) {
                           return std::string(VariantName(info.param));
                         });

TEST(AdamManyValidation, ErrorsNameTheTensorAndModifyNothing) {
  std::vector<Tensor> many = MakeGroup(3);
  const std::vector<Tensor> before = many;
  Args args(many);
  std::vector<AdamHyper>& hypers = args.hypers;
  std::vector<AdamBuffers>& bufs = args.bufs;
  bufs[6].exp_avg_sq = nullptr;
  Result<AdamStepInfo> r = AdamStepMany(hypers, bufs);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("tensor 6: Adam exp_avg_sq is null"), std::string::npos)
      << r.status().message();
  bufs[6] = many[6].Buffers();
  hypers[9].step = 0;
  r = AdamStepMany(hypers, bufs);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("tensor 9: Adam step = 0"), std::string::npos)
      << r.status().message();
  hypers.pop_back();
  r = AdamStepMany(hypers, bufs);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("10 hyper-parameter sets for 11 tensors"),
            std::string::npos) << r.status().message();
  for (size_t i = 0; i < many.size(); ++i) EXPECT_TRUE(SameBits(many[i], before[i]));
  EXPECT_TRUE(AdamStepMany({}, {}).ok());
}

}  // namespace
}  // namespace zinf::kernels
