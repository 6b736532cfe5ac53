// The C ABI's CPU Adam (include/zinf/zinf.h) over kernels/cpu/adam.h.
#include <fmt/format.h>

#include <string>
#include <vector>

#include "kernels/cpu/adam.h"
#include "src/capi/capi_adam.h"
#include "src/capi/capi_status.h"
#include "zinf/zinf.h"

namespace zinf::capi {
namespace {

Result<kernels::DType> DTypeOf(int dtype, const char* what, bool f32_allowed,
                               const char* call = "zinf_adam_step") {
  switch (dtype) {
    case ZINF_DTYPE_F32:
      if (f32_allowed) return kernels::DType::kF32;
      break;
    case ZINF_DTYPE_BF16: return kernels::DType::kBf16;
    case ZINF_DTYPE_F16: return kernels::DType::kF16;
    default: break;
  }
  return InvalidArgument(fmt::format("{}: {} {}; expected {}", call, what, dtype,
                                     f32_allowed ? "ZINF_DTYPE_F32, _BF16 or _F16"
                                                 : "ZINF_DTYPE_BF16 or ZINF_DTYPE_F16"));
}

Status Create(const zinf_adam_params* p, zinf_adam** out) {
  if (out == nullptr) return InvalidArgument("zinf_adam_create: out is NULL");
  *out = nullptr;
  ZINF_RETURN_IF_ERROR(CheckSized(p, p == nullptr ? 0 : p->size, sizeof(zinf_adam_params),
                                  "zinf_adam_create: params"));
  auto bad = [](const char* field, double v, const char* expected) {
    return InvalidArgument(
        fmt::format("zinf_adam_create: params.{} is {}; expected {}", field, v, expected));
  };
  if (!(p->lr >= 0)) return bad("lr", p->lr, ">= 0");
  if (!(p->beta1 >= 0 && p->beta1 < 1)) return bad("beta1", p->beta1, "in [0, 1)");
  if (!(p->beta2 >= 0 && p->beta2 < 1)) return bad("beta2", p->beta2, "in [0, 1)");
  if (!(p->eps > 0)) return bad("eps", p->eps, "> 0");
  if (!(p->weight_decay >= 0)) return bad("weight_decay", p->weight_decay, ">= 0");
  auto* a = new zinf_adam;
  a->hyper.lr = p->lr;
  a->hyper.beta1 = p->beta1;
  a->hyper.beta2 = p->beta2;
  a->hyper.eps = p->eps;
  a->hyper.weight_decay = p->weight_decay;
  a->hyper.adamw = p->adamw != 0;
  a->hyper.bias_correction = p->bias_correction != 0;
  a->options.threads = static_cast<int>(p->threads);
  *out = a;
  return Status::Ok();
}

}  // namespace

Status Step(zinf_adam* a, int64_t step, float lr, float* param, const void* grad, int grad_dtype,
            float* exp_avg, float* exp_avg_sq, uint64_t n, void* param16_out,
            int param16_dtype) {
  if (a == nullptr) return InvalidArgument("zinf_adam_step: adam is NULL");
  if (step < 1) {
    return InvalidArgument(fmt::format("zinf_adam_step: step {}; expected >= 1 (1-based)", step));
  }
  if (n == 0) return Status::Ok();
  if (param == nullptr || grad == nullptr || exp_avg == nullptr || exp_avg_sq == nullptr) {
    return InvalidArgument(fmt::format(
        "zinf_adam_step: {} is NULL with n = {}",
        param == nullptr ? "param" : grad == nullptr ? "grad" : exp_avg == nullptr ? "exp_avg"
                                                                                    : "exp_avg_sq",
        n));
  }
  kernels::AdamHyper h = a->hyper;
  h.step = step;
  if (lr >= 0) h.lr = lr;
  kernels::AdamBuffers b;
  b.param = param;
  b.grad = grad;
  ZINF_ASSIGN_OR_RETURN(b.grad_type, DTypeOf(grad_dtype, "grad_dtype", true));
  b.exp_avg = exp_avg;
  b.exp_avg_sq = exp_avg_sq;
  b.state_type = kernels::DType::kF32;
  b.param16_out = param16_out;
  if (param16_out != nullptr) {
    ZINF_ASSIGN_OR_RETURN(b.param16_type, DTypeOf(param16_dtype, "param16_dtype", false));
  }
  b.n = n;
  return kernels::AdamStep(h, b, a->options).status();
}

Status StepMany(zinf_adam* a, float lr, const zinf_adam_tensor* tensors, uint64_t count) {
  constexpr const char* kCall = "zinf_adam_step_many";
  if (a == nullptr) return InvalidArgument("zinf_adam_step_many: adam is NULL");
  if (count == 0) return Status::Ok();
  if (tensors == nullptr)
    return InvalidArgument(fmt::format("zinf_adam_step_many: tensors is NULL with count {}",
                                       count));
  // The array's stride is its first element's size: a caller built against a later header,
  // whose struct has grown, passes elements of that size.
  ZINF_RETURN_IF_ERROR(CheckSized(tensors, tensors->size, sizeof(zinf_adam_tensor),
                                  "zinf_adam_step_many: tensors[0]"));
  const uint64_t stride = tensors->size;
  if (stride % alignof(zinf_adam_tensor) != 0) {
    return InvalidArgument(fmt::format("{}: tensors[0].size is {}; expected a multiple of {} (the "
                                       "array's stride)", kCall, stride,
                                       alignof(zinf_adam_tensor)));
  }
  std::vector<kernels::AdamHyper> hypers(count, a->hyper);
  std::vector<kernels::AdamBuffers> bufs(count);
  for (uint64_t i = 0; i < count; ++i) {
    const auto& t = *reinterpret_cast<const zinf_adam_tensor*>(
        reinterpret_cast<const char*>(tensors) + i * stride);
    const std::string what = fmt::format("tensors[{}]", i);
    if (t.size != stride) {
      return InvalidArgument(fmt::format("{}: {}.size is {}, tensors[0].size {}; every element "
                                         "of the array has the same size", kCall, what, t.size,
                                         stride));
    }
    if (t.n == 0) continue;  // as zinf_adam_step: an empty tensor is not looked at
    if (t.step < 1) {
      return InvalidArgument(
          fmt::format("{}: {}.step is {}; expected >= 1 (1-based)", kCall, what, t.step));
    }
    if (t.n > 0 && (t.param == nullptr || t.grad == nullptr || t.exp_avg == nullptr ||
                    t.exp_avg_sq == nullptr)) {
      return InvalidArgument(fmt::format(
          "{}: {}.{} is NULL with n = {}", kCall, what,
          t.param == nullptr ? "param" : t.grad == nullptr ? "grad"
                                       : t.exp_avg == nullptr ? "exp_avg" : "exp_avg_sq",
          t.n));
    }
    hypers[i].step = t.step;
    if (lr >= 0) hypers[i].lr = lr;
    kernels::AdamBuffers& b = bufs[i];
    b.param = t.param;
    b.grad = t.grad;
    ZINF_ASSIGN_OR_RETURN(b.grad_type,
                          DTypeOf(t.grad_dtype, (what + ".grad_dtype").c_str(), true, kCall));
    b.exp_avg = t.exp_avg;
    b.exp_avg_sq = t.exp_avg_sq;
    b.state_type = kernels::DType::kF32;
    b.param16_out = t.param16_out;
    if (t.param16_out != nullptr) {
      ZINF_ASSIGN_OR_RETURN(b.param16_type, DTypeOf(t.param16_dtype,
                                                    (what + ".param16_dtype").c_str(), false,
                                                    kCall));
    }
    b.n = t.n;
  }
  return kernels::AdamStepMany(hypers, bufs, a->options).status();
}

}  // namespace zinf::capi

extern "C" {

ZINF_API int zinf_adam_create(const zinf_adam_params* params, zinf_adam** out) {
  return zinf::capi::Guard("zinf_adam_create",
                           [&] { return zinf::capi::Create(params, out); });
}

ZINF_API int zinf_adam_destroy(zinf_adam* adam) {
  delete adam;
  return ZINF_OK;
}

ZINF_API int zinf_adam_step(zinf_adam* adam, int64_t step, float lr, float* param,
                            const void* grad, int grad_dtype, float* exp_avg, float* exp_avg_sq,
                            uint64_t n, void* param16_out, int param16_dtype) {
  return zinf::capi::Guard("zinf_adam_step", [&] {
    return zinf::capi::Step(adam, step, lr, param, grad, grad_dtype, exp_avg, exp_avg_sq, n,
                            param16_out, param16_dtype);
  });
}

ZINF_API int zinf_adam_step_many(zinf_adam* adam, float lr, const zinf_adam_tensor* tensors,
                                 uint64_t count) {
  return zinf::capi::Guard("zinf_adam_step_many", [&] {
    return zinf::capi::StepMany(adam, lr, tensors, count);
  });
}

}  // extern "C"
