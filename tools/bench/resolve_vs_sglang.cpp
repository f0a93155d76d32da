// The HiSparse swap-in (SPEC section 5): the library's resolve, and resolve
// plus row gather, next to SGLang's kernel for the same job, on the same
// inputs, timed the same way (tools/bench/cuda_timing.hpp), each checked
// against the scalar model of tools/validation/reference before it is timed.
//
//   build/cuda/bin/sparse-mla-resolve-vs-sglang
//
// SGLang's kernel is load_cache_to_device_buffer_kernel of
// python/sglang/kernels/jit/csrc/hisparse.cuh (sgl-project/sglang at
// 066d1dcdf35c3c63bb9470b6f36c72a1e3925283), ported below with its CUDA
// branch only and its generic (MLA, not DSv4) copy: one block per request;
// the selected positions go into a shared-memory hash; the slots are scanned
// in LRU order, a slot whose position is selected being a hit; the misses,
// in top-k order, take the oldest evictable slots; the LRU becomes untouched
// evictable slots, newly loaded ones, hits; with RecordMissPlan the swap list
// is written, and unless SkipIO the block copies the missed rows itself
// from pinned host memory, a warp per row. Its cases here: "resolve" (SkipIO,
// plan recorded: the library's resolve writes the same lists) and "swap-in"
// (the copy fused, against the library's resolve followed by its gather).
//
// Its semantics are SPEC section 5's on inputs that avoid its other rules,
// which these do: positions distinct and non-negative (it neither collapses
// duplicates nor skips -1), none the request's newest token (it maps that to
// an extra slot outside the LRU), contexts longer than the H hot slots (it
// maps shorter ones directly, without an LRU). Its state keys slots by
// position where the library keys them by host row: the check maps one to
// the other through the source table.
//
// Built only in CUDA builds (a Kokkos with CUDA); not part of the library.
#include <Kokkos_Core.hpp>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cuda_timing.hpp"
#include "sparse_mla/device.hpp"
#include "sparse_mla/hisparse_ops.hpp"
#include "sparse_mla/tensor.hpp"
#include "validation/reference/hisparse_reference.hpp"

namespace {

constexpr int K = 2048;           // top-k
constexpr int H = 4096;           // hot slots per request
constexpr int block = 64;         // rows per page, source and hot
constexpr int row_bytes = 656;    // an fp8_ds_mla row
constexpr int hot_blocks = H / block;

using sparse_mla::bench::check;
using sparse_mla::bench::time_graph;

// ---- SGLang's kernel (CUDA branch), as in the file named above ----------
namespace sglang {

constexpr int WARP_SIZE = 32;
using BallotMask = unsigned int;
constexpr BallotMask FULL_WARP_MASK = 0xFFFFFFFFu;
constexpr int32_t TOKEN_HIT = static_cast<int32_t>(0xFFFFFFFF);
constexpr int32_t HASH_EMPTY = -1;

__device__ __forceinline__ int hash_slot(int32_t key, int hash_size) {
  return static_cast<int>((static_cast<uint32_t>(key) * 2654435761u) % static_cast<uint32_t>(hash_size));
}

__device__ __forceinline__ void transfer_item_warp(int32_t lane_id, const void* src_addr, void* dst_addr,
                                                   int64_t item_size_bytes) {
  const int total_pairs = static_cast<int>(item_size_bytes / 16);
  {
    const uint64_t* __restrict__ src = static_cast<const uint64_t*>(src_addr);
    uint64_t* __restrict__ dst = static_cast<uint64_t*>(dst_addr);
    for (int j = lane_id; j < total_pairs; j += WARP_SIZE) {
      uint64_t lo, hi;
      const uint64_t* s = src + j * 2;
      asm volatile("ld.global.nc.v2.b64 {%0,%1},[%2];" : "=l"(lo), "=l"(hi) : "l"(s) : "memory");
      uint64_t* d = dst + j * 2;
      asm volatile("st.global.cg.v2.b64 [%0],{%1,%2};" ::"l"(d), "l"(lo), "l"(hi) : "memory");
    }
  }
  const int tail_8B = static_cast<int>((item_size_bytes - total_pairs * 16) / 8);
  if (tail_8B > 0 && lane_id < tail_8B) {
    const uint64_t* __restrict__ src8 =
        reinterpret_cast<const uint64_t*>(static_cast<const char*>(src_addr) + total_pairs * 16);
    uint64_t* __restrict__ dst8 = reinterpret_cast<uint64_t*>(static_cast<char*>(dst_addr) + total_pairs * 16);
    uint64_t tmp;
    asm volatile("ld.global.nc.b64 %0,[%1];" : "=l"(tmp) : "l"(src8 + lane_id) : "memory");
    asm volatile("st.global.cg.b64 [%0],%1;" ::"l"(dst8 + lane_id), "l"(tmp) : "memory");
  }
}

__device__ __forceinline__ int warp_inclusive_scan(int* s_data, int lane_id, int offset, int count, int accumulator) {
  const int idx = lane_id + offset;
  int val = (idx < count) ? s_data[idx] : 0;
#pragma unroll
  for (int i = 1; i < WARP_SIZE; i *= 2) {
    const int n = __shfl_up_sync(FULL_WARP_MASK, val, i);
    if (lane_id >= i) val += n;
  }
  val += accumulator;
  if (idx < count) s_data[idx] = val;
  accumulator = __shfl_sync(FULL_WARP_MASK, val, WARP_SIZE - 1);
  return accumulator;
}

template <int NUM_TOP_K, int HOT_BUFFER_SIZE>
struct SmemLayout {
  static constexpr int HASH_SIZE = NUM_TOP_K * 2;
  static constexpr int NUM_BUFFER_CHUNKS = (HOT_BUFFER_SIZE + WARP_SIZE - 1) / WARP_SIZE;
  static constexpr int TOTAL_INT32 = NUM_TOP_K + (NUM_BUFFER_CHUNKS + 1) + (NUM_BUFFER_CHUNKS + 1) + HASH_SIZE + 2;
  static constexpr int TOTAL_INT16 = HOT_BUFFER_SIZE + HASH_SIZE;
  static constexpr size_t BYTES = TOTAL_INT32 * sizeof(int32_t) + TOTAL_INT16 * sizeof(int16_t);
};

template <int BLOCK_SIZE, int NUM_TOP_K, int HOT_BUFFER_SIZE, bool RecordMissPlan, bool SkipIO>
__global__ void load_cache_to_device_buffer_kernel(
    const int32_t* __restrict__ top_k_tokens, int32_t* __restrict__ device_buffer_tokens,
    const int64_t* __restrict__ host_cache_locs, const int32_t* __restrict__ device_buffer_locs,
    const void* __restrict__ host_cache_k, void* __restrict__ device_buffer_k, int32_t* __restrict__ top_k_device_locs,
    const int64_t* __restrict__ req_pool_indices, const int64_t* __restrict__ seq_lens, int16_t* __restrict__ lru_slots,
    const int32_t* __restrict__ num_real_reqs, int64_t buffer_stride_0, int64_t host_stride, int64_t lru_slot_stride_0,
    int64_t top_k_tokens_stride, int64_t top_k_device_locs_stride, int64_t item_size_bytes,
    int64_t* __restrict__ miss_src_out, int32_t* __restrict__ miss_dst_out, int32_t* __restrict__ miss_count_out,
    int64_t plan_stride) {
  constexpr int NUM_WARPS = BLOCK_SIZE / WARP_SIZE;
  constexpr int NUM_TOKEN_CHUNKS = (NUM_TOP_K + WARP_SIZE - 1) / WARP_SIZE;
  constexpr int NUM_BUFFER_CHUNKS = (HOT_BUFFER_SIZE + WARP_SIZE - 1) / WARP_SIZE;
  const int bid = static_cast<int>(blockIdx.x);
  const int tid = static_cast<int>(threadIdx.x);
  int32_t* req_top_k_device_locs = top_k_device_locs + bid * top_k_device_locs_stride;
  if (bid >= num_real_reqs[0]) {
    for (int i = tid; i < NUM_TOP_K; i += BLOCK_SIZE) req_top_k_device_locs[i] = -1;
    return;
  }
  const int warp_id = tid / WARP_SIZE;
  const int lane_id = tid % WARP_SIZE;
  const BallotMask lanes_before = (BallotMask(1) << lane_id) - BallotMask(1);
  const int64_t rid = req_pool_indices[bid];
  const int64_t seq_len = seq_lens[bid];
  const int32_t* req_top_k_tokens = top_k_tokens + bid * top_k_tokens_stride;
  const int64_t buffer_offset = rid * buffer_stride_0;
  int32_t* req_device_buffer_tokens = device_buffer_tokens + buffer_offset;
  const int32_t* req_device_buffer_locs = device_buffer_locs + buffer_offset;
  const int64_t* req_host_cache_locs = host_cache_locs + rid * host_stride;
  int16_t* req_lru_slots = lru_slots + rid * lru_slot_stride_0;
  if (seq_len <= HOT_BUFFER_SIZE) {
    const int count = (seq_len < NUM_TOP_K) ? static_cast<int>(seq_len) : NUM_TOP_K;
    for (int i = tid; i < NUM_TOP_K; i += BLOCK_SIZE) {
      int32_t device_loc = -1;
      if (i < count) {
        const int32_t token_pos = req_top_k_tokens[i];
        if (token_pos >= 0) device_loc = req_device_buffer_locs[token_pos];
      }
      req_top_k_device_locs[i] = device_loc;
    }
    if constexpr (RecordMissPlan) {
      if (tid == 0) miss_count_out[bid] = 0;
    }
    return;
  }
  extern __shared__ char smem_raw[];
  using Layout = SmemLayout<NUM_TOP_K, HOT_BUFFER_SIZE>;
  constexpr int HASH_SIZE = Layout::HASH_SIZE;
  int32_t* smem_i32 = reinterpret_cast<int32_t*>(smem_raw);
  int32_t* s_top_k_tokens = smem_i32;
  int32_t* s_chunk_offset = s_top_k_tokens + NUM_TOP_K;
  int32_t* s_evict_chunk_offset = s_chunk_offset + (NUM_BUFFER_CHUNKS + 1);
  int32_t* s_hash_keys = s_evict_chunk_offset + (NUM_BUFFER_CHUNKS + 1);
  int32_t& s_total_hits = s_hash_keys[HASH_SIZE];
  int32_t& s_newest_hit = s_hash_keys[HASH_SIZE + 1];
  int16_t* smem_i16 = reinterpret_cast<int16_t*>(smem_i32 + Layout::TOTAL_INT32);
  int16_t* s_lru_slots_out = smem_i16;
  int16_t* s_hash_vals = s_lru_slots_out + HOT_BUFFER_SIZE;
  if (tid == 0) {
    s_total_hits = 0;
    s_newest_hit = 0;
  }
  for (int i = tid; i < HASH_SIZE; i += BLOCK_SIZE) s_hash_keys[i] = HASH_EMPTY;
  for (int i = tid; i < NUM_BUFFER_CHUNKS + 1; i += BLOCK_SIZE) {
    s_chunk_offset[i] = 0;
    s_evict_chunk_offset[i] = 0;
  }
  __syncthreads();
  const int newest_slot = HOT_BUFFER_SIZE;
  const int32_t newest_token = static_cast<int32_t>(seq_len - 1);
  for (int i = tid; i < NUM_TOP_K; i += BLOCK_SIZE) {
    const int32_t token_idx = req_top_k_tokens[i];
    if (token_idx == newest_token) {
      s_top_k_tokens[i] = TOKEN_HIT;
      req_top_k_device_locs[i] = req_device_buffer_locs[newest_slot];
      s_newest_hit = 1;
    } else {
      int slot = hash_slot(token_idx, HASH_SIZE);
      while (true) {
        const int32_t old = atomicCAS(&s_hash_keys[slot], HASH_EMPTY, token_idx);
        if (old == HASH_EMPTY || old == token_idx) {
          s_hash_vals[slot] = static_cast<int16_t>(i);
          break;
        }
        slot = (slot + 1) % HASH_SIZE;
      }
      s_top_k_tokens[i] = token_idx;
    }
  }
  __syncthreads();
  constexpr int ITERATIONS_PER_WARP_BUFFER = (NUM_BUFFER_CHUNKS + NUM_WARPS - 1) / NUM_WARPS;
  int total_hit_count = 0;
  int total_evict_count = 0;
  for (int iter = 0; iter < ITERATIONS_PER_WARP_BUFFER; iter++) {
    const int chunk_idx = warp_id + iter * NUM_WARPS;
    const bool has_valid_chunk = chunk_idx < NUM_BUFFER_CHUNKS;
    const int slot_idx = chunk_idx * WARP_SIZE + lane_id;
    const bool has_valid_slot = has_valid_chunk && (slot_idx < HOT_BUFFER_SIZE);
    const int16_t buf_slot = has_valid_slot ? req_lru_slots[slot_idx] : static_cast<int16_t>(-1);
    const int32_t my_buffer_token = (buf_slot >= 0) ? req_device_buffer_tokens[buf_slot] : -1;
    int my_found_top_k_idx = -1;
    if (my_buffer_token >= 0) {
      int h = hash_slot(my_buffer_token, HASH_SIZE);
      while (true) {
        const int32_t k = s_hash_keys[h];
        if (k == my_buffer_token) {
          my_found_top_k_idx = static_cast<int32_t>(s_hash_vals[h]);
          break;
        }
        if (k == HASH_EMPTY) break;
        h = (h + 1) % HASH_SIZE;
      }
    }
    const bool is_hit = my_found_top_k_idx >= 0;
    const bool is_evictable = has_valid_slot && !is_hit;
    if (is_hit) {
      s_top_k_tokens[my_found_top_k_idx] = TOKEN_HIT;
      req_top_k_device_locs[my_found_top_k_idx] = req_device_buffer_locs[buf_slot];
    }
    int local_hit_offset = 0;
    int local_evict_offset = 0;
    if (has_valid_chunk) {
      const BallotMask hit_mask = __ballot_sync(FULL_WARP_MASK, is_hit);
      const BallotMask evict_mask = __ballot_sync(FULL_WARP_MASK, is_evictable);
      local_hit_offset = __popc(hit_mask & lanes_before);
      local_evict_offset = __popc(evict_mask & lanes_before);
      if (lane_id == 0) {
        s_chunk_offset[chunk_idx + 1] = __popc(hit_mask);
        s_evict_chunk_offset[chunk_idx + 1] = __popc(evict_mask);
      }
    }
    __syncthreads();
    if (warp_id == 0) {
      total_hit_count = warp_inclusive_scan(s_chunk_offset, lane_id, chunk_idx + 1, NUM_BUFFER_CHUNKS + 1, total_hit_count);
      total_evict_count =
          warp_inclusive_scan(s_evict_chunk_offset, lane_id, chunk_idx + 1, NUM_BUFFER_CHUNKS + 1, total_evict_count);
      if (tid == 0) s_total_hits = total_hit_count;
    }
    __syncthreads();
    if (is_hit) {
      const int hit_offset = s_chunk_offset[chunk_idx] + local_hit_offset;
      s_lru_slots_out[hit_offset] = buf_slot;
    }
    if (is_evictable) {
      const int evict_offset = s_evict_chunk_offset[chunk_idx] + local_evict_offset;
      s_lru_slots_out[HOT_BUFFER_SIZE - 1 - evict_offset] = buf_slot;
    }
  }
  __syncthreads();
  for (int i = tid; i < NUM_TOKEN_CHUNKS + 1; i += BLOCK_SIZE) s_chunk_offset[i] = 0;
  __syncthreads();
  int total_misses = 0;
  constexpr int ITERATIONS_PER_WARP_TOKEN = (NUM_TOKEN_CHUNKS + NUM_WARPS - 1) / NUM_WARPS;
  for (int iter = 0; iter < ITERATIONS_PER_WARP_TOKEN; iter++) {
    const int chunk_idx = warp_id + iter * NUM_WARPS;
    const bool has_valid_chunk = chunk_idx < NUM_TOKEN_CHUNKS;
    const int my_token_idx = chunk_idx * WARP_SIZE + lane_id;
    const bool has_valid_token = has_valid_chunk && (my_token_idx < NUM_TOP_K);
    int32_t my_token = 0;
    bool is_miss = false;
    int local_miss_offset = 0;
    if (has_valid_token) {
      is_miss = s_top_k_tokens[my_token_idx] != TOKEN_HIT;
      if (is_miss) my_token = s_top_k_tokens[my_token_idx];
    }
    if (has_valid_chunk) {
      const BallotMask miss_mask = __ballot_sync(FULL_WARP_MASK, is_miss);
      local_miss_offset = __popc(miss_mask & lanes_before);
      if (lane_id == 0) s_chunk_offset[chunk_idx + 1] = __popc(miss_mask);
    }
    __syncthreads();
    if (warp_id == 0) {
      total_misses = warp_inclusive_scan(s_chunk_offset, lane_id, chunk_idx + 1, NUM_TOKEN_CHUNKS + 1, total_misses);
    }
    __syncthreads();
    if (is_miss) {
      const int miss_offset = s_chunk_offset[chunk_idx] + local_miss_offset;
      const int16_t evict_slot = s_lru_slots_out[HOT_BUFFER_SIZE - 1 - miss_offset];
      s_top_k_tokens[miss_offset] = my_token;  // reused as the miss list
      req_top_k_device_locs[my_token_idx] = req_device_buffer_locs[evict_slot];
      req_device_buffer_tokens[evict_slot] = my_token;
      if constexpr (RecordMissPlan) {
        miss_src_out[bid * plan_stride + miss_offset] = req_host_cache_locs[my_token];
        miss_dst_out[bid * plan_stride + miss_offset] = req_device_buffer_locs[evict_slot];
      }
    }
  }
  __syncthreads();
  total_misses = NUM_TOP_K - s_total_hits - s_newest_hit;
  if constexpr (RecordMissPlan) {
    if (tid == 0) miss_count_out[bid] = total_misses;
  }
  {
    const int total_evictable = HOT_BUFFER_SIZE - s_total_hits;
    for (int i = tid; i < HOT_BUFFER_SIZE; i += BLOCK_SIZE) {
      if (i < total_misses) {
        req_lru_slots[total_evictable - total_misses + i] = s_lru_slots_out[HOT_BUFFER_SIZE - 1 - i];
      } else if (i < total_evictable) {
        req_lru_slots[i - total_misses] = s_lru_slots_out[HOT_BUFFER_SIZE - 1 - i];
      } else {
        req_lru_slots[i] = s_lru_slots_out[i - total_evictable];
      }
    }
  }
  if constexpr (!SkipIO) {
    for (int miss_idx = warp_id; miss_idx < total_misses; miss_idx += NUM_WARPS) {
      const int32_t miss_token = s_top_k_tokens[miss_idx];
      const int16_t evict_slot = s_lru_slots_out[HOT_BUFFER_SIZE - 1 - miss_idx];
      const int64_t src_loc = req_host_cache_locs[miss_token];
      const int64_t dst_loc = static_cast<int64_t>(req_device_buffer_locs[evict_slot]);
      transfer_item_warp(lane_id, static_cast<const char*>(host_cache_k) + src_loc * item_size_bytes,
                         static_cast<char*>(device_buffer_k) + dst_loc * item_size_bytes, item_size_bytes);
    }
  }
}

}  // namespace sglang

// ---- The shared inputs ----------------------------------------------------

// A batch of `rows` requests whose selections have exactly `fixed` hits per
// row in steady state (the design of `sparse-mla bench`'s HiSparse rig): a
// fixed part selected every step and a rotating part that changes with the
// rotation set, each part a run of positions, shuffled.
struct Inputs {
  int rows, fixed, sets;
  int context, blocks;  // positions per request, and its source blocks
  std::vector<int32_t> source_table;  // [rows, blocks]: random permutation of the pool's blocks
  std::vector<int32_t> hot_table;     // [rows, hot_blocks]: 1 + row * hot_blocks + b (block 0 unused)
  std::vector<int32_t> logical;       // [sets, rows, K]

  Inputs(int rows_, int fixed_, uint64_t seed) : rows(rows_), fixed(fixed_) {
    const int rotating = K - fixed;
    sets = rotating == 0 ? 1 : std::max(8, 2 + (H - fixed + rotating - 1) / rotating);
    // SGLang's kernel resolves only contexts longer than H, and maps the
    // newest position (context - 1 here) outside the LRU: the selections
    // stay below context - 1.
    context = std::max(fixed + sets * rotating, H) + 2;
    blocks = (context + block - 1) / block;
    std::mt19937_64 rng(seed);
    source_table.resize(static_cast<size_t>(rows) * blocks);
    std::iota(source_table.begin(), source_table.end(), 0);
    std::shuffle(source_table.begin(), source_table.end(), rng);
    for (int r = 0; r < rows; ++r) {
      for (int b = 0; b < hot_blocks; ++b) hot_table.push_back(1 + r * hot_blocks + b);
    }
    logical.resize(static_cast<size_t>(sets) * rows * K);
    for (int s = 0; s < sets; ++s) {
      for (int r = 0; r < rows; ++r) {
        int32_t* row = &logical[(static_cast<size_t>(s) * rows + r) * K];
        std::iota(row, row + fixed, 0);
        std::iota(row + fixed, row + K, fixed + s * rotating);
        std::shuffle(row, row + K, rng);
      }
    }
  }
  int64_t host_rows() const { return static_cast<int64_t>(rows) * blocks * block; }
  int32_t host_row(int r, int pos) const { return source_table[static_cast<size_t>(r) * blocks + pos / block] * block + pos % block; }
  int32_t hot_row(int r, int slot) const { return hot_table[static_cast<size_t>(r) * hot_blocks + slot / block] * block + slot % block; }
  int64_t hot_cache_rows() const { return (1 + static_cast<int64_t>(rows) * hot_blocks) * block; }
};

template <class T>
std::vector<T> download(const sparse_mla::Buffer& b, size_t count) {
  std::vector<T> v(count);
  check(cudaMemcpy(v.data(), b.data(), count * sizeof(T), cudaMemcpyDeviceToHost), "download");
  return v;
}
// (The library's streams do not wait for the legacy stream's copies: the
// device synchronisation orders an upload before the launches after it.)
template <class T>
void upload(sparse_mla::Buffer& b, const std::vector<T>& v) {
  check(cudaMemcpy(b.data(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), "upload");
  check(cudaDeviceSynchronize(), "upload");
}

// The steps the check runs from an empty state: the first loads every
// selected row (all misses), the second has the designed hits (the fixed
// part) and misses (the next set's rotating part).
constexpr int checked_steps = 2;

// The scalar model after `checked_steps` steps (sets 0, 1, ...) from an
// empty state: the last step's results, the state, and the host row each
// hot row holds once every step's swaps are copied, in order.
struct Expected {
  std::vector<sparse_mla::reference::HiSparseResult> rows;
  sparse_mla::reference::HiSparseState state;
  std::vector<std::pair<int64_t, int64_t>> hot_rows;  // (hot row, host row), sorted by hot row
};
Expected model(const Inputs& in) {
  namespace ref = sparse_mla::reference;
  ref::HiSparseTables t;
  t.top_k = K;
  t.hot_slots = H;
  t.source_table = in.source_table;
  t.source_rows = in.rows;
  t.source_blocks = in.blocks;
  t.source_block_size = block;
  t.host_rows = in.host_rows();
  t.hot_blocks_per_row = hot_blocks;
  t.hot_block_size = block;
  t.attention_block_stride = block;
  Expected e{{}, ref::HiSparseState(in.rows, H), {}};
  std::vector<int64_t> held(static_cast<size_t>(in.hot_cache_rows()), -1);
  for (int r = 0; r < in.rows; ++r) {
    ref::HiSparseStep step;
    step.request_ids = {r};
    step.state_indices = {0};
    step.hot_block_table.assign(in.hot_table.begin() + static_cast<std::ptrdiff_t>(r) * hot_blocks,
                                in.hot_table.begin() + static_cast<std::ptrdiff_t>(r + 1) * hot_blocks);
    ref::HiSparseState one(1, H);
    ref::HiSparseResult result;
    for (int s = 0; s < checked_steps; ++s) {
      const auto first = in.logical.begin() + (static_cast<std::ptrdiff_t>(s % in.sets) * in.rows + r) * K;
      step.logical.assign(first, first + K);
      result = ref::resolve_model(t, step, one);
      for (int m = 0; m < result.swap_counts[0]; ++m) {
        held[static_cast<size_t>(result.swap_device_rows[static_cast<size_t>(m)])] = result.swap_host_rows[static_cast<size_t>(m)];
      }
    }
    e.rows.push_back(result);
    std::copy(one.slot_rows.begin(), one.slot_rows.end(), e.state.slot_rows.begin() + static_cast<std::ptrdiff_t>(r) * H);
    std::copy(one.lru.begin(), one.lru.end(), e.state.lru.begin() + static_cast<std::ptrdiff_t>(r) * H);
  }
  for (size_t row = 0; row < held.size(); ++row) {
    if (held[row] >= 0) e.hot_rows.emplace_back(static_cast<int64_t>(row), held[row]);
  }
  return e;
}

template <class T>
std::vector<int64_t> widen(const std::vector<T>& v) {
  return std::vector<int64_t>(v.begin(), v.end());
}

// What an implementation left after the checked steps, under its own names:
// its outputs (row r at r * K), swap counts, swap lists, and its state in the
// library's terms (the host row each slot holds, the LRU order).
struct Observed {
  const char *out_name, *counts_name, *swap_host_name, *swap_device_name, *slot_rows_name, *lru_name;
  std::vector<int64_t> out, counts, swap_host, swap_device, slot_rows, lru;
};

// "" when `got[first, first + n)` is `want[0, n)`, else the first difference.
template <class T>
std::string first_difference(const char* what, int row, const std::vector<int64_t>& got, size_t first, const T* want,
                             size_t n) {
  for (size_t j = 0; j < n; ++j) {
    if (got[first + j] != static_cast<int64_t>(want[j])) {
      return std::string(what) + "[" + std::to_string(row) + ", " + std::to_string(j) + "] = " +
             std::to_string(got[first + j]) + ", the scalar model gives " + std::to_string(want[j]);
    }
  }
  return "";
}

// Every row's outputs, swap list and state against the model's.
std::string compare_observed(const Observed& o, const Expected& e) {
  for (size_t r = 0; r < e.rows.size(); ++r) {
    const auto& want = e.rows[r];
    const int row = static_cast<int>(r);
    const size_t m = static_cast<size_t>(want.swap_counts[0]);
    std::string d = first_difference(o.out_name, row, o.out, r * K, want.hot_indices.data(), K);
    if (d.empty()) d = first_difference(o.counts_name, row, o.counts, r, want.swap_counts.data(), 1);
    if (d.empty()) d = first_difference(o.swap_host_name, row, o.swap_host, r * K, want.swap_host_rows.data(), m);
    if (d.empty()) d = first_difference(o.swap_device_name, row, o.swap_device, r * K, want.swap_device_rows.data(), m);
    if (d.empty()) d = first_difference(o.slot_rows_name, row, o.slot_rows, r * H, &e.state.slot_rows[r * H], H);
    if (d.empty()) d = first_difference(o.lru_name, row, o.lru, r * H, &e.state.lru[r * H], H);
    if (!d.empty()) return d;
  }
  return "";
}

// Word w (8 bytes) of host row g of the pinned pool.
uint64_t pool_word(int64_t g, int w) { return (static_cast<uint64_t>(g) << 16) | static_cast<uint64_t>(w); }

// "" when every hot row the model's swaps filled holds, in `cache`, the
// pool's host row it was last given.
std::string compare_cache(const sparse_mla::Buffer& cache, const Expected& e) {
  constexpr int words = row_bytes / 8;
  const auto got = download<uint64_t>(cache, cache.bytes() / 8);
  for (const auto& [dst, src] : e.hot_rows) {
    for (int w = 0; w < words; ++w) {
      if (got[static_cast<size_t>(dst * words + w)] != pool_word(src, w)) {
        return "hot row " + std::to_string(dst) + " differs from host row " + std::to_string(src) + " at byte " +
               std::to_string(8 * w);
      }
    }
  }
  return "";
}

// ---- The two implementations over the same inputs ------------------------

class Library {
 public:
  Library(sparse_mla::Device& device, const Inputs& in, bool with_pool, const sparse_mla::Buffer* pool)
      : in_(in), with_pool_(with_pool), pool_(pool) {
    using sparse_mla::DType;
    using sparse_mla::MemoryKind;
    using sparse_mla::Tensor;
    const int64_t rows = in.rows, sets = in.sets;
    auto alloc = [&](size_t bytes) { return device.allocate(bytes, MemoryKind::device); };
    logical_ = alloc(in.logical.size() * 4);
    upload(logical_, in.logical);
    source_ = alloc(in.source_table.size() * 4);
    upload(source_, in.source_table);
    hot_table_ = alloc(in.hot_table.size() * 4);
    upload(hot_table_, in.hot_table);
    std::vector<int32_t> ids(static_cast<size_t>(rows));
    std::iota(ids.begin(), ids.end(), 0);
    ids_ = alloc(ids.size() * 4);
    upload(ids_, ids);
    slot_rows_ = alloc(static_cast<size_t>(rows) * H * 4);
    lru_ = alloc(static_cast<size_t>(rows) * H * 2);
    hot_ = alloc(static_cast<size_t>(rows) * K * 4);
    swap_host_ = alloc(static_cast<size_t>(rows) * K * 4);
    swap_device_ = alloc(static_cast<size_t>(rows) * K * 4);
    swap_counts_ = alloc(static_cast<size_t>(rows) * 4);
    counters_ = alloc(16);
    if (with_pool_) cache_ = alloc(static_cast<size_t>(in.hot_cache_rows()) * row_bytes);
    state_ = {Tensor::of(slot_rows_, DType::i32, {rows, H}), Tensor::of(lru_, DType::i16, {rows, H})};
    const Tensor all_logical = Tensor::of(logical_, DType::i32, {sets * rows, K});
    for (int s = 0; s < in.sets; ++s) {
      sparse_mla::HiSparseResolveInputs r;
      r.logical = all_logical.rows(s * rows, (s + 1) * rows);
      r.request_ids = Tensor::of(ids_, DType::i32, {rows});
      r.request_state_indices = r.request_ids;
      r.source_block_table = Tensor::of(source_, DType::i32, {rows, in.blocks});
      r.source_block_size = block;
      r.host_rows = in.host_rows();
      r.hot_block_table = Tensor::of(hot_table_, DType::i32, {rows, hot_blocks});
      r.hot_block_size = block;
      inputs_.push_back(r);
    }
    outputs_.hot_indices = Tensor::of(hot_, DType::i32, {rows, K});
    outputs_.swap_host_rows = Tensor::of(swap_host_, DType::i32, {rows, K});
    outputs_.swap_device_rows = Tensor::of(swap_device_, DType::i32, {rows, K});
    outputs_.swap_counts = Tensor::of(swap_counts_, DType::i32, {rows});
    outputs_.hit_miss_counters = Tensor::of(counters_, DType::i64, {2});
  }

  void reset() {
    sparse_mla::reference::HiSparseState empty(in_.rows, H);
    upload(slot_rows_, empty.slot_rows);
    upload(lru_, empty.lru);
    upload(counters_, std::vector<int64_t>(2, 0));
  }
  std::vector<int32_t> misses() const { return download<int32_t>(swap_counts_, static_cast<size_t>(in_.rows)); }

  void launch(sparse_mla::Stream& stream, int set) {
    sparse_mla::resolve_hisparse(stream, inputs_[static_cast<size_t>(set)], state_, H, outputs_);
    if (with_pool_) {
      sparse_mla::gather_hisparse(
          stream,
          {sparse_mla::Tensor::of(*pool_, sparse_mla::DType::u8, {in_.host_rows(), row_bytes}),
           sparse_mla::Tensor::of(cache_, sparse_mla::DType::u8, {in_.hot_cache_rows() / block, block, row_bytes}),
           outputs_.swap_host_rows, outputs_.swap_device_rows, outputs_.swap_counts},
          in_.rows);
    }
  }

  std::string compare(const Expected& e) const {
    const size_t entries = static_cast<size_t>(in_.rows) * K;
    Observed o{"hot_indices", "swap_counts", "swap_host_rows", "swap_device_rows", "slot_rows", "lru", {}, {}, {}, {}, {}, {}};
    o.out = widen(download<int32_t>(hot_, entries));
    o.counts = widen(download<int32_t>(swap_counts_, static_cast<size_t>(in_.rows)));
    o.swap_host = widen(download<int32_t>(swap_host_, entries));
    o.swap_device = widen(download<int32_t>(swap_device_, entries));
    o.slot_rows = widen(download<int32_t>(slot_rows_, static_cast<size_t>(in_.rows) * H));
    o.lru = widen(download<int16_t>(lru_, static_cast<size_t>(in_.rows) * H));
    const std::string d = compare_observed(o, e);
    return d.empty() && with_pool_ ? compare_cache(cache_, e) : d;
  }

 private:
  const Inputs& in_;
  bool with_pool_;
  const sparse_mla::Buffer* pool_;
  sparse_mla::Buffer logical_, source_, hot_table_, ids_, slot_rows_, lru_, hot_, swap_host_, swap_device_, swap_counts_,
      counters_, cache_;
  sparse_mla::HiSparseSlotState state_;
  std::vector<sparse_mla::HiSparseResolveInputs> inputs_;
  sparse_mla::HiSparseResolveOutputs outputs_;
};

template <int BLOCK_SIZE, bool SkipIO>
class SGLang {
 public:
  SGLang(sparse_mla::Device& device, const Inputs& in, const sparse_mla::Buffer* pool) : in_(in), pool_(pool) {
    using sparse_mla::MemoryKind;
    const size_t rows = static_cast<size_t>(in.rows);
    auto alloc = [&](size_t bytes) { return device.allocate(bytes, MemoryKind::device); };
    top_k_ = alloc(in.logical.size() * 4);
    upload(top_k_, in.logical);
    tokens_ = alloc(rows * (H + 1) * 4);
    std::vector<int32_t> locs(rows * (H + 1), 0);  // slot H, the newest token's, is the unused row 0
    for (size_t r = 0; r < rows; ++r) {
      for (int s = 0; s < H; ++s) locs[r * (H + 1) + static_cast<size_t>(s)] = in.hot_row(static_cast<int>(r), s);
    }
    locs_ = alloc(locs.size() * 4);
    upload(locs_, locs);
    std::vector<int64_t> host_locs(rows * static_cast<size_t>(in.context));
    for (size_t r = 0; r < rows; ++r) {
      for (int p = 0; p < in.context; ++p) host_locs[r * static_cast<size_t>(in.context) + static_cast<size_t>(p)] = in.host_row(static_cast<int>(r), p);
    }
    host_locs_ = alloc(host_locs.size() * 8);
    upload(host_locs_, host_locs);
    std::vector<int64_t> ids(rows), seq_lens(rows, in.context);
    std::iota(ids.begin(), ids.end(), 0);
    ids_ = alloc(rows * 8);
    upload(ids_, ids);
    seq_lens_ = alloc(rows * 8);
    upload(seq_lens_, seq_lens);
    lru_ = alloc(rows * H * 2);
    real_ = alloc(4);
    upload(real_, std::vector<int32_t>{in.rows});
    out_ = alloc(rows * K * 4);
    miss_src_ = alloc(rows * K * 8);
    miss_dst_ = alloc(rows * K * 4);
    miss_count_ = alloc(rows * 4);
    if (!SkipIO) cache_ = alloc(static_cast<size_t>(in.hot_cache_rows()) * row_bytes);
    check(cudaFuncSetAttribute(kernel(), cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem())), "smem");
  }

  void reset() {
    upload(tokens_, std::vector<int32_t>(static_cast<size_t>(in_.rows) * (H + 1), -1));
    sparse_mla::reference::HiSparseState empty(in_.rows, H);
    upload(lru_, empty.lru);
  }
  std::vector<int32_t> misses() const { return download<int32_t>(miss_count_, static_cast<size_t>(in_.rows)); }

  void launch(cudaStream_t stream, int set) {
    const auto* top_k = top_k_.as<int32_t>() + static_cast<size_t>(set) * in_.rows * K;
    kernel()<<<in_.rows, BLOCK_SIZE, smem(), stream>>>(
        top_k, tokens_.as<int32_t>(), host_locs_.as<int64_t>(), locs_.as<int32_t>(), pool_ ? pool_->data() : nullptr,
        SkipIO ? nullptr : cache_.data(), out_.as<int32_t>(), ids_.as<int64_t>(), seq_lens_.as<int64_t>(),
        lru_.as<int16_t>(), real_.as<int32_t>(), H + 1, in_.context, H, K, K, row_bytes, miss_src_.as<int64_t>(),
        miss_dst_.as<int32_t>(), miss_count_.as<int32_t>(), K);
    check(cudaGetLastError(), "sglang launch");
  }

  // Its state keys slots by position: -1 or the position's host row.
  std::string compare(const Expected& e) const {
    const size_t entries = static_cast<size_t>(in_.rows) * K;
    Observed o{"top_k_device_locs", "miss_count", "miss_src", "miss_dst", "host row of device_buffer_tokens", "lru_slots",
               {}, {}, {}, {}, {}, {}};
    o.out = widen(download<int32_t>(out_, entries));
    o.counts = widen(download<int32_t>(miss_count_, static_cast<size_t>(in_.rows)));
    o.swap_host = widen(download<int64_t>(miss_src_, entries));
    o.swap_device = widen(download<int32_t>(miss_dst_, entries));
    const auto tokens = download<int32_t>(tokens_, static_cast<size_t>(in_.rows) * (H + 1));
    for (int r = 0; r < in_.rows; ++r) {
      for (int slot = 0; slot < H; ++slot) {
        const int32_t pos = tokens[static_cast<size_t>(r) * (H + 1) + static_cast<size_t>(slot)];
        o.slot_rows.push_back(pos < 0 ? -1 : in_.host_row(r, pos));
      }
    }
    o.lru = widen(download<int16_t>(lru_, static_cast<size_t>(in_.rows) * H));
    const std::string d = compare_observed(o, e);
    return d.empty() && !SkipIO ? compare_cache(cache_, e) : d;
  }

 private:
  using Kernel = decltype(&sglang::load_cache_to_device_buffer_kernel<BLOCK_SIZE, K, H, true, SkipIO>);
  static Kernel kernel() { return &sglang::load_cache_to_device_buffer_kernel<BLOCK_SIZE, K, H, true, SkipIO>; }
  static size_t smem() { return sglang::SmemLayout<K, H>::BYTES; }

  const Inputs& in_;
  const sparse_mla::Buffer* pool_;
  sparse_mla::Buffer top_k_, tokens_, locs_, host_locs_, ids_, seq_lens_, lru_, real_, out_, miss_src_, miss_dst_,
      miss_count_, cache_;
};

// Checks `checked_steps` steps from an empty state against the model, then
// times launches cycling over the sets (time_graph's untimed first cycle
// reaches the steady state), checks that the last launch missed exactly the
// designed rows, and prints one line.
template <class Impl, class Launch>
bool run(const char* name, const char* what, Impl& impl, const Inputs& in, const Expected& e, cudaStream_t stream,
         Launch launch) {
  const int hits = (100 * in.fixed + K / 2) / K;
  auto failed = [&](const std::string& why) {
    std::printf("%-10s %-22s rows %4d hits %3d%%  FAILED: %s\n", what, name, in.rows, hits, why.c_str());
    return false;
  };
  impl.reset();
  for (int s = 0; s < checked_steps; ++s) launch(s % in.sets);
  check(cudaStreamSynchronize(stream), "check launches");
  const std::string d = impl.compare(e);
  if (!d.empty()) return failed(d);
  const int launches = in.sets * std::max(1, (20 + in.sets - 1) / in.sets);
  const double us = time_graph(stream, launches, in.sets, launch);
  for (const int32_t m : impl.misses()) {
    if (m != K - in.fixed) return failed("a timed launch missed " + std::to_string(m) + " rows of a request, the design " + std::to_string(K - in.fixed));
  }
  std::printf("%-10s %-22s rows %4d hits %3d%%  sets %4d  median %9.2f us  ok\n", what, name, in.rows, hits, in.sets, us);
  return true;
}

}  // namespace

int main() {
  bool ok = true;
  {
    auto device = sparse_mla::open_device("cuda", 0);
    auto library_stream = device->create_stream();
    auto* stream = static_cast<cudaStream_t>(library_stream->native_handle());
    std::printf("HiSparse swap-in, K=%d, H=%d, %d-byte rows: the library and SGLang's kernel (BLOCK_SIZE threads a request)\n",
                K, H, row_bytes);
    struct Case {
      const char* what;
      int rows, hits;
    };
    const Case cases[] = {{"resolve", 1, 50},  {"resolve", 32, 50},  {"resolve", 128, 50}, {"swap-in", 32, 90},
                          {"swap-in", 32, 99}, {"swap-in", 32, 100}};
    for (const Case& c : cases) {
      const Inputs in(c.rows, (K * c.hits + 50) / 100, 20261205 + static_cast<uint64_t>(c.rows * 1000 + c.hits));
      const Expected e = model(in);
      const bool io = std::string(c.what) == "swap-in";
      sparse_mla::Buffer pool;
      if (io) {
        pool = device->allocate(static_cast<size_t>(in.host_rows()) * row_bytes, sparse_mla::MemoryKind::pinned_host);
        auto* words = pool.as<uint64_t>();
        for (int64_t g = 0; g < in.host_rows(); ++g) {
          for (int w = 0; w < row_bytes / 8; ++w) words[g * (row_bytes / 8) + w] = pool_word(g, w);
        }
      }
      Library ours(*device, in, io, io ? &pool : nullptr);
      ok &= run("sparse-mla", c.what, ours, in, e, stream, [&](int s) { ours.launch(*library_stream, s); });
      if (io) {
        SGLang<1024, false> theirs(*device, in, &pool);
        ok &= run("sglang, 1024 threads", c.what, theirs, in, e, stream, [&](int s) { theirs.launch(stream, s); });
        SGLang<960, false> theirs_960(*device, in, &pool);
        ok &= run("sglang, 960 threads", c.what, theirs_960, in, e, stream, [&](int s) { theirs_960.launch(stream, s); });
      } else {
        SGLang<1024, true> theirs(*device, in, nullptr);
        ok &= run("sglang, 1024 threads", c.what, theirs, in, e, stream, [&](int s) { theirs.launch(stream, s); });
        SGLang<960, true> theirs_960(*device, in, nullptr);
        ok &= run("sglang, 960 threads", c.what, theirs_960, in, e, stream, [&](int s) { theirs_960.launch(stream, s); });
      }
    }
  }
  return ok ? 0 : 1;
}
