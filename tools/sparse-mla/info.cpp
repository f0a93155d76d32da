// sparse-mla info: what this build can run on this machine.
#include <iostream>
#include <memory>
#include <string>

#include "commands.hpp"
#include "sparse_mla/device.hpp"
#include "sparse_mla/kernels.hpp"
#include "sparse_mla/kokkos_runtime.hpp"

namespace sparse_mla::cli {

void add_info(CLI::App& app, Commands& commands) {
  auto* info = app.add_subcommand("info", "List the backends compiled in, the devices found and the Kokkos in use");
  info->callback([&commands] {
    commands.run = [] {
      std::cout << "sparse-mla " << SPARSE_MLA_VERSION << ", Kokkos " << kokkos_version() << "\n";
      for (const std::string& name : compiled_backends()) {
        const std::string reason = backend_unavailable_reason(name);
        if (!reason.empty()) {
          std::cout << "  " << name << ": unavailable: " << reason << "\n";
          continue;
        }
        auto device = open_device(name);
        const DeviceInfo d = device->info();
        std::cout << "  " << name << ": " << d.name << ", " << d.architecture;
        if (d.total_memory) std::cout << ", " << (d.total_memory >> 20) << " MiB";
        std::cout << ", kernels: " << (device->has_kernels() ? device->kernels().execution_space() : "none") << "\n";
      }
      return exit_ok;
    };
  });
}

}  // namespace sparse_mla::cli
