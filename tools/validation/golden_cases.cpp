// The kind -> handler table of `validate --golden`, and what the handlers
// share.
#include "validation/golden_cases.hpp"

#include <sstream>

#include "sparse_mla/error.hpp"
#include "validation/hisparse_replay.hpp"

namespace sparse_mla::validation {

const std::map<std::string, GoldenHandler>& golden_handlers() {
  static const std::map<std::string, GoldenHandler> handlers = {
      {"topk_convert", prepare_topk_convert},
      {"topk_convert_dcp", prepare_topk_convert_dcp},
      {"fp8_gather_upconvert", prepare_fp8_gather_upconvert},
      {"v4_dequant_gather", prepare_v4_dequant_gather},
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

// ---- hisparse_sequence: the HiSparse replay (hisparse_replay.cpp) ----

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

}  // namespace sparse_mla::validation
