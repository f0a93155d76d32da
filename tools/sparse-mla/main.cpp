// sparse-mla: check a build of the library on this machine.
//   sparse-mla info                       backends, devices, Kokkos
//   sparse-mla validate ...               golden files, synthetic schedules
//   sparse-mla bench ...                  timings against the copy ceiling
// Exit codes: 0 ok, 1 mismatch or failed check, 2 unusable input or arguments.
#include <CLI/CLI.hpp>

#include <exception>
#include <iostream>
#include <string>

#include "commands.hpp"
#include "sparse_mla/error.hpp"

namespace {

// Every failure is one line on stderr, whatever the message holds (a file
// name or a JSON excerpt may carry newlines or control bytes).
int report(const std::string& message, int code) {
  std::string line = "sparse-mla: " + message;
  for (char& c : line) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = ' ';
  }
  std::cerr << line << "\n";
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"sparse-mla: sparse MLA index-group bookkeeping on CUDA, HIP and host"};
  app.set_version_flag("--version", std::string("sparse-mla ") + SPARSE_MLA_VERSION);
  app.require_subcommand(1);
  sparse_mla::cli::Commands commands;
  sparse_mla::cli::add_info(app, commands);
  sparse_mla::cli::add_validate(app, commands);
  sparse_mla::cli::add_bench(app, commands);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version are "errors" with exit code 0: CLI11 prints them.
    if (e.get_exit_code() == 0) return app.exit(e);
    return report(std::string(e.what()) + " (see --help)", sparse_mla::cli::exit_unusable);
  }
  try {
    return commands.run();
  } catch (const std::exception& e) {
    // sparse_mla::Error and everything else: the input or the arguments
    // could not be used (a mismatch is a return value, never an exception).
    return report(e.what(), sparse_mla::cli::exit_unusable);
  }
}
