// Inputs of a top-k conversion at DeepSeek-V3.2's shapes, and the scalar
// reference the conversion cases check against (SPEC section 2).
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "bench_data.hpp"
#include "sparse_mla/topk_convert.hpp"
#include "validation/reference/topk_reference.hpp"

namespace sparse_mla::cli {

struct TopkInputs {
  static constexpr std::int32_t block_size = 64;
  static constexpr std::int32_t context_tokens = 32768;  // per request
  static constexpr std::int32_t blocks_per_request = context_tokens / block_size;

  std::int64_t tokens = 0;
  std::int32_t topk = 0;
  std::int32_t requests = 0;
  std::vector<std::int32_t> req_id;       // [tokens]
  std::vector<std::int32_t> block_table;  // [requests, blocks_per_request]
  std::vector<std::int32_t> logical;      // [tokens, topk]

  // Token t belongs to request t % requests; its positions are drawn from
  // the request's 32768-token context, about 3% unused (-1). The block table
  // is a shuffle of every physical block, so pages are scattered.
  TopkInputs(std::int64_t num_tokens, std::int32_t k, std::int32_t num_requests, std::uint64_t seed)
      : tokens(num_tokens), topk(k), requests(num_requests) {
    BenchRng rng(seed);
    req_id.resize(static_cast<std::size_t>(tokens));
    for (std::int64_t t = 0; t < tokens; ++t) req_id[static_cast<std::size_t>(t)] = static_cast<std::int32_t>(t % requests);
    block_table.resize(static_cast<std::size_t>(requests) * blocks_per_request);
    std::iota(block_table.begin(), block_table.end(), 0);
    for (std::size_t i = block_table.size(); i > 1; --i) {
      std::swap(block_table[i - 1], block_table[rng.below(static_cast<std::uint32_t>(i))]);
    }
    logical.resize(static_cast<std::size_t>(tokens * topk));
    for (auto& tok : logical) {
      const std::uint32_t draw = rng.below(100 * context_tokens);
      tok = draw < 3 * context_tokens ? -1 : static_cast<std::int32_t>(draw % context_tokens);
    }
  }

  std::size_t logical_bytes() const { return static_cast<std::size_t>(tokens * topk) * 4; }

  // "" when `physical` and `counts` are the conversion of these inputs (with
  // block_stride_rows = block_size, filtered by `dcp`), computed by the
  // scalar reference, else the first difference.
  std::string compare(const std::vector<std::int32_t>& physical, const std::vector<std::int32_t>& counts,
                      const DcpConfig& dcp = {}) const {
    reference::TopkInputs in;
    in.num_tokens = tokens;
    in.num_topk = topk;
    in.blocks_per_request = blocks_per_request;
    in.block_size = block_size;
    in.block_stride_rows = block_size;
    in.req_id = req_id;
    in.block_table = block_table;
    in.logical = logical;
    in.set_dcp(dcp);
    const reference::TopkOutputs want = reference::convert_topk_dcp(in);
    for (std::int64_t t = 0; t < tokens; ++t) {
      for (std::int64_t j = 0; j < topk; ++j) {
        const auto e = static_cast<std::size_t>(t * topk + j);
        if (physical[e] != want.physical[e]) {
          return "physical[" + std::to_string(t) + ", " + std::to_string(j) + "] = " + std::to_string(physical[e]) +
                 ", expected " + std::to_string(want.physical[e]);
        }
      }
      const auto ut = static_cast<std::size_t>(t);
      if (counts[ut] != want.valid_counts[ut]) {
        return "valid_counts[" + std::to_string(t) + "] = " + std::to_string(counts[ut]) + ", expected " +
               std::to_string(want.valid_counts[ut]);
      }
    }
    return "";
  }
};

}  // namespace sparse_mla::cli
