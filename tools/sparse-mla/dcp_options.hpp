// The DCP options that validate --synthetic and bench share: --dcp-size,
// --dcp-rank, --dcp-interleave and --compact (SPEC section 2a).
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>

#include "sparse_mla/topk_convert.hpp"

namespace sparse_mla::cli {

// Adds the options to `app`; `what` prefixes their help.
void add_dcp_options(CLI::App& app, DcpConfig& dcp, const std::string& what);
// Throws Error naming the options when `dcp` is not a usable split for `block_size`.
void check_dcp_options(const DcpConfig& dcp, std::int64_t block_size, const char* where);

}  // namespace sparse_mla::cli
