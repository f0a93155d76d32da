// The device as Python holds it, streams and events as Python objects, and
// the stream a call runs on. Implemented by streams.cpp.
//
// Lifetimes: every Python object that needs a Device holds its DeviceHandle
// (shared), so the library's Device outlives its streams, events and
// buffers (device.hpp). Objects owned by something else (a group's side
// stream) hold that owner. Nothing here holds a Python object where a DLPack
// deleter might release it without the GIL.
#pragma once

#include <pybind11/pybind11.h>

#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "sparse_mla/device.hpp"

namespace sparse_mla::python {

namespace py = pybind11;

// One opened device, as sparse_mla.Device: the library's Device, the stream
// calls use when given none (created on first use) and the wrappers of the
// native streams calls were given (torch's current stream, handles), bound
// once per handle (wrapping binds the kernels' Kokkos instance: device.hpp).
// open_device hands out one per (backend, index).
class DeviceHandle {
 public:
  DeviceHandle(std::shared_ptr<Device> device, int index);
  ~DeviceHandle();
  DeviceHandle(const DeviceHandle&) = delete;
  DeviceHandle& operator=(const DeviceHandle&) = delete;

  Device& device() const { return *device_; }
  const std::shared_ptr<Device>& shared_device() const { return device_; }
  Backend backend() const { return device_->backend(); }
  const char* backend_name() const { return sparse_mla::backend_name(device_->backend()); }
  int index() const { return index_; }

  Stream& library_stream();
  // The wrapper of native stream `native` (cached: the same one every time).
  const std::shared_ptr<Stream>& wrapped_stream(void* native);
  // Keeps `storage` until the work queued on `stream` so far has run: for
  // library buffers a call writes but hands nobody (a DCP conversion's valid
  // counts nobody asked for), released stream-ordered like torch's allocator.
  void release_after(Stream& stream, std::shared_ptr<void> storage);

 private:
  std::shared_ptr<Device> device_;  // first: destroyed last
  int index_;
  std::mutex mutex_;
  std::unique_ptr<Stream> library_stream_;
  std::map<void*, std::shared_ptr<Stream>> wrapped_;
  struct Pending {
    std::unique_ptr<Event> done;
    std::shared_ptr<void> storage;
  };
  std::vector<Pending> pending_;
};

// sparse_mla.Stream: a stream and what keeps it alive (itself, the device
// that owns it, or the group whose side stream it is).
struct PyStream {
  std::shared_ptr<DeviceHandle> device;
  std::shared_ptr<void> owner;
  Stream* stream = nullptr;
};

// sparse_mla.Event, likewise.
struct PyEvent {
  std::shared_ptr<DeviceHandle> device;
  std::shared_ptr<void> owner;
  Event* event = nullptr;
};

// The stream one call runs on. `implicit`: the caller passed none. On the
// host backend an implicit call waits for its stream before returning (the
// NumPy arrays hold the results, as NumPy users expect); with a stream passed
// every call only queues work, as on GPUs.
struct CallStream {
  std::shared_ptr<PyStream> ref;
  bool implicit = false;

  Stream& get() const { return *ref->stream; }
  // After the call queued its work: waits where the rule above says so.
  void finish() const;
};

// Whether `stream` is the stream torch reported as its current one when this
// thread's call in progress resolved its stream (resolve_stream). A tensor
// imported for a call that runs on torch's own current stream needs no DLPack
// stream handshake: torch's writes and the call are in one stream's order.
bool runs_on_torchs_current_stream(const Stream& stream);

// A torch tensor's DLPack capsule without the Python-level checks and stream
// handshake of Tensor.__dlpack__ (torch._C._to_dlpack), for a call that runs
// on torch's current stream; None when torch has no such function.
py::object torch_to_dlpack(const py::handle& tensor);

// The opened device (backend, index), one per process.
std::shared_ptr<DeviceHandle> open_device_handle(const std::string& backend, int index);
// Drops the devices open_device cached (at interpreter exit, before the
// library's own exit handlers finalise Kokkos).
void release_device_handles();

// `stream` as the stream of a call on `device`:
//   None: on cuda/hip the caller's current torch stream when torch is
//     imported (sys.modules), else the device's library stream;
//   a sparse_mla.Stream: itself (the library checks its device);
//   an int native handle, or an object with `cuda_stream` (torch.cuda.Stream):
//     that native stream, wrapped once.
CallStream resolve_stream(const std::shared_ptr<DeviceHandle>& device, const py::object& stream);
// The native handle of `handle` (an int, or an object with `attribute`).
void* native_handle_of(const py::handle& handle, const char* attribute);

// The device of a call given `device` (a sparse_mla.Device or None), its
// `stream` and its tensors, in that order of precedence: the first tensor
// with a DLPack device decides (CPU memory: the host device).
std::shared_ptr<DeviceHandle> call_device(const py::object& device, const py::object& stream,
                                          std::initializer_list<py::handle> tensors);

// Device, Stream, Event, open_device and the module's other device calls.
void register_streams(py::module_& m);

}  // namespace sparse_mla::python
