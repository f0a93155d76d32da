// sparse-mla validate --synthetic: a DeepSeek-V3.2-shaped schedule (one
// prefill step, then decode steps) through the index groups of a model with an
// index-producing layer every N layers, every layer's output checked against
// the scalar reference (tools/validation/reference/topk_reference.hpp).
//
// The validate command registers the options with add_synthetic_options and,
// when --synthetic is given, calls run_synthetic.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <iosfwd>
#include <string>

#include "sparse_mla/topk_convert.hpp"

namespace sparse_mla::cli {

struct SyntheticOptions {
  bool enabled = false;  // --synthetic
  int layers = 61;
  int index_every = 4;
  int requests = 16;
  int topk = 256;
  int block_size = 64;
  int context = 2048;  // tokens per request after the last decode step, at most
  int steps = 12;      // decode steps after the prefill step
  std::uint64_t seed = 0;
  bool seed_given = false;
  bool hisparse = false;  // --hisparse: HiSparse groups (synthetic_hisparse.cpp)
  int hot_slots = 0;      // --hot-slots: H per request, 0 = 2K
  std::string dump_dir;   // --dump: the first group's conversion of every step as golden files (synthetic_dump.hpp)
  DcpConfig dcp;          // --dcp-size, --dcp-rank, --dcp-interleave, --compact: the groups convert one rank's share
};


// Adds --synthetic and its options to `validate`.
void add_synthetic_options(CLI::App& validate, SyntheticOptions& options);

// Runs the schedule on `backend`; writes a summary (or one JSON object) to
// `out`. Returns exit_ok, or exit_mismatch when any layer's output differs
// from the reference or a group converted other than once per decode step.
// Throws sparse_mla::Error for unusable options (exit_unusable).
// With --hisparse, runs run_hisparse_synthetic instead.
int run_synthetic(const std::string& backend, bool json, const SyntheticOptions& options, std::ostream& out);

// The schedule through HiSparse groups: every layer's rows and hot caches
// checked against its host pool and the scalar model; the JSON adds hits,
// misses and bytes_moved.
int run_hisparse_synthetic(const std::string& backend, bool json, const SyntheticOptions& options, std::ostream& out);

}  // namespace sparse_mla::cli
