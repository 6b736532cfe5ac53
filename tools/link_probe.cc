#include "tools/link_probe.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include <fmt/format.h>

namespace zinf::tools {

Result<LinkRates> ProbeLink(Device& device, uint64_t bytes, int reps) {
  if (reps < 1) return InvalidArgument(fmt::format("ProbeLink: reps {}: expected >= 1", reps));
  const uint64_t budget = device.budget_bytes();
  bytes = std::max<uint64_t>(std::min<uint64_t>(bytes, budget / 2 / kDeviceAlignment * kDeviceAlignment),
                             1ull << 20);
  if (bytes > budget) {
    return ResourceExhausted(fmt::format(
        "measuring the link: a device budget of {} bytes cannot hold a 1 MiB buffer", budget));
  }
  ZINF_ASSIGN_OR_RETURN(void* dev, device.Allocate(bytes));
  auto host = device.AllocatePinned(bytes);
  if (!host.ok()) {
    device.Free(dev).IgnoreError();
    return host.status();
  }
  std::memset(*host, 1, bytes);
  LinkRates out;
  Status status = [&]() -> Status {
    ZINF_ASSIGN_OR_RETURN(Stream * up, device.CreateStream("link probe h2d"));
    ZINF_ASSIGN_OR_RETURN(Stream * down, device.CreateStream("link probe d2h"));
    for (int dir = 0; dir < 2; ++dir) {
      Stream* s = dir == 0 ? up : down;
      std::vector<double> t;
      for (int rep = 0; rep <= reps; ++rep) {
        const auto t0 = std::chrono::steady_clock::now();
        ZINF_RETURN_IF_ERROR(dir == 0 ? device.CopyToDevice(s, dev, *host, bytes)
                                      : device.CopyToHost(s, *host, dev, bytes));
        ZINF_RETURN_IF_ERROR(device.StreamSynchronize(s));
        const double sec =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (rep > 0) t.push_back(sec);
      }
      std::sort(t.begin(), t.end());
      const size_t k = t.size() / 2;
      const double median = t.size() % 2 ? t[k] : (t[k - 1] + t[k]) / 2;
      const double rate = static_cast<double>(bytes) / std::max(median, 1e-9) / 1e9;
      (dir == 0 ? out.h2d_gbps : out.d2h_gbps) = rate;
    }
    return Status::Ok();
  }();
  Status freed = device.FreePinned(*host);
  Status freed_dev = device.Free(dev);
  ZINF_RETURN_IF_ERROR(status);
  ZINF_RETURN_IF_ERROR(freed);
  ZINF_RETURN_IF_ERROR(freed_dev);
  return out;
}

}  // namespace zinf::tools
