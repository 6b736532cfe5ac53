// `zinf info`: what this build and this machine offer.
#include <fmt/format.h>

#include "src/base/cuda_probe.h"
#include "tools/commands.h"

namespace zinf::tools {

void RegisterInfo(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("info", "Print the build's features and the devices found");
  cmd->callback([&exit_code] {
    CudaProbe cuda = ProbeCuda();
    fmt::print("zinf {}\n", ZINF_VERSION);
    fmt::print("cuda: built={} devices={} ({})\n", cuda.built_with_cuda ? "yes" : "no",
               cuda.device_count, cuda.detail);
    exit_code = 0;
  });
}

}  // namespace zinf::tools
