// Devices, streams and events as Python objects (sparse_mla.Device, Stream,
// Event), open_device, and the stream a call runs on when it is given none
// (streams.hpp).
#include "streams.hpp"

#include <pybind11/stl.h>

#include <sstream>
#include <utility>

#include "dlpack.hpp"
#include "sparse_mla/error.hpp"
#include "sparse_mla/kokkos_runtime.hpp"
#include "sparse_mla/tensor.hpp"

namespace sparse_mla::python {

DeviceHandle::DeviceHandle(std::shared_ptr<Device> device, int index) : device_(std::move(device)), index_(index) {}

DeviceHandle::~DeviceHandle() {
  for (Pending& p : pending_) p.done->synchronize();
  pending_.clear();
  // Streams drain their work when destroyed (host streams join their worker).
  wrapped_.clear();
  library_stream_.reset();
}

void DeviceHandle::release_after(Stream& stream, std::shared_ptr<void> storage) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<Pending> still;
  for (Pending& p : pending_) {
    if (!p.done->query()) still.push_back(std::move(p));
  }
  pending_ = std::move(still);
  Pending next{device_->create_event(), std::move(storage)};
  next.done->record(stream);
  pending_.push_back(std::move(next));
}

Stream& DeviceHandle::library_stream() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!library_stream_) library_stream_ = device_->create_stream();
  return *library_stream_;
}

const std::shared_ptr<Stream>& DeviceHandle::wrapped_stream(void* native) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::shared_ptr<Stream>& wrapped = wrapped_[native];
  if (!wrapped) {
    try {
      wrapped = device_->wrap_stream(native);
    } catch (...) {
      wrapped_.erase(native);
      throw;
    }
  }
  return wrapped;
}

void CallStream::finish() const {
  if (!implicit || ref->device->backend() != Backend::host) return;
  py::gil_scoped_release release;
  ref->stream->synchronize();
}

namespace {

// Every device open_device opened, one per (backend, index); never destroyed
// by static destructors (they would run after the library finalised Kokkos):
// release_device_handles empties it at interpreter exit.
std::map<std::pair<std::string, int>, std::shared_ptr<DeviceHandle>>& device_registry() {
  static auto* registry = new std::map<std::pair<std::string, int>, std::shared_ptr<DeviceHandle>>();
  return *registry;
}
std::mutex registry_mutex;

std::shared_ptr<PyStream> own_stream(const std::shared_ptr<DeviceHandle>& device, std::unique_ptr<Stream> stream) {
  std::shared_ptr<Stream> shared = std::move(stream);
  Stream* raw = shared.get();
  return std::make_shared<PyStream>(PyStream{device, std::move(shared), raw});
}

std::shared_ptr<PyEvent> own_event(const std::shared_ptr<DeviceHandle>& device, std::unique_ptr<Event> event) {
  std::shared_ptr<Event> shared = std::move(event);
  Event* raw = shared.get();
  return std::make_shared<PyEvent>(PyEvent{device, std::move(shared), raw});
}

py::object handle_object(void* native) {
  if (native == nullptr) return py::none();
  return py::int_(reinterpret_cast<std::uintptr_t>(native));
}

py::dict activity_dict(const DeviceActivity& a) {
  py::dict d;
  d["allocations"] = a.allocations;
  d["frees"] = a.frees;
  d["host_synchronizations"] = a.host_synchronizations;
  return d;
}

py::dict info_dict(const DeviceInfo& info) {
  py::dict d;
  d["backend"] = info.backend;
  d["name"] = info.name;
  d["architecture"] = info.architecture;
  d["total_memory"] = info.total_memory;
  d["index"] = info.index;
  return d;
}

MemoryKind parse_kind(const std::string& name) {
  for (MemoryKind k : {MemoryKind::device, MemoryKind::pinned_host, MemoryKind::host}) {
    if (name == memory_kind_name(k)) return k;
  }
  throw py::value_error("unknown memory kind '" + name + "' (device, pinned_host, host)");
}

}  // namespace

std::shared_ptr<DeviceHandle> open_device_handle(const std::string& backend, int index) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  std::shared_ptr<DeviceHandle>& handle = device_registry()[{backend, index}];
  if (!handle) {
    try {
      handle = std::make_shared<DeviceHandle>(open_device(backend, index), index);
    } catch (...) {
      device_registry().erase({backend, index});
      throw;
    }
  }
  return handle;
}

void release_device_handles() {
  std::map<std::pair<std::string, int>, std::shared_ptr<DeviceHandle>> released;
  {
    std::lock_guard<std::mutex> lock(registry_mutex);
    released.swap(device_registry());
  }
  py::gil_scoped_release release;  // host streams join their workers
  released.clear();
}

void* native_handle_of(const py::handle& handle, const char* attribute) {
  if (py::isinstance<py::int_>(handle)) return reinterpret_cast<void*>(handle.cast<std::uintptr_t>());
  if (py::hasattr(handle, attribute)) return reinterpret_cast<void*>(handle.attr(attribute).cast<std::uintptr_t>());
  throw py::type_error(std::string("expected an int native handle or an object with .") + attribute + ", got a " +
                       std::string(py::str(py::type::handle_of(handle).attr("__name__"))));
}

namespace {
thread_local bool torch_current_known = false;
thread_local void* torch_current = nullptr;

// torch's module once it is imported (nullptr before). The references are
// kept for the life of the process: they must not be released after the
// interpreter has finalised.
PyObject* imported_torch() {
  static PyObject* torch = nullptr;
  if (torch == nullptr) {
    PyObject* modules = PyImport_GetModuleDict();  // borrowed
    PyObject* found = PyDict_GetItemString(modules, "torch");  // borrowed
    if (found != nullptr) torch = py::reinterpret_borrow<py::object>(found).release().ptr();
  }
  return torch;
}

// torch's own function for what a call needs of it: torch._C.NAME, the
// plain-int form of the public API (torch.cuda.current_stream builds a
// Stream object a call, Tensor.__dlpack__ runs Python checks first); none
// when this torch lacks it.
const py::object& torch_c_function(const char* name, py::object*& cached) {
  static const py::object none = py::none();
  if (cached == nullptr) {
    PyObject* torch = imported_torch();
    if (torch == nullptr) return none;
    py::object f = py::none();
    const py::object c = py::reinterpret_borrow<py::object>(torch).attr("_C");
    if (py::hasattr(c, name)) f = c.attr(name);
    cached = new py::object(std::move(f));  // kept for the process (above)
  }
  return *cached;
}

// torch's current stream on device `index`, when torch is imported and has a
// GPU build; false otherwise.
bool torch_current_stream(int index, void*& native) {
  PyObject* torch = imported_torch();
  if (torch == nullptr) return false;
  static py::object* raw = nullptr;
  try {
    const py::object& current = torch_c_function("_cuda_getCurrentRawStream", raw);
    if (!current.is_none()) {
      native = reinterpret_cast<void*>(current(index).cast<std::uintptr_t>());
    } else {
      const py::object stream = py::reinterpret_borrow<py::object>(torch).attr("cuda").attr("current_stream")(index);
      native = native_handle_of(stream, "cuda_stream");
    }
    return true;
  } catch (const py::error_already_set&) {
    return false;  // torch without a GPU build: the library stream
  }
}
}  // namespace

py::object torch_to_dlpack(const py::handle& tensor) {
  static py::object* to_dlpack = nullptr;
  const py::object& f = torch_c_function("_to_dlpack", to_dlpack);
  return f.is_none() ? py::none() : f(tensor);
}

bool runs_on_torchs_current_stream(const Stream& stream) {
  return torch_current_known && stream.native_handle() == torch_current;
}

CallStream resolve_stream(const std::shared_ptr<DeviceHandle>& device, const py::object& stream) {
  CallStream call;
  torch_current_known = false;
  if (py::isinstance<PyStream>(stream)) {
    call.ref = stream.cast<std::shared_ptr<PyStream>>();
    return call;
  }
  if (!stream.is_none()) {
    const std::shared_ptr<Stream>& wrapped = device->wrapped_stream(native_handle_of(stream, "cuda_stream"));
    call.ref = std::make_shared<PyStream>(PyStream{device, wrapped, wrapped.get()});
    return call;
  }
  call.implicit = true;
  if (device->backend() != Backend::host) {
    // The caller's current torch stream, when torch is in use (torch on ROCm
    // names HIP streams torch.cuda too).
    void* native = nullptr;
    if (torch_current_stream(device->index(), native)) {
      torch_current_known = true;
      torch_current = native;
      const std::shared_ptr<Stream>& wrapped = device->wrapped_stream(native);
      call.ref = std::make_shared<PyStream>(PyStream{device, wrapped, wrapped.get()});
      return call;
    }
  }
  call.ref = std::make_shared<PyStream>(PyStream{device, device, &device->library_stream()});
  return call;
}

std::shared_ptr<DeviceHandle> call_device(const py::object& device, const py::object& stream,
                                          std::initializer_list<py::handle> tensors) {
  if (!device.is_none()) {
    if (!py::isinstance<DeviceHandle>(device)) throw py::type_error("device must be a sparse_mla.Device (open_device)");
    return device.cast<std::shared_ptr<DeviceHandle>>();
  }
  if (py::isinstance<PyStream>(stream)) return stream.cast<std::shared_ptr<PyStream>>()->device;
  // The first tensor of a GPU decides, else the host; host memory among GPU
  // tensors is then that argument's error ("is in host memory, which cuda
  // kernels cannot reach"), not the GPU tensors' ("lives on another device").
  for (const py::handle& t : tensors) {
    if (t.is_none()) continue;
    if (!py::isinstance<PyTensor>(t) && !py::hasattr(t, "__dlpack_device__")) continue;  // import_tensor says what it is
    const auto [backend, index] = backend_of_dlpack_device(t);
    if (backend != "host") return open_device_handle(backend, index);
  }
  return open_device_handle("host", 0);
}

void register_streams(py::module_& m) {
  m.def("compiled_backends", &compiled_backends, "Backends compiled into this build, host first.");
  m.def("backend_unavailable_reason", &backend_unavailable_reason, py::arg("backend"),
        "Why a backend cannot open a device, or '' when it can.");
  m.def("kokkos_version", &kokkos_version);
  m.def("open_device", &open_device_handle, py::arg("backend") = "host", py::arg("index") = 0,
        R"(The device `index` of a backend ('host', 'cuda', 'hip'); the same Device object every time.
Raises ValueError saying why when the backend is not compiled in or has no device.)");

  py::class_<DeviceHandle, std::shared_ptr<DeviceHandle>>(m, "Device", "An opened device (sparse_mla.open_device).")
      .def_property_readonly("backend", &DeviceHandle::backend_name)
      .def_property_readonly("index", &DeviceHandle::index)
      .def_property_readonly("info", [](const DeviceHandle& d) { return info_dict(d.device().info()); })
      .def_property_readonly("execution_space", [](const DeviceHandle& d) { return d.device().execution_space(); })
      .def_property_readonly("has_kernels", [](const DeviceHandle& d) { return d.device().has_kernels(); })
      .def("create_stream", [](const std::shared_ptr<DeviceHandle>& d) { return own_stream(d, d->device().create_stream()); },
           "A new stream the library owns.")
      .def("create_event", [](const std::shared_ptr<DeviceHandle>& d, bool timing) {
        return own_event(d, d->device().create_event(timing));
      }, py::arg("timing") = false)
      .def("wrap_stream", [](const std::shared_ptr<DeviceHandle>& d, const py::object& handle) {
        return own_stream(d, d->device().wrap_stream(native_handle_of(handle, "cuda_stream")));
      }, py::arg("handle"),
           R"(The engine's native stream (an int handle, or an object with .cuda_stream such as torch.cuda.Stream)
as a sparse_mla.Stream, bound once; the library never destroys it: keep it alive while this wrapper lives.)")
      .def("wrap_event", [](const std::shared_ptr<DeviceHandle>& d, const py::object& handle) {
        return own_event(d, d->device().wrap_event(native_handle_of(handle, "cuda_event")));
      }, py::arg("handle"), "The engine's native event (an int handle, or an object with .cuda_event).")
      .def("default_stream", [](const std::shared_ptr<DeviceHandle>& d) { return resolve_stream(d, py::none()).ref; },
           R"(The stream calls on this device use when they are given none: the current torch stream on GPUs when
torch is imported, else the device's library stream.)")
      .def("activity", [](const DeviceHandle& d) { return activity_dict(d.device().activity()); },
           "Allocations, frees and host synchronisations since the device was opened (Device::activity).")
      .def("empty", [](const std::shared_ptr<DeviceHandle>& d, const std::vector<std::int64_t>& shape,
                       const std::string& dtype, const std::string& kind) {
        return export_owned(d, OwnedTensor(d->device(), parse_dtype_name(dtype), shape, parse_kind(kind)));
      }, py::arg("shape"), py::arg("dtype") = "int32", py::arg("kind") = "device",
           R"(A tensor the library allocates (contents undefined) in memory of `kind` ('device', 'pinned_host',
'host'): for example the pinned host pool of a HiSparse layer, which NumPy memory is not.)")
      .def("__repr__", [](const DeviceHandle& d) {
        return std::string("sparse_mla.Device('") + d.backend_name() + "', " + std::to_string(d.index()) + ")";
      });

  py::class_<PyStream, std::shared_ptr<PyStream>>(m, "Stream", "An in-order queue of work on one device.")
      .def("synchronize", [](const PyStream& s) {
        py::gil_scoped_release release;
        s.stream->synchronize();
      }, "Blocks until everything queued so far has run.")
      .def_property_readonly("native_handle", [](const PyStream& s) { return handle_object(s.stream->native_handle()); },
                             "cudaStream_t / hipStream_t as an int; None on the host backend.")
      .def_property_readonly("is_capturing", [](const PyStream& s) { return s.stream->is_capturing(); })
      .def_property_readonly("device", [](const PyStream& s) { return s.device; })
      .def("wait_event", [](const PyStream& s, const PyEvent& e) { s.stream->wait(*e.event); }, py::arg("event"),
           "Work queued after this call waits for the event's last record.")
      .def("wait_stream", [](const PyStream& s, const PyStream& other) { s.stream->wait(*other.stream); }, py::arg("other"),
           "Work queued after this call waits for everything queued on `other` so far.")
      .def("record_event", [](const PyStream& s, const std::shared_ptr<PyEvent>& event) {
        std::shared_ptr<PyEvent> e = event ? event : own_event(s.device, s.device->device().create_event());
        e->event->record(*s.stream);
        return e;
      }, py::arg("event") = py::none(), "Records `event` (a new one when None) on this stream and returns it.")
      .def("__repr__", [](const PyStream& s) {
        std::ostringstream out;
        out << "sparse_mla.Stream(" << s.device->backend_name() << ':' << s.device->index() << ", native_handle=";
        if (s.stream->native_handle() != nullptr) out << s.stream->native_handle(); else out << "None";
        out << ')';
        return out.str();
      });

  py::class_<PyEvent, std::shared_ptr<PyEvent>>(m, "Event", "A point in a stream's work (CUDA event semantics).")
      .def("record", [](const PyEvent& e, const py::object& stream) {
        const CallStream call = resolve_stream(e.device, stream);
        e.event->record(call.get());
      }, py::arg("stream") = py::none(), "Records on `stream` (the device's default stream when None).")
      .def("query", [](const PyEvent& e) { return e.event->query(); })
      .def("synchronize", [](const PyEvent& e) {
        py::gil_scoped_release release;
        e.event->synchronize();
      })
      .def_property_readonly("native_handle", [](const PyEvent& e) { return handle_object(e.event->native_handle()); })
      .def_property_readonly("device", [](const PyEvent& e) { return e.device; });
}

}  // namespace sparse_mla::python
