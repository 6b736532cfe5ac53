// kernels/cpu/sum_squares.cc — SumSquares and SumSquares16 of grad_ops.h: Σ x² in double in a
// fixed order (fixed element chunks, kLanes partial sums in each, the chunks' sums added in
// chunk order), so the global gradient norm has the same bits for every thread count.
#include <vector>

#include "kernels/cpu/grad_ops.h"
#include "kernels/cpu/half_convert.h"
#include "kernels/cpu/parallel.h"

namespace zinf::kernels::cpu {
namespace {

constexpr int kLanes = 8;
constexpr size_t kSumSquaresChunk = size_t{32} << 10;

template <typename Load>
double SumSquaresOf(size_t n, const OpOptions& o, const Load& load) {
  if (n == 0) return 0.0;
  std::vector<double> partials((n + kSumSquaresChunk - 1) / kSumSquaresChunk);
  ParallelForChunks(n, {.threads = o.threads, .chunk_elems = kSumSquaresChunk},
                    [&](size_t i0, size_t i1) {
                      double acc[kLanes] = {};
                      size_t i = i0;
                      for (; i + kLanes <= i1; i += kLanes)
                        for (int j = 0; j < kLanes; ++j) {
                          const double v = load(i + j);
                          acc[j] += v * v;
                        }
                      for (int j = 0; i < i1; ++i, ++j) {
                        const double v = load(i);
                        acc[j] += v * v;
                      }
                      partials[i0 / kSumSquaresChunk] =
                          ((acc[0] + acc[4]) + (acc[1] + acc[5])) +
                          ((acc[2] + acc[6]) + (acc[3] + acc[7]));
                    });
  double total = 0.0;
  for (double p : partials) total += p;
  return total;
}

}  // namespace

template <typename T>
double SumSquares(const T* x, size_t n, const OpOptions& o) {
  return SumSquaresOf(n, o, [x](size_t i) { return double(x[i]); });
}

double SumSquares16(const uint16_t* x, DType type, size_t n, const OpOptions& o) {
  if (type == DType::kBf16) {
    return SumSquaresOf(n, o, [x](size_t i) { return double(Bf16ToFloat(x[i])); });
  }
  return SumSquaresOf(n, o, [x](size_t i) { return double(F16ToFloat(x[i])); });
}

template double SumSquares<float>(const float*, size_t, const OpOptions&);
template double SumSquares<double>(const double*, size_t, const OpOptions&);

}  // namespace zinf::kernels::cpu
