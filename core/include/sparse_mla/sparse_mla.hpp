// The whole public interface of the library, for engines that link it.
// A header with an implementation has it in the source of the same name:
// core/src/<name>.cpp (host_debug: backends/host/host_debug.cpp).
#pragma once

#include "sparse_mla/batch.hpp"            // BatchMetadata, HiSparseBatch: what a step passes
#include "sparse_mla/device.hpp"           // Device, Stream, Event, Buffer, Graph, open_device
#include "sparse_mla/dtype.hpp"            // DType
#include "sparse_mla/error.hpp"            // Error: every rejected argument
#include "sparse_mla/fill.hpp"             // fill_i32
#include "sparse_mla/fp8.hpp"              // fp8 formats and the fp8_ds_mla row layout
#include "sparse_mla/fp8_upconvert.hpp"    // gather_upconvert_fp8 (SPEC section 3)
#include "sparse_mla/hisparse_cache.hpp"   // HiSparseCacheHandle: host pool and hot cache of a layer
#include "sparse_mla/hisparse_config.hpp"  // HiSparseConfig
#include "sparse_mla/hisparse_group.hpp"   // HiSparseMLAIndexGroup (SPEC section 5)
#include "sparse_mla/hisparse_ops.hpp"     // the HiSparse operations, one call each
#include "sparse_mla/hisparse_prefill.hpp" // the prefill staging plan
#include "sparse_mla/host_debug.hpp"       // the host backend's debug delay
#include "sparse_mla/index_group.hpp"      // SparseMLAIndexGroup (SPEC section 4)
#include "sparse_mla/index_group_builder.hpp"  // SparseMLAIndexGroupBuilder, LayerRegistration
#include "sparse_mla/kokkos_runtime.hpp"   // Kokkos initialisation shared with the engine
#include "sparse_mla/tensor.hpp"           // Tensor, OwnedTensor, upload/download
#include "sparse_mla/topk_convert.hpp"     // convert_logical_to_physical_topk (SPEC section 2)
