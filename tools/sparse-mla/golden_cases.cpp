// The kind -> handler table of `validate --golden`, and what the handlers
// share.
#include "golden_cases.hpp"

#include <sstream>

#include "sparse_mla/error.hpp"
#include "sparse_mla/hisparse_replay.hpp"

namespace sparse_mla::cli::validation {

const std::map<std::string, GoldenHandler>& golden_handlers() {
  static const std::map<std::string, GoldenHandler> handlers = {
      {"topk_convert", prepare_topk_convert},
      {"fp8_gather_upconvert", prepare_fp8_gather_upconvert},
      {"hisparse_sequence", prepare_hisparse_sequence},
  };
  return handlers;
}

PreparedCase prepare_golden(const std::string& path) {
  return prepare_golden_file(std::make_shared<const SafetensorsFile>(SafetensorsFile::read(path)));
}

PreparedCase prepare_golden_file(std::shared_ptr<const SafetensorsFile> file) {
  const std::string& kind = file->meta("kind");
  const auto& handlers = golden_handlers();
  const auto handler = handlers.find(kind);
  if (handler == handlers.end()) {
    std::string known;
    for (const auto& entry : handlers) known += (known.empty() ? "" : ", ") + entry.first;
    fail(file->origin(), "kind '", kind, "' is not one this command validates (known: ", known, ")");
  }
  return handler->second(std::move(file));
}

std::string MismatchLog::position(const std::vector<std::int64_t>& shape, std::int64_t flat) {
  return index_string(shape, flat);
}

// ---- DeviceScratch ----

Tensor DeviceScratch::keep(Buffer buffer, DType dtype, const std::vector<std::int64_t>& shape) {
  buffers_.push_back(std::move(buffer));
  return Tensor::of(buffers_.back(), dtype, shape);
}

Tensor DeviceScratch::upload(const TensorRecord& record) {
  const std::size_t bytes = record.bytes.size();
  Buffer staging = device_.allocate(bytes, MemoryKind::host);
  if (bytes) std::memcpy(staging.data(), record.bytes.data(), bytes);
  Buffer buffer = device_.allocate(bytes, MemoryKind::device);
  stream_->copy(buffer, 0, staging, 0, bytes);
  stream_->synchronize();
  return keep(std::move(buffer), record.dtype, record.shape);
}

Tensor DeviceScratch::filled(DType dtype, const std::vector<std::int64_t>& shape, std::uint8_t byte) {
  std::size_t bytes = dtype_size(dtype);
  for (std::int64_t d : shape) bytes *= static_cast<std::size_t>(d);
  Buffer buffer = device_.allocate(bytes, MemoryKind::device);
  stream_->fill(buffer, 0, byte, bytes);
  return keep(std::move(buffer), dtype, shape);
}

std::vector<std::uint8_t> DeviceScratch::download(const Tensor& tensor) {
  const std::size_t bytes = static_cast<std::size_t>(tensor.numel()) * tensor.element_size();
  Buffer staging = device_.allocate(bytes, MemoryKind::host);
  if (bytes) stream_->copy_bytes(staging.data(), tensor.data(), bytes);
  stream_->synchronize();
  std::vector<std::uint8_t> out(bytes);
  if (bytes) std::memcpy(out.data(), staging.data(), bytes);
  return out;
}

// ---- hisparse_sequence: the HiSparse replay (core/src/hisparse_replay.cpp) ----

PreparedCase prepare_hisparse_sequence(std::shared_ptr<const SafetensorsFile> file) {
  return [file](const ValidateContext& context) {
    const HiSparseReplay replay = replay_hisparse_sequence(context.device, *file);
    CaseResult result{file->origin(), "hisparse_sequence", replay.compared, replay.mismatches, {}, {}};
    for (const ReplayCheck& check : replay.checks) {
      if (check.mismatches && result.first_mismatches.size() < MismatchLog::max_shown) {
        const bool indexed = !check.first_mismatch.empty() && check.first_mismatch[0] == '[';
        result.first_mismatches.push_back(check.name + (indexed ? "" : ": ") + check.first_mismatch);
      }
    }
    result.details["checks"] = replay.checks.size();
    result.details["undefined_entries_skipped"] = replay.skipped;
    result.details["hits"] = replay.hits;
    result.details["misses"] = replay.misses;
    return result;
  };
}

}  // namespace sparse_mla::cli::validation
