// The golden-file handlers of `sparse-mla validate --golden`, one per
// metadata `kind` (golden/README.md), and the device staging they share.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "sparse_mla/device.hpp"
#include "validation/safetensors.hpp"
#include "sparse_mla/tensor.hpp"
#include "validation/cases.hpp"
#include "validation/device_scratch.hpp"

namespace sparse_mla::validation {

PreparedCase prepare_topk_convert(std::shared_ptr<const SafetensorsFile> file);
PreparedCase prepare_topk_convert_dcp(std::shared_ptr<const SafetensorsFile> file);
PreparedCase prepare_fp8_gather_upconvert(std::shared_ptr<const SafetensorsFile> file);
PreparedCase prepare_v4_dequant_gather(std::shared_ptr<const SafetensorsFile> file);
PreparedCase prepare_hisparse_sequence(std::shared_ptr<const SafetensorsFile> file);

}  // namespace sparse_mla::validation
