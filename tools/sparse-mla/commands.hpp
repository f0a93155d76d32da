// The CLI's subcommands. Each add_* registers its options on the app and, when
// its subcommand is chosen, sets Commands::run to the action.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>

namespace sparse_mla::cli {

constexpr int exit_ok = 0;
constexpr int exit_mismatch = 1;
constexpr int exit_unusable = 2;

struct Commands {
  std::function<int()> run;
};

void add_info(CLI::App& app, Commands& commands);
void add_bench(CLI::App& app, Commands& commands);
void add_validate(CLI::App& app, Commands& commands);

}  // namespace sparse_mla::cli
