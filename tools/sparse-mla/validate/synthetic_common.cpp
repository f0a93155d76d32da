#include "synthetic_common.hpp"

#include <ostream>

namespace sparse_mla::cli {

void SyntheticTally::note(const std::string& text, nlohmann::ordered_json detail) {
  ++mismatches;
  if (first.size() >= max_shown) return;
  first.push_back(text);
  first_json.push_back(detail.is_null() ? nlohmann::ordered_json(text) : std::move(detail));
}

void SyntheticReport::write(std::ostream& out, bool json, const SyntheticTally& tally, bool ok) const {
  if (json) {
    nlohmann::ordered_json doc;
    doc["ok"] = ok;
    for (const auto& [key, value] : fields.items()) doc[key] = value;
    doc["checked_layer_results"] = tally.checked_results;
    if (tally.checked_rows != 0) doc["checked_rows"] = tally.checked_rows;
    doc["mismatches"] = tally.mismatches;
    doc["first_mismatches"] = tally.first_json;
    out << doc.dump() << "\n";
    return;
  }
  for (const std::string& line : lines) out << line << "\n";
  out << "  checked " << tally.checked_results << " layer results";
  if (tally.checked_rows != 0) out << " and " << tally.checked_rows << " rows";
  out << ", " << tally.mismatches << " mismatches\n";
  for (const std::string& m : tally.first) out << "  mismatch: " << m << "\n";
  out << (ok ? "ok" : "FAILED") << "\n";
}

}  // namespace sparse_mla::cli
