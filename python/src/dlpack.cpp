// DLPack in both directions (dlpack.hpp): engine tensors in, zero-copy, as
// views the library's own checks judge; the library's tensors out as
// sparse_mla.Tensor objects that torch.from_dlpack / numpy.from_dlpack take
// without a copy.
#include "dlpack.hpp"

#include <pybind11/stl.h>

#include <cstring>
#include <sstream>
#include <vector>

#include "sparse_mla/error.hpp"

namespace sparse_mla::python {

const char* dtype_python_name(DType dtype) {
  switch (dtype) {
    case DType::i32: return "int32";
    case DType::i16: return "int16";
    case DType::u8: return "uint8";
    case DType::bf16: return "bfloat16";
    case DType::f32: return "float32";
    case DType::i64: return "int64";
  }
  return "?";
}

DType parse_dtype_name(const std::string& name) {
  for (DType d : {DType::i32, DType::i16, DType::u8, DType::bf16, DType::f32, DType::i64}) {
    if (name == dtype_python_name(d) || name == dtype_name(d)) return d;
  }
  throw py::type_error("unknown dtype '" + name + "' (int32, int16, uint8, bfloat16, float32, int64)");
}

namespace {

constexpr const char* capsule_name = "dltensor";
constexpr const char* used_capsule_name = "used_dltensor";
constexpr const char* versioned_capsule_name = "dltensor_versioned";
constexpr const char* used_versioned_capsule_name = "used_dltensor_versioned";

dl::DLDataType dlpack_dtype(DType dtype) {
  switch (dtype) {
    case DType::i32: return {dl::kDLInt, 32, 1};
    case DType::i16: return {dl::kDLInt, 16, 1};
    case DType::u8: return {dl::kDLUInt, 8, 1};
    case DType::bf16: return {dl::kDLBfloat, 16, 1};
    case DType::f32: return {dl::kDLFloat, 32, 1};
    case DType::i64: return {dl::kDLInt, 64, 1};
  }
  return {dl::kDLUInt, 8, 1};
}

bool dtype_from_dlpack(dl::DLDataType t, DType& out) {
  if (t.lanes != 1) return false;
  for (DType d : {DType::i32, DType::i16, DType::u8, DType::bf16, DType::f32, DType::i64}) {
    const dl::DLDataType e = dlpack_dtype(d);
    if (e.code == t.code && e.bits == t.bits) {
      out = d;
      return true;
    }
  }
  return false;
}

// "float64", "uint16", "int8x4": a DLPack dtype as errors name it.
std::string dlpack_dtype_string(dl::DLDataType t) {
  static const char* const codes[] = {"int", "uint", "float", "opaque", "bfloat", "complex", "bool"};
  std::ostringstream out;
  out << (t.code < 7 ? codes[t.code] : "code") << static_cast<int>(t.bits);
  if (t.lanes != 1) out << 'x' << t.lanes;
  return out.str();
}

// The memory kind and device a DLPack device's memory has for a call on
// `device` (dlpack.hpp); `owner` stays null for memory of another device.
void place(dl::DLDevice where, const DeviceHandle& device, MemoryKind& kind, const Device*& owner) {
  const Backend backend = device.backend();
  owner = nullptr;
  switch (where.device_type) {
    case dl::kDLCPU:
      kind = MemoryKind::host;
      owner = &device.device();
      return;
    case dl::kDLCUDAHost:  // torch on ROCm says kDLCUDAHost for its pinned memory too
    case dl::kDLROCMHost:
      kind = MemoryKind::pinned_host;
      owner = &device.device();
      return;
    case dl::kDLCUDA:
    case dl::kDLCUDAManaged:
      kind = MemoryKind::device;
      if (backend == Backend::cuda && where.device_id == device.index()) owner = &device.device();
      return;
    case dl::kDLROCM:
      kind = MemoryKind::device;
      if (backend == Backend::hip && where.device_id == device.index()) owner = &device.device();
      return;
    default:
      kind = MemoryKind::device;
      return;
  }
}

// Whether memory of DLPack device `where` is the GPU memory of `device`
// (then the producer is told the call's stream).
bool on_gpu_of(dl::DLDevice where, const DeviceHandle& device) {
  if (where.device_id != device.index()) return false;
  if (device.backend() == Backend::cuda) return where.device_type == dl::kDLCUDA || where.device_type == dl::kDLCUDAManaged;
  if (device.backend() == Backend::hip) return where.device_type == dl::kDLROCM;
  return false;
}

dl::DLDevice dlpack_device_of(const DeviceHandle& device, MemoryKind kind) {
  if (device.backend() == Backend::host || kind == MemoryKind::host) return {dl::kDLCPU, 0};
  const bool cuda = device.backend() == Backend::cuda;
  if (kind == MemoryKind::pinned_host) return {cuda ? dl::kDLCUDAHost : dl::kDLROCMHost, 0};
  return {cuda ? dl::kDLCUDA : dl::kDLROCM, device.index()};
}

std::vector<std::int64_t> shape_of(const Tensor& t) {
  std::vector<std::int64_t> shape(static_cast<std::size_t>(t.rank()));
  for (int i = 0; i < t.rank(); ++i) shape[static_cast<std::size_t>(i)] = t.dim(i);
  return shape;
}

std::vector<std::int64_t> strides_of(const Tensor& t) {
  std::vector<std::int64_t> strides(static_cast<std::size_t>(t.rank()));
  for (int i = 0; i < t.rank(); ++i) strides[static_cast<std::size_t>(i)] = t.stride(i);
  return strides;
}

// A consumed DLPack tensor (legacy or versioned); its producer's deleter runs
// when the last argument or view that uses it goes away.
class ImportedTensor {
 public:
  explicit ImportedTensor(dl::DLManagedTensor* managed) : legacy_(managed) {}
  explicit ImportedTensor(dl::DLManagedTensorVersioned* managed) : versioned_(managed) {}
  ImportedTensor(const ImportedTensor&) = delete;
  ImportedTensor& operator=(const ImportedTensor&) = delete;
  ~ImportedTensor() {
    // NumPy's and CuPy's deleters release Python objects; at interpreter
    // shutdown the tensor is left to the process's end instead.
    if (!Py_IsInitialized()) return;
    py::gil_scoped_acquire gil;
    if (legacy_ != nullptr && legacy_->deleter != nullptr) legacy_->deleter(legacy_);
    if (versioned_ != nullptr && versioned_->deleter != nullptr) versioned_->deleter(versioned_);
  }
  const dl::DLTensor& tensor() const { return legacy_ != nullptr ? legacy_->dl_tensor : versioned_->dl_tensor; }

 private:
  dl::DLManagedTensor* legacy_ = nullptr;
  dl::DLManagedTensorVersioned* versioned_ = nullptr;
};

// What a producer's capsule describes, once consumed.
struct Consumed {
  std::shared_ptr<ImportedTensor> imported;
  void* data = nullptr;
  dl::DLDataType dtype{};
  dl::DLDevice device{};
  std::vector<std::int64_t> shape, strides;
};

dl::DLDevice dlpack_device_of_object(const py::handle& object, const char* name) {
  if (!py::hasattr(object, "__dlpack__") || !py::hasattr(object, "__dlpack_device__")) {
    throw py::type_error(std::string(name) + " is a " + std::string(py::str(py::type::handle_of(object).attr("__name__"))) +
                         ", not a tensor: it has no __dlpack__ and __dlpack_device__ (pass a torch tensor, a NumPy "
                         "array, a CuPy array or a sparse_mla.Tensor)");
  }
  const py::tuple where = object.attr("__dlpack_device__")();
  if (where.size() != 2) throw py::type_error(std::string(name) + ".__dlpack_device__() did not return (device_type, device_id)");
  return dl::DLDevice{where[0].cast<std::int32_t>(), where[1].cast<std::int32_t>()};
}

// Calls the producer's __dlpack__ (with `stream` when given) and takes
// ownership of the DLPack tensor: the capsule is renamed "used_dltensor"
// (python_spec.html), so that its destructor leaves the tensor to us.
// `object` has passed dlpack_device_of_object, which answered `*where`
// (nullptr: the capsule's device is taken as it is).
Consumed consume_capsule(const py::object& capsule, const char* name, const dl::DLDevice* where) {
  Consumed c;
  PyObject* cap = capsule.ptr();
  if (PyCapsule_IsValid(cap, capsule_name)) {
    auto* managed = static_cast<dl::DLManagedTensor*>(PyCapsule_GetPointer(cap, capsule_name));
    c.imported = std::make_shared<ImportedTensor>(managed);
    PyCapsule_SetName(cap, used_capsule_name);
  } else if (PyCapsule_IsValid(cap, versioned_capsule_name)) {
    auto* managed = static_cast<dl::DLManagedTensorVersioned*>(PyCapsule_GetPointer(cap, versioned_capsule_name));
    if (managed->version.major != 1) {
      throw py::type_error(std::string(name) + ": DLPack " + std::to_string(managed->version.major) +
                           ".x tensors are not understood (DLPack 1.x and the unversioned 0.x are)");
    }
    c.imported = std::make_shared<ImportedTensor>(managed);
    PyCapsule_SetName(cap, used_versioned_capsule_name);
  } else {
    throw py::type_error(std::string(name) + ".__dlpack__() returned no unconsumed DLPack capsule");
  }
  const dl::DLTensor& t = c.imported->tensor();
  c.data = static_cast<char*>(t.data) + t.byte_offset;
  c.dtype = t.dtype;
  c.device = t.device;
  // torch says pinned memory is kDLCUDAHost in __dlpack_device__ but kDLCPU
  // in the capsule: the more specific of the two is the memory's kind.
  const bool pinned = where != nullptr && (where->device_type == dl::kDLCUDAHost || where->device_type == dl::kDLROCMHost);
  if (pinned && t.device.device_type == dl::kDLCPU) c.device = *where;
  const auto rank = static_cast<std::size_t>(t.ndim < 0 ? 0 : t.ndim);
  c.shape.assign(t.shape, t.shape + rank);
  if (t.strides != nullptr) {
    c.strides.assign(t.strides, t.strides + rank);
    // A dimension of size 1 is never stepped over, so producers write any
    // stride there (torch exports [1, K] with strides (1, 1)): it becomes the
    // row-major one, which the library's layout checks expect.
    for (std::size_t i = rank; i-- > 0;) {
      if (c.shape[i] == 1) c.strides[i] = i + 1 < rank ? c.strides[i + 1] * c.shape[i + 1] : 1;
    }
  } else {  // compact row-major (DLPack 0.8: null strides)
    c.strides.assign(rank, 1);
    for (std::size_t i = rank; i-- > 1;) c.strides[i - 1] = c.strides[i] * c.shape[i];
  }
  return c;
}

Consumed consume(const py::handle& object, const char* name, const dl::DLDevice* where, const py::object& stream) {
  const py::object capsule = stream.is_none() ? object.attr("__dlpack__")() : object.attr("__dlpack__")(py::arg("stream") = stream);
  return consume_capsule(capsule, name, where);
}

// The view `c` describes, as a Tensor of `dtype`; the library's own messages
// for what a Tensor cannot be (rank 0 or above 4, negative strides), naming
// the argument.
Tensor view_of(const char* name, void* data, DType dtype, const std::vector<std::int64_t>& shape,
               const std::vector<std::int64_t>& strides, MemoryKind kind, const Device* owner) {
  try {
    return Tensor(data, dtype, shape, strides, kind, owner);
  } catch (const Error& e) {
    fail(name, e.what());
  }
}

DType dtype_or_type_error(dl::DLDataType t, const char* name) {
  DType dtype;
  if (!dtype_from_dlpack(t, dtype)) {
    throw py::type_error(std::string(name) + " has dtype " + dlpack_dtype_string(t) +
                         ", which no sparse_mla operation takes (int32, int16, uint8, bfloat16, float32, int64; "
                         "bf16 data held as uint16 or int16: pass sparse_mla.from_dlpack(x, dtype='bfloat16'))");
  }
  return dtype;
}

// ---- Export ----

// What an exported capsule's DLPack tensor points into: the memory's keeper
// and the shape and strides arrays the DLTensor points at.
struct ExportContext {
  std::shared_ptr<void> keep;
  std::vector<std::int64_t> shape, strides;
};

void fill_dltensor(dl::DLTensor& t, const Tensor& view, dl::DLDevice device, ExportContext& context) {
  t.data = view.data();
  t.device = device;
  t.ndim = view.rank();
  t.dtype = dlpack_dtype(view.dtype());
  t.shape = context.shape.data();
  t.strides = context.strides.data();
  t.byte_offset = 0;
}

void delete_legacy(dl::DLManagedTensor* self) {
  delete static_cast<ExportContext*>(self->manager_ctx);
  delete self;
}

void delete_versioned(dl::DLManagedTensorVersioned* self) {
  delete static_cast<ExportContext*>(self->manager_ctx);
  delete self;
}

// A capsule nobody consumed deletes its tensor (python_spec.html), keeping
// any Python error that is being raised.
void legacy_capsule_destructor(PyObject* capsule) {
  if (!PyCapsule_IsValid(capsule, capsule_name)) return;
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
  auto* managed = static_cast<dl::DLManagedTensor*>(PyCapsule_GetPointer(capsule, capsule_name));
  if (managed != nullptr && managed->deleter != nullptr) managed->deleter(managed);
  PyErr_Restore(type, value, traceback);
}

void versioned_capsule_destructor(PyObject* capsule) {
  if (!PyCapsule_IsValid(capsule, versioned_capsule_name)) return;
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
  auto* managed = static_cast<dl::DLManagedTensorVersioned*>(PyCapsule_GetPointer(capsule, versioned_capsule_name));
  if (managed != nullptr && managed->deleter != nullptr) managed->deleter(managed);
  PyErr_Restore(type, value, traceback);
}

// The native stream a DLPack consumer names (python_spec.html): CUDA 1 is
// the legacy default stream, 2 the per-thread default one; ROCm 0 is the
// default stream; other values are the handle itself.
void* consumer_stream_handle(std::intptr_t value, Backend backend) {
  if (backend == Backend::cuda && value == 1) return nullptr;
  if (backend == Backend::hip && value == 0) return nullptr;
  return reinterpret_cast<void*>(value);
}

}  // namespace

PyTensor::PyTensor(std::shared_ptr<DeviceHandle> device, const Tensor& view, dl::DLDevice dl_device,
                   std::shared_ptr<void> keep, std::shared_ptr<PyStream> producer)
    : device_(std::move(device)), view_(view), dl_device_(dl_device), keep_(std::move(keep)), producer_(std::move(producer)) {}

py::object PyTensor::dlpack(const py::object& stream, const py::object& max_version, const py::object& dl_device,
                            const py::object& copy) {
  if (!copy.is_none() && copy.cast<bool>()) throw py::buffer_error("sparse_mla.Tensor.__dlpack__: copy=True is not supported (views only)");
  if (!dl_device.is_none()) {
    const py::tuple asked = dl_device;
    if (asked.size() != 2 || asked[0].cast<std::int32_t>() != dl_device_.device_type ||
        asked[1].cast<std::int32_t>() != dl_device_.device_id) {
      throw py::buffer_error("sparse_mla.Tensor.__dlpack__: the tensor lives on another device than dl_device asks for");
    }
  }
  // A GPU consumer's stream waits for the stream whose work writes the view.
  const bool gpu = device_ && device_->backend() != Backend::host && view_.kind() == MemoryKind::device;
  if (gpu && producer_ && !stream.is_none()) {
    const auto value = stream.cast<std::intptr_t>();
    void* native = consumer_stream_handle(value, device_->backend());
    if (value != -1 && native != producer_->stream->native_handle()) {
      const std::shared_ptr<Stream>& consumer = device_->wrapped_stream(native);
      const std::unique_ptr<Event> written = device_->device().create_event();
      written->record(*producer_->stream);
      consumer->wait(*written);
    }
  }
  auto* context = new ExportContext{keep_, shape_of(view_), strides_of(view_)};
  const bool versioned = !max_version.is_none() && py::tuple(max_version).size() >= 1 &&
                         py::tuple(max_version)[0].cast<int>() >= 1;
  if (versioned) {
    auto* managed = new dl::DLManagedTensorVersioned{};
    managed->version = {1, 0};
    managed->manager_ctx = context;
    managed->deleter = delete_versioned;
    managed->flags = 0;
    fill_dltensor(managed->dl_tensor, view_, dl_device_, *context);
    PyObject* capsule = PyCapsule_New(managed, versioned_capsule_name, versioned_capsule_destructor);
    if (capsule == nullptr) {
      delete_versioned(managed);
      throw py::error_already_set();
    }
    return py::reinterpret_steal<py::object>(capsule);
  }
  auto* managed = new dl::DLManagedTensor{};
  managed->manager_ctx = context;
  managed->deleter = delete_legacy;
  fill_dltensor(managed->dl_tensor, view_, dl_device_, *context);
  PyObject* capsule = PyCapsule_New(managed, capsule_name, legacy_capsule_destructor);
  if (capsule == nullptr) {
    delete_legacy(managed);
    throw py::error_already_set();
  }
  return py::reinterpret_steal<py::object>(capsule);
}

py::tuple PyTensor::dlpack_device() const { return py::make_tuple(dl_device_.device_type, dl_device_.device_id); }

std::shared_ptr<PyTensor> export_view(const std::shared_ptr<DeviceHandle>& device, const Tensor& view,
                                      std::shared_ptr<void> keep, std::shared_ptr<PyStream> producer) {
  return std::make_shared<PyTensor>(device, view, dlpack_device_of(*device, view.kind()), std::move(keep),
                                    std::move(producer));
}

namespace {
// A library allocation and the device it frees through, in that order of
// destruction.
struct OwnedStorage {
  std::shared_ptr<DeviceHandle> device;
  OwnedTensor owned;
};
}  // namespace

std::shared_ptr<PyTensor> export_owned(const std::shared_ptr<DeviceHandle>& device, OwnedTensor owned,
                                       std::shared_ptr<PyStream> producer) {
  auto storage = std::make_shared<OwnedStorage>(OwnedStorage{device, std::move(owned)});
  const Tensor view = storage->owned.tensor();
  return export_view(device, view, storage, std::move(producer));
}

py::object result_object(const std::shared_ptr<DeviceHandle>& device, const Tensor& view, OwnedTensor storage,
                         const TensorArg& out, std::shared_ptr<void> owner, std::shared_ptr<PyStream> producer) {
  if (storage.defined()) return py::cast(export_owned(device, std::move(storage), std::move(producer)));
  if (out.defined() && view.data() == out.tensor.data()) {
    if (view.rank() == out.tensor.rank() && view.dim(0) == out.tensor.dim(0)) return out.object;
    return py::cast(export_view(device, view, out.keep, std::move(producer)));
  }
  return py::cast(export_view(device, view, std::move(owner), std::move(producer)));
}

bool is_torch_tensor(const py::handle& object) {
  const py::object module = py::type::handle_of(object).attr("__module__");
  return py::isinstance<py::str>(module) && module.cast<std::string>().rfind("torch", 0) == 0;
}

TensorArg import_tensor(const py::handle& object, const char* name, DeviceHandle& device, Stream& stream) {
  TensorArg arg;
  arg.object = py::reinterpret_borrow<py::object>(object);
  if (object.is_none()) return arg;
  MemoryKind kind = MemoryKind::host;
  const Device* owner = nullptr;
  if (py::isinstance<PyTensor>(object)) {
    const auto tensor = object.cast<std::shared_ptr<PyTensor>>();
    arg.keep = tensor->keep();
    if (tensor->view().device() != nullptr) {  // the library's own memory, its kind known
      arg.tensor = tensor->view();
      return arg;
    }
    place(tensor->dl_device(), device, kind, owner);
    const Tensor& v = tensor->view();
    arg.tensor = view_of(name, v.data(), v.dtype(), shape_of(v), strides_of(v), kind, owner);
    return arg;
  }
  if (runs_on_torchs_current_stream(stream) && is_torch_tensor(object)) {
    // A torch tensor for a call on torch's own current stream: its capsule
    // straight from torch, no handshake (torch's writes and the call are in
    // one stream's order). A capsule of host memory takes the slow path,
    // which tells pinned memory from pageable.
    const py::object capsule = torch_to_dlpack(object);
    if (!capsule.is_none()) {
      Consumed c = consume_capsule(capsule, name, nullptr);
      if (on_gpu_of(c.device, device)) {
        const DType dtype = dtype_or_type_error(c.dtype, name);
        place(c.device, device, kind, owner);
        arg.tensor = view_of(name, c.data, dtype, c.shape, c.strides, kind, owner);
        arg.keep = std::move(c.imported);
        return arg;
      }
    }
  }
  const dl::DLDevice where = dlpack_device_of_object(object, name);
  py::object producer_stream = py::none();
  if (on_gpu_of(where, device)) {
    // The consumer stream for the producer's handshake, or -1 (DLPack: no
    // synchronisation) for a torch tensor of a call that runs on torch's own
    // current stream, where torch's handshake would cost a stream object, an
    // event and a wait per tensor and order nothing.
    void* native = stream.native_handle();
    const std::intptr_t legacy = device.backend() == Backend::hip ? 0 : 1;
    producer_stream = py::int_(is_torch_tensor(object) && runs_on_torchs_current_stream(stream) ? -1
                               : native != nullptr               ? reinterpret_cast<std::intptr_t>(native)
                                                                 : legacy);
  }
  Consumed c = consume(object, name, &where, producer_stream);
  const DType dtype = dtype_or_type_error(c.dtype, name);
  place(c.device, device, kind, owner);
  arg.tensor = view_of(name, c.data, dtype, c.shape, c.strides, kind, owner);
  arg.keep = std::move(c.imported);
  return arg;
}

std::pair<std::string, int> backend_of_dlpack_device(const py::handle& object) {
  dl::DLDevice where{};
  if (py::isinstance<PyTensor>(object)) {
    const auto tensor = object.cast<std::shared_ptr<PyTensor>>();
    if (tensor->device()) return {tensor->device()->backend_name(), tensor->device()->index()};
    where = tensor->dl_device();
  } else {
    where = dlpack_device_of_object(object, "tensor");
  }
  switch (where.device_type) {
    case dl::kDLCPU: return {"host", 0};
    case dl::kDLCUDA:
    case dl::kDLCUDAHost:
    case dl::kDLCUDAManaged: return {"cuda", where.device_id};
    case dl::kDLROCM:
    case dl::kDLROCMHost: return {"hip", where.device_id};
    default: break;
  }
  throw py::value_error("DLPack device type " + std::to_string(where.device_type) +
                        " is not memory of a backend sparse_mla runs on (CPU, CUDA, ROCm)");
}

namespace {

// sparse_mla.from_dlpack(x, dtype=None): `x` in place as a sparse_mla.Tensor,
// optionally reinterpreted as another dtype of the same element size (bf16
// data that NumPy holds as uint16).
std::shared_ptr<PyTensor> from_dlpack(const py::object& object, const py::object& as_dtype) {
  if (py::isinstance<PyTensor>(object) && as_dtype.is_none()) return object.cast<std::shared_ptr<PyTensor>>();
  dlpack_device_of_object(object, "from_dlpack: x");  // a TypeError for anything else
  // The view keeps the capsule's device, which it hands on when exported:
  // what its producer wrote, whichever consumer reads it next.
  Consumed c = consume(object, "from_dlpack: x", nullptr, py::none());
  DType dtype;
  if (as_dtype.is_none()) {
    dtype = dtype_or_type_error(c.dtype, "from_dlpack: x");
  } else {
    dtype = parse_dtype_name(py::str(as_dtype));
    if (c.dtype.lanes != 1 || c.dtype.bits != 8 * dtype_size(dtype)) {
      throw py::type_error("from_dlpack: x has dtype " + dlpack_dtype_string(c.dtype) + ", which cannot be viewed as " +
                           dtype_python_name(dtype) + " (the element sizes differ)");
    }
  }
  const Tensor view = view_of("from_dlpack: x", c.data, dtype, c.shape, c.strides, MemoryKind::host, nullptr);
  return std::make_shared<PyTensor>(nullptr, view, c.device, std::move(c.imported));
}

const char* numpy_typestr(DType dtype) {
  switch (dtype) {
    case DType::i32: return "<i4";
    case DType::i16: return "<i2";
    case DType::u8: return "|u1";
    case DType::bf16: return "<u2";
    case DType::f32: return "<f4";
    case DType::i64: return "<i8";
  }
  return "|u1";
}

// NumPy's array interface (version 3) for memory the CPU reaches, so that
// numpy.asarray(t) is a writable view (numpy.from_dlpack views are read-only
// before NumPy 2); bf16 shows as its uint16 bits.
py::dict array_interface(const PyTensor& t) {
  const std::int32_t type = t.dl_device().device_type;
  if (type != dl::kDLCPU && type != dl::kDLCUDAHost && type != dl::kDLROCMHost) {
    throw py::attribute_error("__array_interface__: the tensor is in device memory (use torch.from_dlpack or cupy.from_dlpack)");
  }
  const Tensor& v = t.view();
  py::tuple shape(static_cast<std::size_t>(v.rank())), strides(static_cast<std::size_t>(v.rank()));
  for (int i = 0; i < v.rank(); ++i) {
    shape[static_cast<std::size_t>(i)] = v.dim(i);
    strides[static_cast<std::size_t>(i)] = v.stride(i) * static_cast<std::int64_t>(v.element_size());
  }
  py::dict d;
  d["version"] = 3;
  d["shape"] = shape;
  d["strides"] = strides;
  d["typestr"] = numpy_typestr(v.dtype());
  d["data"] = py::make_tuple(reinterpret_cast<std::uintptr_t>(v.data()), false);
  return d;
}

py::tuple tuple_of(const std::vector<std::int64_t>& values) {
  py::tuple t(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) t[i] = values[i];
  return t;
}

}  // namespace

void register_dlpack(py::module_& m) {
  py::class_<PyTensor, std::shared_ptr<PyTensor>>(m, "Tensor", R"(A tensor the library allocated or views (a group's
workspace, a conversion's result, Device.empty, from_dlpack). Implements the
DLPack protocol: numpy.from_dlpack(t) and torch.from_dlpack(t) view it without
a copy, and keep its memory alive.)")
      .def("__dlpack__", &PyTensor::dlpack, py::kw_only(), py::arg("stream") = py::none(),
           py::arg("max_version") = py::none(), py::arg("dl_device") = py::none(), py::arg("copy") = py::none())
      .def("__dlpack_device__", &PyTensor::dlpack_device)
      .def_property_readonly("__array_interface__", &array_interface)
      .def_property_readonly("shape", [](const PyTensor& t) { return tuple_of(shape_of(t.view())); })
      .def_property_readonly("strides", [](const PyTensor& t) { return tuple_of(strides_of(t.view())); },
                             "Strides in elements (DLPack's unit, not NumPy's bytes).")
      .def_property_readonly("ndim", [](const PyTensor& t) { return t.view().rank(); })
      .def_property_readonly("dtype", [](const PyTensor& t) { return dtype_python_name(t.view().dtype()); })
      .def_property_readonly("kind", [](const PyTensor& t) -> py::object {
        if (t.view().device() == nullptr) return py::none();  // an engine tensor's, resolved per call
        return py::str(memory_kind_name(t.view().kind()));
      }, "Memory kind of the library's own memory ('device', 'pinned_host', 'host'); None for from_dlpack views.")
      .def_property_readonly("data_ptr", [](const PyTensor& t) { return reinterpret_cast<std::uintptr_t>(t.view().data()); })
      .def_property_readonly("numel", [](const PyTensor& t) { return t.view().numel(); })
      .def("__repr__", [](const PyTensor& t) {
        std::ostringstream out;
        out << "sparse_mla.Tensor(shape=" << t.view().shape_string() << ", dtype=" << dtype_python_name(t.view().dtype());
        if (t.view().device() != nullptr) out << ", kind=" << memory_kind_name(t.view().kind());
        out << ", dlpack_device=(" << t.dl_device().device_type << ", " << t.dl_device().device_id << "))";
        return out.str();
      });
  m.def("from_dlpack", &from_dlpack, py::arg("x"), py::kw_only(), py::arg("dtype") = py::none(),
        R"(x (anything with __dlpack__) viewed in place as a sparse_mla.Tensor, kept alive by it. With dtype, the
same bytes as another dtype of the same element size: from_dlpack(np_uint16_array, dtype='bfloat16') is how
NumPy passes bf16 data.)");
}

}  // namespace sparse_mla::python
