#include "dcp_options.hpp"

#include "sparse_mla/error.hpp"

namespace sparse_mla::cli {

void add_dcp_options(CLI::App& app, DcpConfig& dcp, const std::string& what) {
  app.add_option("--dcp-size", dcp.size, what + "decode context parallelism: ranks the KV cache is spread over (1 = none)")
      ->capture_default_str();
  app.add_option("--dcp-rank", dcp.rank, what + "the rank whose tokens the conversion keeps")->capture_default_str();
  app.add_option("--dcp-interleave", dcp.interleave, what + "consecutive tokens a rank holds (divides the block size)")
      ->capture_default_str();
  dcp.compact = false;
  app.add_flag("--compact", dcp.compact, what + "with DCP, move each row's valid rows to its front in input order");
}

void check_dcp_options(const DcpConfig& dcp, std::int64_t block_size, const char* where) {
  if (dcp.size < 1) fail(where, "--dcp-size must be at least 1, got ", dcp.size);
  if (dcp.rank < 0 || dcp.rank >= dcp.size) {
    fail(where, "--dcp-rank must be in [0, --dcp-size) = [0, ", dcp.size, "), got ", dcp.rank);
  }
  if (dcp.interleave < 1 || block_size % dcp.interleave != 0) {
    fail(where, "--dcp-interleave must be positive and divide the block size ", block_size, ", got ", dcp.interleave);
  }
}

}  // namespace sparse_mla::cli
