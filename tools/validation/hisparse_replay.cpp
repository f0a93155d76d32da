#include "validation/hisparse_replay.hpp"

#include <algorithm>
#include <cstring>
#include <functional>
#include <sstream>

#include "sparse_mla/error.hpp"
#include "sparse_mla/hisparse_ops.hpp"
#include "validation/device_scratch.hpp"
#include "sparse_mla/tensor.hpp"

namespace sparse_mla {

namespace {

// The reference's poison (golden/README.md): int32 outputs -9, swap lists -2.
constexpr std::int32_t poison_output = -9;
constexpr std::int32_t poison_swap = -2;

// A small integer field of the "totals" metadata ({"hits": 478, ...}), or -1.
std::int64_t totals_field(const SafetensorsFile& file, const std::string& key) {
  if (!file.has_meta("totals")) return -1;
  const std::string& totals = file.meta("totals");
  const std::size_t at = totals.find("\"" + key + "\":");
  if (at == std::string::npos) return -1;
  // Untrusted text: digits only (std::stoll would throw its own exceptions).
  std::size_t i = at + key.size() + 3;
  while (i < totals.size() && totals[i] == ' ') ++i;
  std::int64_t value = 0;
  std::size_t digits = 0;
  for (; i < totals.size() && totals[i] >= '0' && totals[i] <= '9' && digits < 18; ++i, ++digits) {
    value = value * 10 + (totals[i] - '0');
  }
  if (digits == 0) fail(file.origin(), "metadata totals: '", key, "' is not a small non-negative integer");
  return value;
}

// The kernels trust the slot state (SPEC section 5: each LRU row is a
// permutation of the slots); a file's initial state is checked here.
void check_lru_rows(const SafetensorsFile& file, const TensorRecord& lru, std::int64_t states, std::int64_t H) {
  const std::int16_t* order = lru.data<std::int16_t>();
  std::vector<char> seen(static_cast<std::size_t>(H));
  for (std::int64_t s = 0; s < states; ++s) {
    std::fill(seen.begin(), seen.end(), 0);
    for (std::int64_t p = 0; p < H; ++p) {
      const std::int16_t slot = order[s * H + p];
      if (slot < 0 || slot >= H || seen[static_cast<std::size_t>(slot)]) {
        fail(file.origin(), "initial.lru_slots[", s, ", ", p, "] = ", slot, ": row ", s,
             " is not a permutation of the ", H, " hot slots");
      }
      seen[static_cast<std::size_t>(slot)] = 1;
    }
  }
}

class Replay {
 public:
  Replay(Device& device, const SafetensorsFile& file) : file_(file), scratch_(device) {}

  HiSparseReplay run() {
    read_dimensions();
    set_up();
    for (std::int64_t s = 0; s < steps_; ++s) step(s);
    const std::vector<std::uint8_t> counters = download(counters_);
    std::uint64_t hit_miss[2];
    std::memcpy(hit_miss, counters.data(), sizeof hit_miss);
    result_.hits = hit_miss[0];
    result_.misses = hit_miss[1];
    check_total("totals.hits", result_.hits);
    check_total("totals.misses", result_.misses);
    return result_;
  }

 private:
  void read_dimensions() {
    if (file_.meta("kind") != "hisparse_sequence") {
      fail(file_.origin(), "kind is '", file_.meta("kind"), "', expected 'hisparse_sequence'");
    }
    for (const char* key : {"input_row_stride", "output_row_stride"}) {
      if (file_.meta_int(key) != 1) fail(file_.origin(), key, " = ", file_.meta_int(key), "; only 1 is supported");
    }
    for (const char* key : {"input_row_offset", "output_row_offset"}) {
      if (file_.meta_int(key) != 0) fail(file_.origin(), key, " = ", file_.meta_int(key), "; only 0 is supported");
    }
    K_ = file_.meta_int("top_k");
    H_ = file_.meta_int("hot_size");
    rows_ = file_.meta_int("batch_rows");
    steps_ = file_.meta_int("num_steps");
    host_rows_ = file_.meta_int("host_rows");
    row_bytes_ = file_.meta_int("row_bytes");
    hot_block_size_ = file_.meta_int("hot_block_size");
  }

  void set_up() {
    const std::int64_t states = file_.meta_int("num_state_rows");
    const std::int64_t region = file_.meta_int("region_stride");
    const std::int64_t blocks = file_.meta_int("hot_cache_blocks");
    host_pool_ = upload(file_.require("host_cache", DType::u8, {host_rows_, row_bytes_}), MemoryKind::pinned_host);
    source_ = upload(file_.require_rank("source_block_table", DType::i32, 2));
    resident_ = upload(file_.require_rank("resident_block_table", DType::i32, 2));
    slot_rows_ = upload(file_.require("initial.device_global_indices", DType::i32, {states, region}));
    const TensorRecord& lru = file_.require("initial.lru_slots", DType::i16, {states, H_});
    check_lru_rows(file_, lru, states, H_);
    lru_ = upload(lru);
    hot_cache_ = upload(file_.require("initial.hot_cache", DType::u8, {blocks, hot_block_size_, row_bytes_}));
    counters_ = upload(TensorRecord::from_values<std::int64_t>("counters", {2}, {0, 0}));
    for (Tensor* t : {&hot_indices_, &attention_, &resolved_, &miss_mask_, &swap_host_, &swap_device_}) {
      *t = allocate(DType::i32, {rows_, K_});
    }
    valid_counts_ = allocate(DType::i32, {rows_});
    swap_counts_ = allocate(DType::i32, {rows_});
  }

  HiSparseResolveInputs inputs(const std::string& p) {
    HiSparseResolveInputs in;
    in.logical = upload(file_.require(p + "logical", DType::i32, {rows_, K_}));
    in.request_ids = upload(file_.require(p + "request_ids", DType::i32, {rows_}));
    in.request_state_indices = upload(file_.require(p + "request_state_indices", DType::i32, {rows_}));
    in.source_block_table = source_;
    in.source_block_size = static_cast<std::int32_t>(file_.meta_int("source_block_size"));
    in.host_rows = host_rows_;
    in.resident_block_table = resident_;
    in.resident_block_size = static_cast<std::int32_t>(file_.meta_int("resident_block_size"));
    in.resident_null_block = static_cast<std::int32_t>(file_.meta_int("resident_null_block"));
    in.hot_block_table = upload(file_.require_rank(p + "hot_block_table", DType::i32, 2));
    in.hot_block_size = static_cast<std::int32_t>(hot_block_size_);
    in.attention_block_stride = file_.meta_int("attention_block_stride");
    return in;
  }

  void step(std::int64_t s) {
    const std::string p = "step" + std::to_string(s) + ".";
    const HiSparseResolveInputs in = inputs(p);
    for (const Tensor* t : {&hot_indices_, &attention_, &resolved_, &miss_mask_, &valid_counts_, &swap_counts_}) poison(*t, poison_output);
    for (const Tensor* t : {&swap_host_, &swap_device_}) poison(*t, poison_swap);
    const HiSparseResolveOutputs out{hot_indices_, attention_, resolved_, miss_mask_, swap_host_,
                                     swap_device_, valid_counts_, swap_counts_, counters_};
    resolve_hisparse(scratch_.stream(), in, HiSparseSlotState{slot_rows_, lru_}, static_cast<std::int32_t>(H_), out);
    gather_hisparse(scratch_.stream(), HiSparseGatherTensors{host_pool_, hot_cache_, swap_host_, swap_device_, swap_counts_}, rows_);

    const std::int32_t* states = file_.tensor(p + "request_state_indices").data<std::int32_t>();
    const std::int32_t* counts = file_.require(p + "swap_counts", DType::i32, {rows_}).data<std::int32_t>();
    const auto every = [](std::int64_t) { return true; };
    compare<std::int32_t>(p + "hot_indices", hot_indices_, every);
    compare<std::int32_t>(p + "attention_indices", attention_, every);
    compare<std::int32_t>(p + "resolved_global_indices", resolved_, every);
    compare<std::int32_t>(p + "valid_counts", valid_counts_, every);
    compare<std::int32_t>(p + "swap_counts", swap_counts_, every);
    // A padding row's miss mask is never written by the reference.
    compare<std::int32_t>(p + "miss_mask", miss_mask_, [&](std::int64_t i) { return states[i / K_] >= 0; });
    // Only the first swap_counts[row] swap entries are defined.
    const auto in_swap_list = [&](std::int64_t i) { return i % K_ < counts[i / K_]; };
    compare<std::int32_t>(p + "swap_host_rows", swap_host_, in_swap_list);
    compare<std::int32_t>(p + "swap_device_rows", swap_device_, in_swap_list);
    compare<std::int32_t>(p + "device_global_indices", slot_rows_, every);
    compare<std::int16_t>(p + "lru_slots", lru_, every);
    compare<std::uint8_t>(p + "hot_cache", hot_cache_, every);
  }

  template <class T>
  void compare(const std::string& name, const Tensor& got_tensor, const std::function<bool(std::int64_t)>& defined) {
    const TensorRecord& want_record = file_.tensor(name);
    const std::vector<std::uint8_t> got_bytes = download(got_tensor);
    const std::int64_t n = want_record.numel();
    if (static_cast<std::int64_t>(got_bytes.size()) != n * static_cast<std::int64_t>(sizeof(T))) {
      fail(file_.origin(), name, " has ", n, " entries but the library's tensor has ", got_bytes.size() / sizeof(T));
    }
    const T* want = want_record.data<T>();
    std::vector<T> got(static_cast<std::size_t>(n));
    if (n) std::memcpy(got.data(), got_bytes.data(), got_bytes.size());
    ReplayCheck check{name, 0, 0, ""};
    for (std::int64_t i = 0; i < n; ++i) {
      if (!defined(i)) {
        ++result_.skipped;
        continue;
      }
      ++check.compared;
      if (got[static_cast<std::size_t>(i)] == want[i]) continue;
      if (check.mismatches++ == 0) {
        check.first_mismatch = detail::concat(index_string(want_record.shape, i), ": got ", +got[static_cast<std::size_t>(i)],
                                              ", expected ", +want[i]);
      }
    }
    result_.compared += check.compared;
    result_.mismatches += check.mismatches;
    result_.checks.push_back(check);
  }

  void check_total(const std::string& name, std::uint64_t got) {
    const std::int64_t want = totals_field(file_, name.substr(name.find('.') + 1));
    if (want < 0) return;
    ReplayCheck check{name, 1, static_cast<std::int64_t>(got) != want ? 1 : 0, ""};
    if (check.mismatches) check.first_mismatch = detail::concat("got ", got, ", expected ", want);
    result_.compared += 1;
    result_.mismatches += check.mismatches;
    result_.checks.push_back(check);
  }

  Tensor upload(const TensorRecord& record, MemoryKind kind = MemoryKind::device) { return scratch_.upload(record, kind); }
  Tensor allocate(DType dtype, const std::vector<std::int64_t>& shape) { return scratch_.allocate(dtype, shape); }
  void poison(const Tensor& t, std::int32_t value) { scratch_.poison(t, value); }
  std::vector<std::uint8_t> download(const Tensor& t) { return scratch_.download(t); }

  const SafetensorsFile& file_;
  std::int64_t K_ = 0, H_ = 0, rows_ = 0, steps_ = 0, host_rows_ = 0, row_bytes_ = 0, hot_block_size_ = 0;
  Tensor host_pool_, source_, resident_, slot_rows_, lru_, hot_cache_, counters_;
  Tensor hot_indices_, attention_, resolved_, miss_mask_, swap_host_, swap_device_, valid_counts_, swap_counts_;
  HiSparseReplay result_;
  // Declared last, so destroyed first: when a step throws with work still
  // queued, the scratch's stream drains it before its tensors are freed.
  validation::DeviceScratch scratch_;
};

}  // namespace

HiSparseReplay replay_hisparse_sequence(Device& device, const SafetensorsFile& file) { return Replay(device, file).run(); }

}  // namespace sparse_mla
