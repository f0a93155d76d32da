// The plain operations of the module (operations.cpp): the top-k conversion,
// the FP8 gather-upconvert and the HiSparse prefill staging plan.
#pragma once

#include <pybind11/pybind11.h>

#include <memory>

#include "sparse_mla/hisparse_prefill.hpp"
#include "streams.hpp"

namespace sparse_mla::python {

// sparse_mla.HiSparsePrefillStagingPlan: a staging plan and the device its
// storage lives on (destroyed after the plan).
struct PlanCore {
  std::shared_ptr<DeviceHandle> device;
  HiSparsePrefillStagingPlan plan;
};

// convert_req_index_to_global_index, cp_gather_and_upconvert_fp8_kv_cache,
// build_hisparse_prefill_staging_plan and HiSparsePrefillStagingPlan.
void register_operations(py::module_& m);

}  // namespace sparse_mla::python
