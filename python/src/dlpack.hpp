// DLPack interchange: tensors of torch, NumPy (>= 1.22) and CuPy viewed in
// place as sparse_mla::Tensor, and the library's own tensors handed out as
// objects implementing __dlpack__ / __dlpack_device__ (sparse_mla.Tensor).
//
// No dlpack header is packaged, so the stable ABI is declared here, field for
// field, from the DLPack specification:
//   https://github.com/dmlc/dlpack/blob/v0.8/include/dlpack/dlpack.h
//     (DLDevice, DLDataType, DLTensor, DLManagedTensor: DLPack 0.8)
//   https://github.com/dmlc/dlpack/blob/v1.0/include/dlpack/dlpack.h
//     (DLPackVersion, DLManagedTensorVersioned: DLPack 1.0, exported on request)
//   https://dmlc.github.io/dlpack/latest/python_spec.html
//     (the capsule names "dltensor" / "used_dltensor", the stream argument)
// Implemented by dlpack.cpp.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "streams.hpp"
#include "sparse_mla/tensor.hpp"
#include "sparse_mla/topk_convert.hpp"

namespace sparse_mla::python {

namespace dl {

// DLDeviceType (an int-sized C enum in dlpack.h).
enum DeviceType : std::int32_t {
  kDLCPU = 1,
  kDLCUDA = 2,
  kDLCUDAHost = 3,
  kDLROCM = 10,
  kDLROCMHost = 11,
  kDLCUDAManaged = 13,
};

// DLDataTypeCode.
enum DataTypeCode : std::uint8_t { kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLBfloat = 4 };

struct DLDevice {
  std::int32_t device_type;  // DLDeviceType
  std::int32_t device_id;
};

struct DLDataType {
  std::uint8_t code;
  std::uint8_t bits;
  std::uint16_t lanes;
};

struct DLTensor {
  void* data;
  DLDevice device;
  std::int32_t ndim;
  DLDataType dtype;
  std::int64_t* shape;
  std::int64_t* strides;  // in elements; nullptr = compact row-major
  std::uint64_t byte_offset;
};

struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor* self);
};

struct DLPackVersion {
  std::uint32_t major;
  std::uint32_t minor;
};

struct DLManagedTensorVersioned {
  DLPackVersion version;
  void* manager_ctx;
  void (*deleter)(DLManagedTensorVersioned* self);
  std::uint64_t flags;
  DLTensor dl_tensor;
};

constexpr std::uint64_t flag_read_only = 1;

}  // namespace dl

// "int32", "int16", "uint8", "bfloat16", "float32", "int64" (torch's and NumPy's names).
const char* dtype_python_name(DType dtype);
DType parse_dtype_name(const std::string& name);

// A view the library can take, as sparse_mla.Tensor: the library's own memory
// (an OwnedTensor, a group's workspace: `device` set, the view's memory kind
// known) or, from sparse_mla.from_dlpack, an engine tensor reinterpreted
// (`device` null, `view.device()` null: its kind and device are resolved per
// call from `dl_device`). `keep` holds whatever keeps the memory alive, never
// a Python object (a DLPack deleter may run on any thread, without the GIL).
class PyTensor {
 public:
  PyTensor(std::shared_ptr<DeviceHandle> device, const Tensor& view, dl::DLDevice dl_device,
           std::shared_ptr<void> keep, std::shared_ptr<PyStream> producer = nullptr);

  const std::shared_ptr<DeviceHandle>& device() const { return device_; }
  const Tensor& view() const { return view_; }
  dl::DLDevice dl_device() const { return dl_device_; }
  const std::shared_ptr<void>& keep() const { return keep_; }

  // The DLPack protocol (python_spec.html): a "dltensor" capsule, or a
  // "dltensor_versioned" one when max_version asks for DLPack >= 1.0. A
  // consumer `stream` on a GPU first waits for the stream that wrote the view.
  py::object dlpack(const py::object& stream, const py::object& max_version, const py::object& dl_device,
                    const py::object& copy);
  py::tuple dlpack_device() const;

 private:
  std::shared_ptr<DeviceHandle> device_;
  Tensor view_;
  dl::DLDevice dl_device_;
  std::shared_ptr<void> keep_;
  std::shared_ptr<PyStream> producer_;
};

// The library's tensor `view` handed to Python, its memory kept by `keep`;
// `producer` is the stream whose queued work writes it.
std::shared_ptr<PyTensor> export_view(const std::shared_ptr<DeviceHandle>& device, const Tensor& view,
                                      std::shared_ptr<void> keep, std::shared_ptr<PyStream> producer = nullptr);
// An OwnedTensor the library allocated, kept with its Device.
std::shared_ptr<PyTensor> export_owned(const std::shared_ptr<DeviceHandle>& device, OwnedTensor owned,
                                       std::shared_ptr<PyStream> producer = nullptr);

// One tensor argument of a call, as the library sees it: the view (undefined
// for None) and what keeps its memory alive until the argument goes away
// (the consumed DLPack tensor, whose deleter then runs).
struct TensorArg {
  Tensor tensor;
  std::shared_ptr<void> keep;
  py::object object;  // the Python argument (None when none was given)
  bool defined() const { return tensor.defined(); }
};

// Views `object` (None, a sparse_mla.Tensor, or anything with __dlpack__ and
// __dlpack_device__) for a call on `device` that runs on `stream` (the
// producer makes `stream` wait for its pending writes, python_spec.html).
// DLPack devices map to memory kinds of the call's device: kDLCPU -> host,
// kDLCUDAHost/kDLROCMHost -> pinned_host, kDLCUDA/kDLROCM of the device's
// backend and index -> device; anything else keeps no device, and the
// library's checks reject it like any tensor of another device. `name` is the
// argument's name in TypeErrors (no __dlpack__, a dtype no operation takes).
TensorArg import_tensor(const py::handle& object, const char* name, DeviceHandle& device, Stream& stream);

// Whether `object` is a torch.Tensor (or a subclass from torch: nn.Parameter),
// told by its type's module, without importing torch.
bool is_torch_tensor(const py::handle& object);

// The backend and index a DLPack device belongs to ("host" for CPU memory),
// for calls that find their device from their tensors.
std::pair<std::string, int> backend_of_dlpack_device(const py::handle& object);

// What Python gets back for a result `view` of a call: the library's fresh
// `storage` when it allocated one; else the caller's `out` argument itself
// when the view is all of it, or a view of it kept alive like it; else a view
// of memory `owner` keeps (a group's workspace).
py::object result_object(const std::shared_ptr<DeviceHandle>& device, const Tensor& view, OwnedTensor storage,
                         const TensorArg& out, std::shared_ptr<void> owner, std::shared_ptr<PyStream> producer);

// What a top-k conversion gives Python (operations.cpp): the physical
// tensor, or (physical, valid_counts) with return_valid_counts, each the
// caller's out buffer, a view kept alive by `owner` (a group's workspace) or
// the library's fresh storage, which the results share.
py::object conversion_result(const std::shared_ptr<DeviceHandle>& device, TopkConversion conversion,
                             const TensorArg& out, const TensorArg& valid_counts_out, bool return_valid_counts,
                             const std::shared_ptr<void>& owner, const CallStream& call);

// The Python classes of this file (sparse_mla.Tensor, from_dlpack).
void register_dlpack(py::module_& m);

}  // namespace sparse_mla::python
