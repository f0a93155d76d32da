// The plain operations with the reference's argument names: the top-k
// conversion (vLLM's triton_convert_req_index_to_global_index and its DCP
// form triton_filter_and_convert_dcp_index, SPEC sections 2 and 2a), the FP8
// gather-upconvert (ops.cp_gather_and_upconvert_fp8_kv_cache, section 3), and
// the HiSparse prefill staging plan built from host tables (section 5).
#include <pybind11/stl.h>

#include <utility>
#include <vector>

#include "operations.hpp"

#include "dlpack.hpp"
#include "streams.hpp"
#include "sparse_mla/error.hpp"
#include "sparse_mla/fp8_upconvert.hpp"
#include "sparse_mla/hisparse_prefill.hpp"
#include "sparse_mla/topk_convert.hpp"

namespace sparse_mla::python {

namespace {

// A conversion's fresh buffers, freed through their device.
struct ConversionStorage {
  std::shared_ptr<DeviceHandle> device;
  OwnedTensor physical, valid_counts;
};

std::int64_t int_or(const py::object& value, std::int64_t none) { return value.is_none() ? none : value.cast<std::int64_t>(); }

py::object convert_req_index_to_global_index(const py::object& req_id, const py::object& block_table,
                                             const py::object& token_indices, std::int32_t block_size,
                                             const py::object& block_stride_rows, bool return_valid_counts,
                                             const py::object& out, const py::object& valid_counts_out,
                                             const py::object& stream, std::int32_t dcp_size, std::int32_t dcp_rank,
                                             std::int32_t dcp_interleave, bool compact,
                                             const py::object& prefill_workspace_request_ids,
                                             const py::object& prefill_workspace_starts, const py::object& device) {
  const std::shared_ptr<DeviceHandle> dev = call_device(device, stream, {token_indices, req_id, block_table, out});
  const CallStream call = resolve_stream(dev, stream);
  Stream& s = call.get();
  const TensorArg req = import_tensor(req_id, "req_id", *dev, s);
  const TensorArg table = import_tensor(block_table, "block_table", *dev, s);
  const TensorArg logical = import_tensor(token_indices, "token_indices", *dev, s);
  const TensorArg o = import_tensor(out, "out", *dev, s);
  const TensorArg vo = import_tensor(valid_counts_out, "valid_counts_out", *dev, s);
  const TensorArg ws_request = import_tensor(prefill_workspace_request_ids, "prefill_workspace_request_ids", *dev, s);
  const TensorArg ws_starts = import_tensor(prefill_workspace_starts, "prefill_workspace_starts", *dev, s);
  TopkConvertParams params;
  params.block_size = block_size;
  params.block_stride_rows = int_or(block_stride_rows, 0);
  params.return_valid_counts = return_valid_counts;
  params.dcp = DcpConfig{dcp_size, dcp_rank, dcp_interleave, compact};
  params.workspace_request = ws_request.tensor;
  params.workspace_starts = ws_starts.tensor;
  TopkConversion conversion =
      convert_logical_to_physical_topk(s, req.tensor, table.tensor, logical.tensor, params, o.tensor, vo.tensor);
  call.finish();
  return conversion_result(dev, std::move(conversion), o, vo, return_valid_counts, nullptr, call);
}

void cp_gather_and_upconvert_fp8_kv_cache(const py::object& src_cache, const py::object& dst,
                                          const py::object& block_table, const py::object& workspace_starts,
                                          std::int64_t batch_size, const py::object& seq_starts,
                                          const py::object& host_cache, const py::object& host_row_ids,
                                          const py::object& device_row_ids, std::int64_t block_size,
                                          const std::string& fp8_format, const std::string& kv_format,
                                          const py::object& stream, const py::object& device) {
  Fp8GatherParams params;
  if (!parse_fp8_format(fp8_format, params.format)) {
    fail("cp_gather_and_upconvert_fp8_kv_cache", "unknown fp8_format '", fp8_format, "' (e4m3fn, e4m3fnuz)");
  }
  if (!parse_kv_format(kv_format, params.kv_format)) {
    fail("cp_gather_and_upconvert_fp8_kv_cache", "unknown kv_format '", kv_format, "' (fp8_ds_mla, model1_fp8)");
  }
  const std::shared_ptr<DeviceHandle> dev = call_device(device, stream, {src_cache, dst});
  const CallStream call = resolve_stream(dev, stream);
  Stream& s = call.get();
  const TensorArg src = import_tensor(src_cache, "src_cache", *dev, s);
  const TensorArg out = import_tensor(dst, "dst", *dev, s);
  const TensorArg table = import_tensor(block_table, "block_table", *dev, s);
  const TensorArg starts = import_tensor(workspace_starts, "workspace_starts", *dev, s);
  const TensorArg seq = import_tensor(seq_starts, "seq_starts", *dev, s);
  const TensorArg host = import_tensor(host_cache, "host_cache", *dev, s);
  const TensorArg host_rows = import_tensor(host_row_ids, "host_row_ids", *dev, s);
  const TensorArg device_rows = import_tensor(device_row_ids, "device_row_ids", *dev, s);
  params.seq_starts = seq.tensor;
  params.host_cache = host.tensor;
  params.host_row_ids = host_rows.tensor;
  params.device_row_ids = device_rows.tensor;
  params.block_size = block_size;
  gather_upconvert_fp8(s, src.tensor, out.tensor, table.tensor, starts.tensor, batch_size, params);
  call.finish();
}

// The values of a host-readable int tensor (int32, or int64 where `wide`),
// checked like every argument.
std::vector<std::int64_t> host_values(const char* where, const char* name, const TensorArg& arg, int rank, bool wide) {
  const Tensor& t = arg.tensor;
  check(where, name, t).defined().rank(rank).contiguous();
  if (!(wide && t.dtype() == DType::i64)) check(where, name, t).dtype(DType::i32);
  const bool readable = t.kind() != MemoryKind::device || (t.device() != nullptr && t.device()->backend() == Backend::host);
  if (!readable) fail(where, name, " is in device memory; the plan is built from host copies (NumPy, torch CPU tensors)");
  if (t.numel() > 0 && t.data() == nullptr) fail(where, name, " has no data (null pointer)");
  std::vector<std::int64_t> values(static_cast<std::size_t>(t.numel()));
  for (std::size_t i = 0; i < values.size(); ++i) {
    values[i] = t.dtype() == DType::i64 ? static_cast<const std::int64_t*>(t.data())[i]
                                        : static_cast<const std::int32_t*>(t.data())[i];
  }
  return values;
}

std::vector<std::int32_t> narrow_values(const std::vector<std::int64_t>& values) {
  return std::vector<std::int32_t>(values.begin(), values.end());
}

std::shared_ptr<PlanCore> build_hisparse_prefill_staging_plan_py(const py::object& block_table,
                                                                 const py::object& context_lengths,
                                                                 std::int32_t block_size,
                                                                 const py::object& resident_block_table,
                                                                 std::int32_t resident_null_block,
                                                                 const py::object& device, const py::object& stream) {
  constexpr const char* where = "build_hisparse_prefill_staging_plan";
  const std::shared_ptr<DeviceHandle> dev = call_device(device, stream, {});
  const CallStream call = resolve_stream(dev, stream);
  Stream& s = call.get();
  const TensorArg table = import_tensor(block_table, "block_table", *dev, s);
  const TensorArg lengths = import_tensor(context_lengths, "context_lengths", *dev, s);
  const TensorArg resident = import_tensor(resident_block_table, "resident_block_table", *dev, s);
  const std::vector<std::int32_t> table_values = narrow_values(host_values(where, "block_table", table, 2, false));
  const std::vector<std::int64_t> length_values = host_values(where, "context_lengths", lengths, 1, true);
  std::vector<std::int32_t> resident_values;
  std::int64_t resident_blocks = 0;
  if (resident.defined()) {
    resident_values = narrow_values(host_values(where, "resident_block_table", resident, 2, false));
    resident_blocks = resident.tensor.dim(1);
  }
  auto core = std::make_shared<PlanCore>();
  core->device = dev;
  core->plan = build_hisparse_prefill_staging_plan(dev->device(), s, table_values, table.tensor.dim(0), table.tensor.dim(1),
                                                   length_values, block_size, resident_values, resident_blocks,
                                                   resident_null_block);
  return core;
}

}  // namespace

py::object conversion_result(const std::shared_ptr<DeviceHandle>& device, TopkConversion conversion,
                             const TensorArg& out, const TensorArg& valid_counts_out, bool return_valid_counts,
                             const std::shared_ptr<void>& owner, const CallStream& call) {
  const bool fresh_physical = conversion.physical_storage.defined();
  const bool fresh_counts = conversion.valid_counts_storage.defined();
  std::shared_ptr<void> storage;
  if (fresh_physical || fresh_counts) {
    storage = std::make_shared<ConversionStorage>(ConversionStorage{
        device, std::move(conversion.physical_storage), std::move(conversion.valid_counts_storage)});
  }
  auto result = [&](const Tensor& view, bool fresh, const TensorArg& given) -> py::object {
    if (fresh) return py::cast(export_view(device, view, storage, call.ref));
    return result_object(device, view, OwnedTensor(), given, owner, call.ref);
  };
  py::object physical = result(conversion.physical, fresh_physical, out);
  if (!return_valid_counts) {
    // Valid counts a DCP conversion wrote for nobody: kept until the stream has run.
    if (fresh_counts && !fresh_physical) device->release_after(call.get(), storage);
    return physical;
  }
  return py::make_tuple(physical, result(conversion.valid_counts, fresh_counts, valid_counts_out));
}

void register_operations(py::module_& m) {
  m.def("convert_req_index_to_global_index", &convert_req_index_to_global_index, py::arg("req_id"),
        py::arg("block_table"), py::arg("token_indices"), py::kw_only(), py::arg("block_size"),
        py::arg("block_stride_rows") = py::none(), py::arg("return_valid_counts") = false, py::arg("out") = py::none(),
        py::arg("valid_counts_out") = py::none(), py::arg("stream") = py::none(), py::arg("dcp_size") = 1,
        py::arg("dcp_rank") = 0, py::arg("dcp_interleave") = 1, py::arg("compact") = true,
        py::arg("prefill_workspace_request_ids") = py::none(), py::arg("prefill_workspace_starts") = py::none(),
        py::arg("device") = py::none(),
        R"(Logical top-k positions to physical KV-cache rows (SPEC section 2; vLLM's
triton_convert_req_index_to_global_index). req_id int32 [>= T], block_table int32 [R, B], token_indices int32
[T, K]. Returns physical int32 [T, K], or (physical, valid_counts) with return_valid_counts. `out` /
`valid_counts_out` are written instead of new buffers (and returned). dcp_size > 1 filters to rank dcp_rank
through its rank-local table (section 2a; triton_filter_and_convert_dcp_index, compact = compact_valid_to_front).)");
  m.def("cp_gather_and_upconvert_fp8_kv_cache", &cp_gather_and_upconvert_fp8_kv_cache, py::arg("src_cache"),
        py::arg("dst"), py::arg("block_table"), py::arg("workspace_starts"), py::arg("batch_size"), py::kw_only(),
        py::arg("seq_starts") = py::none(), py::arg("host_cache") = py::none(), py::arg("host_row_ids") = py::none(),
        py::arg("device_row_ids") = py::none(), py::arg("block_size") = 0, py::arg("fp8_format") = "e4m3fn",
        py::arg("kv_format") = "fp8_ds_mla", py::arg("stream") = py::none(), py::arg("device") = py::none(),
        R"(Paged fp8_ds_mla rows (uint8 [blocks, block_size, 656]) gathered and upconverted into dst (bf16
[TOT, 576]; NumPy: sparse_mla.from_dlpack(uint16_array, dtype='bfloat16')), SPEC section 3. The host-backed
variant takes host_cache (pinned_host memory), host_row_ids and device_row_ids. kv_format='model1_fp8' reads
DeepSeek V4's pages instead (uint8 [blocks, B, 584] with padded pages, or [blocks, bytes] with block_size=B)
into dst bf16 [TOT, 512].)");
  m.def("build_hisparse_prefill_staging_plan", &build_hisparse_prefill_staging_plan_py, py::arg("block_table"),
        py::arg("context_lengths"), py::kw_only(), py::arg("block_size"), py::arg("resident_block_table") = py::none(),
        py::arg("resident_null_block") = 0, py::arg("device") = py::none(), py::arg("stream") = py::none(),
        R"(SPEC section 5's prefill staging plan from host copies (int32 [P, B] source block table, context lengths
[P]), uploaded to `device` (waits for the upload; set-up, not the step path). Pass it as
attn_metadata.prefill.host_staging_plan.)");

  py::class_<PlanCore, std::shared_ptr<PlanCore>>(m, "HiSparsePrefillStagingPlan")
      .def_property_readonly("num_blocks", [](const PlanCore& p) { return p.plan.num_blocks; })
      .def_property_readonly("block_size", [](const PlanCore& p) { return p.plan.block_size; })
      .def_property_readonly("has_resident_table", [](const PlanCore& p) { return p.plan.has_resident_table; })
      .def_property_readonly("block_table", [](const std::shared_ptr<PlanCore>& p) {
        return export_view(p->device, p->plan.block_table, p);
      })
      .def_property_readonly("row_ids", [](const std::shared_ptr<PlanCore>& p) { return export_view(p->device, p->plan.row_ids, p); })
      .def_property_readonly("gpu_row_ids", [](const std::shared_ptr<PlanCore>& p) {
        return export_view(p->device, p->plan.gpu_row_ids, p);
      });
}

}  // namespace sparse_mla::python
