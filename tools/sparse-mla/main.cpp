// sparse-mla: check a build of the library on this machine.
//   sparse-mla info                       backends, devices, Kokkos
//   sparse-mla validate ...               golden files, synthetic schedules
//   sparse-mla bench ...                  timings against the copy ceiling
// Exit codes: 0 ok, 1 mismatch or failed check, 2 unusable input or arguments.
#include <CLI/CLI.hpp>

#include <exception>
#include <iostream>

#include "commands.hpp"
#include "sparse_mla/error.hpp"

int main(int argc, char** argv) {
  CLI::App app{"sparse-mla: sparse MLA index-group bookkeeping on CUDA, HIP and host"};
  app.set_version_flag("--version", std::string("sparse-mla ") + SPARSE_MLA_VERSION);
  app.require_subcommand(1);
  sparse_mla::cli::Commands commands;
  sparse_mla::cli::add_info(app, commands);
  sparse_mla::cli::add_bench(app, commands);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : sparse_mla::cli::exit_unusable;
  }
  try {
    return commands.run();
  } catch (const sparse_mla::Error& e) {
    std::cerr << "sparse-mla: " << e.what() << "\n";
    return sparse_mla::cli::exit_unusable;
  } catch (const std::exception& e) {
    std::cerr << "sparse-mla: " << e.what() << "\n";
    return sparse_mla::cli::exit_unusable;
  }
}
