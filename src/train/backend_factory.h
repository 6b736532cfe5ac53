// src/train/backend_factory.h — the Backend that computes on a given Device.
//
// Contract: MakeBackend returns the CPU backend for the host-emulated device (its memory is host
// memory; `threads` oneTBB workers, 0 = every core) and the CUDA backend for a CUDA device,
// launching on `compute`'s native stream, its buffers and cuBLAS workspace taken from `arena`
// when given. A CUDA device in a build without the CUDA backend is refused (Unimplemented,
// saying how to build it).
//
// Thread-safety: call from one thread; the backend is then that thread's.
#pragma once

#include <memory>

#include "src/base/device.h"
#include "src/base/device_arena.h"
#include "src/train/backend.h"
#include "zinf/status.h"

namespace zinf::train {

Result<std::unique_ptr<Backend<float>>> MakeBackend(Device& device, Stream* compute, int threads,
                                                    DeviceArena* arena = nullptr);

}  // namespace zinf::train
