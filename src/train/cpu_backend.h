// src/train/cpu_backend.h — the CPU Backend: kernels/cpu/layer_ops.h on host memory.
//
// Contract: every op runs at once on the calling thread (OpenBLAS GEMMs, oneTBB loops for the
// rest), so Synchronize() has nothing to wait for. Shapes are checked to be positive and the
// pointers the op needs non-null (InvalidArgument naming the op otherwise). Results are
// deterministic for a given thread count (see layer_ops.h).
//
// Thread-safety: as Backend — one thread at a time.
#pragma once

#include <memory>

#include "kernels/cpu/layer_ops.h"
#include "src/train/backend.h"

namespace zinf::train {

template <typename T>
std::unique_ptr<Backend<T>> MakeCpuBackend(const kernels::cpu::OpOptions& options = {});

}  // namespace zinf::train
