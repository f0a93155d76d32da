// The seed's index-group API (SPEC sections 4 and 5) over the library's
// groups: SparseMLAIndexGroupBuilder, SparseMLAIndexGroup and
// HiSparseMLAIndexGroup with the reference's method and argument names.
// `attn_metadata` is any object (or dict) with the reference's attribute
// names; every per-step method takes an optional `stream` (streams.hpp says
// which stream None is).
//
// Lifetimes: a group's C++ object reads memory Python handed it for as long
// as it lives (the logical top-k buffer, engine storage of HiSparse layers):
// GroupCore keeps those tensors, and everything handed out of a group (its
// workspace views, side stream, events, caches) keeps the GroupCore.
#include <pybind11/stl.h>

#include <utility>
#include <vector>

#include "groups.hpp"

#include "dlpack.hpp"
#include "operations.hpp"
#include "streams.hpp"
#include "sparse_mla/error.hpp"
#include "sparse_mla/fp8.hpp"
#include "sparse_mla/hisparse_group.hpp"
#include "sparse_mla/hisparse_ops.hpp"
#include "sparse_mla/index_group_builder.hpp"

namespace sparse_mla::python {

namespace {

// A group and what it reads that Python handed it; destroyed group first
// (its destructor drains the work that reads the rest).
struct GroupCore {
  std::shared_ptr<DeviceHandle> device;
  std::vector<std::shared_ptr<void>> keep;
  std::shared_ptr<SparseMLAIndexGroup> group;
};

// sparse_mla.SparseMLAIndexGroup.
class PyGroup {
 public:
  PyGroup(std::shared_ptr<GroupCore> core, py::object logical_topk_indices)
      : core_(std::move(core)),
        logical_topk_indices_(std::move(logical_topk_indices)),
        torch_(is_torch_tensor(logical_topk_indices_)) {}
  virtual ~PyGroup() = default;
  PyGroup(const PyGroup&) = delete;
  PyGroup& operator=(const PyGroup&) = delete;

  const std::shared_ptr<GroupCore>& core() const { return core_; }
  SparseMLAIndexGroup& group() const { return *core_->group; }
  const std::shared_ptr<DeviceHandle>& device() const { return core_->device; }
  const py::object& logical_topk_indices() const { return logical_topk_indices_; }

  // A view of the group's memory, kept alive with the group.
  std::shared_ptr<PyTensor> view(const Tensor& t) const { return export_view(core_->device, t, core_); }

  // A conversion's results (a tensor or a tuple, conversion_result's) as the
  // group's caller takes them: for a group built on a torch logical top-k,
  // torch tensors; rows of the group's workspaces are narrowed from one torch
  // view of each workspace, the last narrowing kept, so that every layer of
  // a step gets the same tensor object at no cost.
  py::object hand_out(const py::object& result) const {
    if (!torch_) return result;
    if (py::isinstance<py::tuple>(result)) {
      const py::tuple in = py::reinterpret_borrow<py::tuple>(result);
      py::tuple out(in.size());
      for (std::size_t i = 0; i < in.size(); ++i) out[i] = hand_out(in[i]);
      return std::move(out);
    }
    if (!py::isinstance<PyTensor>(result)) return result;  // the caller's own buffer
    const Tensor& v = result.cast<const PyTensor&>().view();
    const Tensor workspaces[2] = {group().physical_workspace(), group().valid_counts_workspace()};
    for (int i = 0; i < 2; ++i) {
      if (rows_of(v, workspaces[i])) return workspace_rows(i, workspaces[i], v.dim(0));
    }
    return torch_from_dlpack(result);
  }
  // The group's whole workspace as its caller takes it (physical_topk_indices, valid_topk_counts).
  py::object workspace(int which) const {
    const Tensor w = which == 0 ? group().physical_workspace() : group().valid_counts_workspace();
    if (!torch_) return py::cast(view(w));
    return workspace_rows(which, w, w.dim(0));
  }
  std::shared_ptr<PyStream> stream(Stream& s) const { return std::make_shared<PyStream>(PyStream{core_->device, core_, &s}); }
  std::shared_ptr<PyEvent> event(Event& e) const { return std::make_shared<PyEvent>(PyEvent{core_->device, core_, &e}); }

 private:
  // Whether v is the first rows of w.
  static bool rows_of(const Tensor& v, const Tensor& w) {
    if (!w.defined() || v.data() != w.data() || v.dtype() != w.dtype() || v.rank() != w.rank()) return false;
    if (v.rank() == 0 || v.dim(0) > w.dim(0)) return false;
    for (int d = 0; d < v.rank(); ++d) {
      if ((d > 0 && v.dim(d) != w.dim(d)) || v.stride(d) != w.stride(d)) return false;
    }
    return true;
  }
  static py::object torch_from_dlpack(const py::object& tensor) {
    return py::module_::import("torch").attr("from_dlpack")(tensor);
  }
  py::object workspace_rows(int which, const Tensor& w, std::int64_t rows) const {
    TorchWorkspace& t = torch_workspaces_[which];
    if (t.whole.is_none()) t.whole = torch_from_dlpack(py::cast(view(w)));
    if (rows != t.rows) {
      t.narrowed = rows == w.dim(0) ? t.whole : t.whole.attr("narrow")(0, 0, rows);
      t.rows = rows;
    }
    return t.narrowed;
  }

  struct TorchWorkspace {
    py::object whole = py::none();
    std::int64_t rows = -1;
    py::object narrowed = py::none();
  };
  std::shared_ptr<GroupCore> core_;
  py::object logical_topk_indices_;
  bool torch_;
  mutable TorchWorkspace torch_workspaces_[2];
};

// sparse_mla.HiSparseMLAIndexGroup.
class PyHiSparseGroup final : public PyGroup {
 public:
  using PyGroup::PyGroup;
  HiSparseMLAIndexGroup& hisparse() const { return static_cast<HiSparseMLAIndexGroup&>(group()); }
};

// sparse_mla.HiSparseCacheHandle: one layer's caches of a HiSparse group.
struct PyHiSparseCache {
  std::shared_ptr<PyHiSparseGroup> group;
  int layer_index;
  HiSparseCacheHandle& cache() const { return group->hisparse().cache(layer_index); }
};

// ---- attn_metadata ----

// getattr(object, name, None), or object.get(name) for a dict.
py::object field(const py::handle& object, const char* name) {
  if (object.is_none()) return py::none();
  if (py::isinstance<py::dict>(object)) {
    const py::dict d = py::reinterpret_borrow<py::dict>(object);
    return d.contains(name) ? py::reinterpret_borrow<py::object>(d[name]) : py::object(py::none());
  }
  return py::getattr(object, name, py::none());
}

std::int64_t int_field(const py::handle& object, const char* name, std::int64_t none) {
  const py::object value = field(object, name);
  return value.is_none() ? none : value.cast<std::int64_t>();
}

// The step's metadata (the reference's attn_metadata) as BatchMetadata,
// with the tensors it views. Not movable: batch points into it.
struct BatchArgs {
  BatchArgs() = default;
  BatchArgs(const BatchArgs&) = delete;
  BatchArgs& operator=(const BatchArgs&) = delete;

  BatchMetadata batch;
  HiSparseBatch hisparse;
  std::vector<TensorArg> tensors;
  std::shared_ptr<PlanCore> plan;

  Tensor take(const py::handle& md, const char* attribute, const char* name, DeviceHandle& device, Stream& stream) {
    tensors.push_back(import_tensor(field(md, attribute), name, device, stream));
    return tensors.back().tensor;
  }
};

// attn_metadata's fields: req_id_per_token, block_table, block_size,
// query_start_loc, num_decodes, num_decode_tokens, num_prefills; HiSparse
// (on attn_metadata.hisparse when it has one, else on attn_metadata itself):
// request_state_indices, resident_block_table, resident_null_block,
// hot_block_table; the staging plan: attn_metadata.prefill.host_staging_plan
// (the reference's place) or attn_metadata.prefill_staging_plan.
void read_batch(const py::object& md, DeviceHandle& device, Stream& stream, BatchArgs& args) {
  if (md.is_none()) return;
  BatchMetadata& b = args.batch;
  b.req_id_per_token = args.take(md, "req_id_per_token", "attn_metadata.req_id_per_token", device, stream);
  b.block_table = args.take(md, "block_table", "attn_metadata.block_table", device, stream);
  b.block_size = static_cast<std::int32_t>(int_field(md, "block_size", 0));
  b.query_start_loc = args.take(md, "query_start_loc", "attn_metadata.query_start_loc", device, stream);
  b.num_decodes = int_field(md, "num_decodes", 0);
  b.num_decode_tokens = int_field(md, "num_decode_tokens", 0);
  b.num_prefills = int_field(md, "num_prefills", 0);
  py::object h = field(md, "hisparse");
  if (h.is_none()) h = md;
  if (!field(h, "request_state_indices").is_none()) {
    HiSparseBatch& hb = args.hisparse;
    hb.request_state_indices = args.take(h, "request_state_indices", "attn_metadata.request_state_indices", device, stream);
    hb.resident_block_table = args.take(h, "resident_block_table", "attn_metadata.resident_block_table", device, stream);
    hb.resident_null_block = static_cast<std::int32_t>(int_field(h, "resident_null_block", 0));
    hb.hot_block_table = args.take(h, "hot_block_table", "attn_metadata.hot_block_table", device, stream);
    b.hisparse = &hb;
  }
  py::object plan = field(md, "prefill_staging_plan");
  if (plan.is_none()) plan = field(field(md, "prefill"), "host_staging_plan");
  if (!plan.is_none()) {
    if (!py::isinstance<PlanCore>(plan)) {
      throw py::type_error("attn_metadata's staging plan must be a sparse_mla.HiSparsePrefillStagingPlan "
                           "(build_hisparse_prefill_staging_plan)");
    }
    args.plan = plan.cast<std::shared_ptr<PlanCore>>();
    b.prefill_staging_plan = &args.plan->plan;
  }
}

// ---- register_layer's configuration ----

// hisparse=dict(...) as a HiSparseConfig; state=dict(slot_rows=, lru=,
// hot_block_table=) gives engine-owned slot state, kept with the group.
HiSparseConfig hisparse_config(const py::dict& d, DeviceHandle& device, Stream& stream,
                               std::vector<std::shared_ptr<void>>& keep) {
  HiSparseConfig c;
  for (const auto& item : d) {
    const std::string key = py::str(item.first);
    const py::handle value = item.second;
    if (key == "top_k") c.top_k = value.cast<std::int32_t>();
    else if (key == "hot_slots") c.hot_slots = value.cast<std::int32_t>();
    else if (key == "host_pool_rows") c.host_pool_rows = value.cast<std::int64_t>();
    else if (key == "max_requests") c.max_requests = value.cast<std::int32_t>();
    else if (key == "max_tokens_per_request") c.max_tokens_per_request = value.cast<std::int64_t>();
    else if (key == "row_bytes") c.row_bytes = value.cast<std::int64_t>();
    else if (key == "block_size") c.block_size = value.cast<std::int32_t>();
    else if (key == "attention_block_stride") c.attention_block_stride = value.cast<std::int64_t>();
    else if (key == "max_rows_per_request") c.max_rows_per_request = value.cast<std::int32_t>();
    else if (key == "state") {
      const py::dict state = value.cast<py::dict>();
      for (const auto& s : state) {
        const std::string name = py::str(s.first);
        Tensor* target = name == "slot_rows" ? &c.state.slot_rows
                         : name == "lru"     ? &c.state.lru
                         : name == "hot_block_table" ? &c.state.hot_block_table
                                                     : nullptr;
        if (target == nullptr) {
          throw py::value_error("hisparse['state'] has no field '" + name + "' (slot_rows, lru, hot_block_table)");
        }
        const std::string arg = "hisparse['state']['" + name + "']";
        TensorArg t = import_tensor(s.second, arg.c_str(), device, stream);
        *target = t.tensor;
        keep.push_back(t.keep);
      }
    } else {
      throw py::value_error("hisparse has no field '" + key + "' (top_k, hot_slots, host_pool_rows, max_requests, "
                            "max_tokens_per_request, row_bytes, block_size, attention_block_stride, max_rows_per_request, state)");
    }
  }
  return c;
}

// hisparse_storage=dict(host_pool=, hot_cache=): the layer's caches in engine memory.
HiSparseLayerStorage layer_storage(const py::dict& d, DeviceHandle& device, Stream& stream,
                                   std::vector<std::shared_ptr<void>>& keep) {
  HiSparseLayerStorage storage;
  for (const auto& item : d) {
    const std::string key = py::str(item.first);
    Tensor* target = key == "host_pool" ? &storage.host_pool : key == "hot_cache" ? &storage.hot_cache : nullptr;
    if (target == nullptr) throw py::value_error("hisparse_storage has no field '" + key + "' (host_pool, hot_cache)");
    const std::string arg = "hisparse_storage['" + key + "']";
    TensorArg t = import_tensor(item.second, arg.c_str(), device, stream);
    *target = t.tensor;
    keep.push_back(t.keep);
  }
  return storage;
}

// ---- The builder ----

// sparse_mla.SparseMLAIndexGroupBuilder.
class PyBuilder {
 public:
  PyBuilder(const py::object& logical_topk_indices, const py::object& max_decode_rows, const py::object& device)
      : device_(call_device(device, py::none(), {logical_topk_indices})) {
    Stream& stream = device_->library_stream();
    logical_ = import_tensor(logical_topk_indices, "logical_topk_indices", *device_, stream);
    std::optional<std::int64_t> rows;
    if (!max_decode_rows.is_none()) rows = max_decode_rows.cast<std::int64_t>();
    builder_ = std::make_unique<SparseMLAIndexGroupBuilder>(device_->shared_device(), logical_.tensor, rows);
  }

  py::tuple register_layer(bool is_index_producing_layer, const py::object& head_size, const py::object& kv_cache_dtype,
                           const py::object& hisparse, const py::object& hisparse_storage) {
    Stream& stream = device_->library_stream();
    LayerConfig config;
    std::vector<std::shared_ptr<void>> keep;
    if (!head_size.is_none()) config.head_size = head_size.cast<std::int64_t>();
    if (!kv_cache_dtype.is_none()) config.kv_cache_dtype = py::str(kv_cache_dtype);
    if (!hisparse.is_none()) config.hisparse = hisparse_config(hisparse.cast<py::dict>(), *device_, stream, keep);
    if (!hisparse_storage.is_none()) {
      config.hisparse_storage = layer_storage(hisparse_storage.cast<py::dict>(), *device_, stream, keep);
    }
    LayerRegistration registration;
    try {
      registration = builder_->register_layer(is_index_producing_layer, config);
    } catch (...) {
      adopt(std::move(keep));  // a group made before the layer was refused may read them
      throw;
    }
    adopt(std::move(keep));
    return py::make_tuple(groups_.back(), registration.index_in_group);
  }

  const py::object& logical_topk_indices() const { return logical_.object; }
  std::int64_t max_decode_rows() const { return builder_->max_decode_rows(); }
  py::list groups() const {
    py::list list;
    for (const auto& g : groups_) list.append(g);
    return list;
  }
  py::object current_group() const { return groups_.empty() ? py::object(py::none()) : py::cast(groups_.back()); }
  void set_piecewise_capture(bool enabled) { builder_->set_piecewise_capture(enabled); }
  void set_dcp(const DcpConfig& dcp) { builder_->set_dcp(dcp); }
  const std::shared_ptr<DeviceHandle>& device() const { return device_; }

 private:
  // Wraps the groups the builder made since the last call, and gives the
  // newest one what the layer's configuration handed in.
  void adopt(std::vector<std::shared_ptr<void>> keep) {
    const auto& made = builder_->groups();
    while (groups_.size() < made.size()) {
      auto core = std::make_shared<GroupCore>();
      core->device = device_;
      core->keep.push_back(logical_.keep);
      core->group = made[groups_.size()];
      if (dynamic_cast<HiSparseMLAIndexGroup*>(core->group.get()) != nullptr) {
        groups_.push_back(std::make_shared<PyHiSparseGroup>(core, logical_.object));
      } else {
        groups_.push_back(std::make_shared<PyGroup>(core, logical_.object));
      }
    }
    if (!groups_.empty()) {
      auto& kept = groups_.back()->core()->keep;
      kept.insert(kept.end(), keep.begin(), keep.end());
    }
  }

  std::shared_ptr<DeviceHandle> device_;
  TensorArg logical_;
  std::unique_ptr<SparseMLAIndexGroupBuilder> builder_;
  std::vector<std::shared_ptr<PyGroup>> groups_;
};

DcpConfig dcp_config(std::int32_t size, std::int32_t rank, std::int32_t interleave, bool compact) {
  return DcpConfig{size, rank, interleave, compact};
}

// ---- Per-step methods ----

void set_logical_topk_ready(const PyGroup& g, int layer_index, const py::object& stream) {
  const CallStream call = resolve_stream(g.device(), stream);
  g.group().set_logical_topk_ready(layer_index, call.get());
  call.finish();
}

void prepare_for_batch(const PyGroup& g, int layer_index, const py::object& attn_metadata, const py::object& stream) {
  const CallStream call = resolve_stream(g.device(), stream);
  BatchArgs args;
  if (g.group().prepare_reads_batch(layer_index)) read_batch(attn_metadata, *g.device(), call.get(), args);
  g.group().prepare_for_batch(layer_index, args.batch, call.get());
  call.finish();
}

py::object convert_logical_to_physical_topk(const PyGroup& g, int layer_index, const py::object& logical_topk_indices,
                                            const py::object& attn_metadata, const py::object& block_stride_rows,
                                            bool return_valid_counts, const py::object& out,
                                            const py::object& valid_counts_out, const py::object& stream) {
  const CallStream call = resolve_stream(g.device(), stream);
  Stream& s = call.get();
  DeviceHandle& dev = *g.device();
  const TensorArg logical = import_tensor(logical_topk_indices, "logical_topk_indices", dev, s);
  const TensorArg o = import_tensor(out, "out", dev, s);
  const TensorArg vo = import_tensor(valid_counts_out, "valid_counts_out", dev, s);
  BatchArgs args;
  // A logical top-k of another rank is refused by the library, batch or not.
  const std::int64_t rows = logical.tensor.rank() == 2 ? logical.tensor.dim(0) : 0;
  if (g.group().convert_reads_batch(layer_index, rows)) read_batch(attn_metadata, dev, s, args);
  const std::int64_t stride = block_stride_rows.is_none() ? 0 : block_stride_rows.cast<std::int64_t>();
  TopkConversion conversion = g.group().convert_logical_to_physical_topk(layer_index, s, logical.tensor, args.batch, stride,
                                                                         return_valid_counts, o.tensor, vo.tensor);
  call.finish();
  return g.hand_out(conversion_result(g.device(), std::move(conversion), o, vo, return_valid_counts, g.core(), call));
}

py::object gather_fp8_prefill(const PyGroup& g, int layer_index, const py::object& source_cache, const py::object& dst,
                              const py::object& block_table, const py::object& workspace_starts, std::int64_t batch_size,
                              const py::object& attn_metadata, std::int64_t request_start, const std::string& fp8_format,
                              const py::object& stream) {
  Fp8Format format;
  if (!parse_fp8_format(fp8_format, format)) fail("gather_fp8_prefill", "unknown fp8_format '", fp8_format, "' (e4m3fn, e4m3fnuz)");
  const CallStream call = resolve_stream(g.device(), stream);
  Stream& s = call.get();
  DeviceHandle& dev = *g.device();
  const TensorArg src = import_tensor(source_cache, "source_cache", dev, s);
  const TensorArg out = import_tensor(dst, "dst", dev, s);
  const TensorArg table = import_tensor(block_table, "block_table", dev, s);
  const TensorArg starts = import_tensor(workspace_starts, "workspace_starts", dev, s);
  BatchArgs args;
  read_batch(attn_metadata, dev, s, args);
  Event* ready = g.group().gather_fp8_prefill(layer_index, s, src.tensor, out.tensor, table.tensor, starts.tensor,
                                              batch_size, args.batch, request_start, format);
  call.finish();
  if (ready == nullptr) return py::none();
  if (call.implicit && dev.backend() == Backend::host) {  // the NumPy rule: results are there on return
    py::gil_scoped_release release;
    ready->synchronize();
  }
  return py::cast(g.event(*ready));
}

py::dict counts_dict(const ConversionCounts& c) {
  py::dict d;
  d["decode"] = c.decode;
  d["prefill"] = c.prefill;
  return d;
}

// ---- HiSparse ----

void write_rows(const PyHiSparseGroup& g, int layer_index, const py::object& rows, const py::object& host_row_ids,
                const py::object& stream) {
  const CallStream call = resolve_stream(g.device(), stream);
  const TensorArg r = import_tensor(rows, "rows", *g.device(), call.get());
  const TensorArg ids = import_tensor(host_row_ids, "host_row_ids", *g.device(), call.get());
  g.hisparse().write_rows(layer_index, call.get(), r.tensor, ids.tensor);
  call.finish();
}

void invalidate_rows(const PyHiSparseGroup& g, const py::object& host_row_ids, const py::object& state_rows,
                     const py::object& stream) {
  const CallStream call = resolve_stream(g.device(), stream);
  const TensorArg ids = import_tensor(host_row_ids, "host_row_ids", *g.device(), call.get());
  const TensorArg states = import_tensor(state_rows, "state_rows", *g.device(), call.get());
  g.hisparse().invalidate_rows(call.get(), ids.tensor, states.tensor);
  call.finish();
}

void snapshot_counters(const PyHiSparseGroup& g, const py::object& out, const py::object& stream) {
  const CallStream call = resolve_stream(g.device(), stream);
  const TensorArg o = import_tensor(out, "out", *g.device(), call.get());
  g.hisparse().snapshot_counters(call.get(), o.tensor);
  call.finish();
}

py::dict counters(const PyHiSparseGroup& g) {
  HiSparseCounters c;
  {
    py::gil_scoped_release release;  // waits for the side stream
    c = g.hisparse().counters();
  }
  py::dict d;
  d["hits"] = c.hits;
  d["misses"] = c.misses;
  d["bytes_moved"] = c.bytes_moved;
  return d;
}

py::object stage_prefill_rows(const std::shared_ptr<PyHiSparseGroup>& g, int layer_index, const std::shared_ptr<PlanCore>& plan,
                              const py::object& resident_cache, const py::object& out, const py::object& stream) {
  const CallStream call = resolve_stream(g->device(), stream);
  const TensorArg resident = import_tensor(resident_cache, "resident_cache", *g->device(), call.get());
  const TensorArg o = import_tensor(out, "out", *g->device(), call.get());
  if (o.defined()) {
    g->hisparse().stage_prefill_rows(layer_index, call.get(), plan->plan, resident.tensor, o.tensor);
    call.finish();
    return o.object;
  }
  OwnedTensor staged = g->hisparse().stage_prefill_rows(layer_index, call.get(), plan->plan, resident.tensor);
  call.finish();
  return py::cast(export_owned(g->device(), std::move(staged), call.ref));
}

py::dict footprint(const PyHiSparseGroup& g) {
  const HiSparseFootprint f = g.hisparse().footprint();
  py::dict d;
  d["host_bytes"] = f.host_bytes;
  d["device_bytes"] = f.device_bytes;
  return d;
}

}  // namespace

void register_groups(py::module_& m) {
  py::class_<PyBuilder>(m, "SparseMLAIndexGroupBuilder", R"(Assigns sparse MLA layers to their index-producing
layer (SPEC section 4): a new group at every index-producing layer.)")
      .def(py::init<const py::object&, const py::object&, const py::object&>(), py::arg("logical_topk_indices"),
           py::arg("max_decode_rows") = py::none(), py::kw_only(), py::arg("device") = py::none(),
           R"(logical_topk_indices: int32 [max_tokens, K], the buffer the indexer writes (kept alive by the groups).
max_decode_rows None means max_tokens. device None: the buffer's (CPU memory: the host device).)")
      .def("register_layer", &PyBuilder::register_layer, py::arg("is_index_producing_layer"), py::kw_only(),
           py::arg("head_size") = py::none(), py::arg("kv_cache_dtype") = py::none(), py::arg("hisparse") = py::none(),
           py::arg("hisparse_storage") = py::none(),
           R"(Returns (group, layer_index). hisparse=dict(HiSparseConfig fields: top_k, hot_slots, host_pool_rows,
max_requests, max_tokens_per_request, row_bytes, block_size, attention_block_stride, max_rows_per_request,
state=dict(slot_rows, lru, hot_block_table)) makes the builder create HiSparse groups; hisparse_storage=dict(host_pool, hot_cache) binds the
layer's caches to engine memory.)")
      .def_property_readonly("logical_topk_indices", &PyBuilder::logical_topk_indices)
      .def_property_readonly("max_decode_rows", &PyBuilder::max_decode_rows)
      .def_property_readonly("groups", &PyBuilder::groups)
      .def_property_readonly("current_group", &PyBuilder::current_group)
      .def_property_readonly("device", &PyBuilder::device)
      .def("set_piecewise_capture", &PyBuilder::set_piecewise_capture, py::arg("enabled"))
      .def("set_dcp", [](PyBuilder& b, std::int32_t size, std::int32_t rank, std::int32_t interleave, bool compact) {
        b.set_dcp(dcp_config(size, rank, interleave, compact));
      }, py::kw_only(), py::arg("dcp_size") = 1, py::arg("dcp_rank") = 0, py::arg("dcp_interleave") = 1,
           py::arg("compact") = true);

  py::class_<PyGroup, std::shared_ptr<PyGroup>>(m, "SparseMLAIndexGroup", "Layers that consume one sparse-indexer result.")
      .def("set_logical_topk_ready", &set_logical_topk_ready, py::arg("layer_index"), py::arg("stream") = py::none())
      .def("prepare_for_batch", &prepare_for_batch, py::arg("layer_index"), py::arg("attn_metadata"),
           py::arg("stream") = py::none())
      .def("convert_logical_to_physical_topk", &convert_logical_to_physical_topk, py::arg("layer_index"),
           py::arg("logical_topk_indices"), py::arg("attn_metadata"), py::kw_only(),
           py::arg("block_stride_rows") = py::none(), py::arg("return_valid_counts") = false,
           py::arg("out") = py::none(), py::arg("valid_counts_out") = py::none(), py::arg("stream") = py::none(),
           R"(Converts one index result once for all layers of the group. Decode-sized: views of the group's
workspace rows (the leader converts on the side stream; every layer's stream waits). Prefill-sized: into
out / valid_counts_out when given (returned), else new buffers. Returns physical, or (physical, valid_counts).)")
      .def("gather_fp8_prefill", &gather_fp8_prefill, py::arg("layer_index"), py::arg("source_cache"), py::arg("dst"),
           py::arg("block_table"), py::arg("workspace_starts"), py::arg("batch_size"),
           py::arg("attn_metadata") = py::none(), py::arg("request_start") = 0, py::kw_only(),
           py::arg("fp8_format") = "e4m3fn", py::arg("stream") = py::none(),
           "The FP8 gather-upconvert. Plain groups: on the stream, returns None. HiSparse: returns the layer's prefill-ready Event.")
      .def("set_dcp", [](const PyGroup& g, std::int32_t size, std::int32_t rank, std::int32_t interleave, bool compact) {
        g.group().set_dcp(dcp_config(size, rank, interleave, compact));
      }, py::kw_only(), py::arg("dcp_size") = 1, py::arg("dcp_rank") = 0, py::arg("dcp_interleave") = 1,
           py::arg("compact") = true)
      .def_property("piecewise_capture", [](const PyGroup& g) { return g.group().piecewise_capture(); },
                    [](const PyGroup& g, bool enabled) { g.group().set_piecewise_capture(enabled); })
      .def_property_readonly("has_indexer", [](const PyGroup& g) { return g.group().has_indexer(); })
      .def_property_readonly("num_layers", [](const PyGroup& g) { return g.group().num_layers(); })
      .def_property_readonly("top_k", [](const PyGroup& g) { return g.group().top_k(); })
      .def_property_readonly("max_decode_rows", [](const PyGroup& g) { return g.group().max_decode_rows(); })
      .def_property_readonly("conversion_counts", [](const PyGroup& g) { return counts_dict(g.group().conversion_counts()); })
      .def_property_readonly("device", [](const PyGroup& g) { return g.device(); })
      .def_property_readonly("logical_topk_indices", &PyGroup::logical_topk_indices)
      .def_property_readonly("physical_topk_indices", [](const PyGroup& g) { return g.workspace(0); })
      .def_property_readonly("valid_topk_counts", [](const PyGroup& g) { return g.workspace(1); })
      .def_property_readonly("side_stream", [](const PyGroup& g) { return g.stream(g.group().side_stream()); })
      .def_property_readonly("logical_topk_ready", [](const PyGroup& g) { return g.event(g.group().logical_topk_ready()); })
      .def_property_readonly("physical_topk_ready", [](const PyGroup& g) { return g.event(g.group().physical_topk_ready()); });

  py::class_<PyHiSparseGroup, PyGroup, std::shared_ptr<PyHiSparseGroup>>(
      m, "HiSparseMLAIndexGroup", "Sparse index group with per-layer host-backed KV caches (SPEC section 5).")
      .def("cache", [](const std::shared_ptr<PyHiSparseGroup>& g, int layer_index) {
        g->hisparse().cache(layer_index);  // refuses an unknown layer
        return PyHiSparseCache{g, layer_index};
      }, py::arg("layer_index"))
      .def_property_readonly("caches", [](const std::shared_ptr<PyHiSparseGroup>& g) {
        std::vector<PyHiSparseCache> caches;
        for (int i = 0; i < g->group().num_layers(); ++i) caches.push_back(PyHiSparseCache{g, i});
        return caches;
      })
      .def("physical_kv_cache", [](const PyHiSparseGroup& g, int layer_index) {
        return g.view(g.hisparse().cache(layer_index).attention_cache());
      }, py::arg("layer_index"), "The layer's hot cache as attention reads it (uint8 [rows, row_bytes]).")
      .def("write_rows", &write_rows, py::arg("layer_index"), py::arg("rows"), py::arg("host_row_ids"), py::kw_only(),
           py::arg("stream") = py::none(), "Host mirror: rows written this step become host rows of the layer's pool.")
      .def("invalidate_rows", &invalidate_rows, py::arg("host_row_ids"), py::arg("state_rows"), py::kw_only(),
           py::arg("stream") = py::none())
      .def("stage_prefill_rows", &stage_prefill_rows, py::arg("layer_index"), py::arg("plan"),
           py::arg("resident_cache") = py::none(), py::kw_only(), py::arg("out") = py::none(),
           py::arg("stream") = py::none())
      .def("counters", &counters, "Hits, misses and bytes moved (waits for the side stream: not for the step path).")
      .def("snapshot_counters", &snapshot_counters, py::arg("out"), py::arg("stream") = py::none(),
           "Queues a copy of {hits, misses} into out (int64 [2]): the step path's form.")
      .def_property_readonly("bytes_per_miss", [](const PyHiSparseGroup& g) { return g.hisparse().bytes_per_miss(); })
      .def_property_readonly("footprint", &footprint)
      .def_property_readonly("resolves", [](const PyHiSparseGroup& g) { return g.hisparse().resolves(); })
      .def_property_readonly("gathers", [](const PyHiSparseGroup& g) { return g.hisparse().gathers(); })
      .def_property_readonly("prefill_stream", [](const PyHiSparseGroup& g) { return g.stream(g.hisparse().prefill_stream()); })
      .def_property_readonly("prefill_ready_events", [](const PyHiSparseGroup& g) {
        std::vector<std::shared_ptr<PyEvent>> events;
        for (int i = 0; i < g.group().num_layers(); ++i) events.push_back(g.event(g.hisparse().cache(i).prefill_ready()));
        return events;
      })
      .def_property_readonly("slot_rows", [](const PyHiSparseGroup& g) { return g.view(g.hisparse().slot_rows()); })
      .def_property_readonly("lru", [](const PyHiSparseGroup& g) { return g.view(g.hisparse().lru()); })
      .def_property_readonly("hot_block_table", [](const PyHiSparseGroup& g) { return g.view(g.hisparse().hot_block_table()); })
      .def_property_readonly("hot_indices", [](const PyHiSparseGroup& g) { return g.view(g.hisparse().hot_indices()); })
      .def_property_readonly("miss_mask", [](const PyHiSparseGroup& g) { return g.view(g.hisparse().miss_mask()); })
      .def_property_readonly("swap_host_rows", [](const PyHiSparseGroup& g) { return g.view(g.hisparse().swap_host_rows()); })
      .def_property_readonly("swap_device_rows", [](const PyHiSparseGroup& g) { return g.view(g.hisparse().swap_device_rows()); })
      .def_property_readonly("swap_counts", [](const PyHiSparseGroup& g) { return g.view(g.hisparse().swap_counts()); });

  py::class_<PyHiSparseCache>(m, "HiSparseCacheHandle", "One layer's caches of a HiSparse group.")
      .def_property_readonly("row_bytes", [](const PyHiSparseCache& c) { return c.cache().row_bytes(); })
      .def_property_readonly("engine_owned", [](const PyHiSparseCache& c) { return c.cache().engine_owned(); })
      .def_property_readonly("host_pool", [](const PyHiSparseCache& c) { return c.group->view(c.cache().host_pool()); })
      .def_property_readonly("hot_cache", [](const PyHiSparseCache& c) { return c.group->view(c.cache().hot_cache()); })
      .def_property_readonly("attention_cache", [](const PyHiSparseCache& c) { return c.group->view(c.cache().attention_cache()); })
      .def_property_readonly("ready", [](const PyHiSparseCache& c) { return c.group->event(c.cache().ready()); })
      .def_property_readonly("prefill_ready", [](const PyHiSparseCache& c) { return c.group->event(c.cache().prefill_ready()); });
}

}  // namespace sparse_mla::python
