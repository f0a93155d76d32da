// sparse-mla info: what this build can run on this machine: the backends
// compiled in, the devices each one finds (name, memory, compute capability
// or gfx target, the kernels' execution space), why a backend has none, and
// the Kokkos in use.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "commands.hpp"
#include "sparse_mla/device.hpp"
#include "sparse_mla/error.hpp"
#include "sparse_mla/kokkos_runtime.hpp"

namespace sparse_mla::cli {

namespace {

constexpr int max_devices = 64;

struct FoundDevice {
  DeviceInfo info;
  std::string kernels;  // the execution space, or why there are none
};

struct BackendReport {
  std::string name;
  std::string unavailable;  // "" when it has a device
  std::vector<FoundDevice> devices;
};

// Opens devices 0, 1, ... until one fails: open_device refuses an index
// past the last device.
BackendReport probe(const std::string& backend) {
  BackendReport report{backend, backend_unavailable_reason(backend), {}};
  if (!report.unavailable.empty()) return report;
  for (int index = 0; index < max_devices; ++index) {
    std::shared_ptr<Device> device;
    try {
      device = open_device(backend, index);
    } catch (const Error& e) {
      if (index == 0) report.unavailable = e.what();
      break;
    }
    FoundDevice found{device->info(), ""};
    found.kernels = device->has_kernels() ? device->execution_space()
                                          : "none (this build has only the native layer: its Kokkos lacks this backend)";
    report.devices.push_back(std::move(found));
  }
  return report;
}

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& item : items) out += (out.empty() ? "" : ", ") + item;
  return out;
}

std::string memory(std::size_t bytes) {
  if (bytes == 0) return "memory not reported";
  return std::to_string((bytes + (std::size_t{1} << 29)) >> 30) + " GiB";
}

void print_text(const std::vector<BackendReport>& reports) {
  std::cout << "sparse-mla " << SPARSE_MLA_VERSION << "\n";
  std::cout << "Kokkos " << kokkos_version() << ", execution spaces: " << join(kokkos_execution_spaces())
            << ", device primitives: " << device_primitives() << "\n";
  std::cout << "backends compiled in: " << join(compiled_backends()) << "\n";
  for (const BackendReport& r : reports) {
    if (!r.unavailable.empty()) {
      std::cout << "  " << r.name << ": unavailable: " << r.unavailable << "\n";
      continue;
    }
    for (const FoundDevice& d : r.devices) {
      std::cout << "  " << r.name << ":" << d.info.index << "  " << d.info.name << ", " << d.info.architecture << ", "
                << memory(d.info.total_memory) << ", kernels: " << d.kernels << "\n";
    }
  }
}

void print_json(const std::vector<BackendReport>& reports) {
  nlohmann::ordered_json doc;
  doc["version"] = SPARSE_MLA_VERSION;
  doc["kokkos"] = {{"version", kokkos_version()},
                   {"execution_spaces", kokkos_execution_spaces()},
                   {"device_primitives", device_primitives()}};
  doc["backends"] = nlohmann::ordered_json::array();
  for (const BackendReport& r : reports) {
    nlohmann::ordered_json b = {{"name", r.name}, {"available", r.unavailable.empty()}};
    if (!r.unavailable.empty()) b["unavailable_reason"] = r.unavailable;
    b["devices"] = nlohmann::ordered_json::array();
    for (const FoundDevice& d : r.devices) {
      b["devices"].push_back({{"index", d.info.index},
                              {"name", d.info.name},
                              {"architecture", d.info.architecture},
                              {"total_memory", d.info.total_memory},
                              {"kernels", d.kernels}});
    }
    doc["backends"].push_back(std::move(b));
  }
  std::cout << doc.dump(2) << "\n";
}

}  // namespace

void add_info(CLI::App& app, Commands& commands) {
  auto json = std::make_shared<bool>(false);
  auto* info = app.add_subcommand("info", "List the backends compiled in, the devices they find and the Kokkos in use");
  info->add_flag("--json", *json, "Print the report as JSON on stdout");
  info->callback([&commands, json] {
    commands.run = [json] {
      std::vector<BackendReport> reports;
      // "cuda" and "hip" are listed even when not compiled in, with the reason.
      std::vector<std::string> names = compiled_backends();
      for (const char* gpu : {"cuda", "hip"}) {
        if (std::find(names.begin(), names.end(), gpu) == names.end()) names.emplace_back(gpu);
      }
      for (const std::string& name : names) reports.push_back(probe(name));
      if (*json) {
        print_json(reports);
      } else {
        print_text(reports);
      }
      return exit_ok;
    };
  });
}

}  // namespace sparse_mla::cli
