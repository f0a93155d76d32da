// The whole device interface: Device, Stream, Event, Buffer, MemoryKind.
//
// The index-group logic in core/ is written once against these types; each
// backend (backends/host, backends/cuda, backends/hip) supplies `final`
// implementations over its native runtime, in the spirit of c10's
// DeviceGuardImplInterface. The host backend's streams are real asynchronous
// in-order queues, so the ordering logic is exercised without a GPU.
//
// Lifetimes: a Device outlives every Buffer, Stream and Event made from it
// (open_device() hands out a shared_ptr; keep it while they live).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace sparse_mla {

class Device;
class Event;
class Kernels;
class Stream;
namespace detail {
const Kernels& kernels_of(const Device& device);
}

enum class MemoryKind : std::uint8_t {
  device,       // device memory (cudaMalloc / hipMalloc; aligned host memory on the host backend)
  pinned_host,  // page-locked host memory mapped into the device's address space (zero-copy reads)
  host,         // ordinary pageable host memory; kernels never touch it
};
const char* memory_kind_name(MemoryKind kind);

enum class Backend : std::uint8_t { host, cuda, hip };
const char* backend_name(Backend backend);

// Owns one allocation. Move-only; frees through its Device.
class Buffer final {
 public:
  Buffer() = default;
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer();

  void* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }
  MemoryKind kind() const { return kind_; }
  Device* device() const { return device_; }
  explicit operator bool() const { return data_ != nullptr; }
  template <class T>
  T* as() const { return static_cast<T*>(data_); }

 private:
  friend class Device;
  Buffer(Device* device, void* data, std::size_t bytes, MemoryKind kind)
      : device_(device), data_(data), bytes_(bytes), kind_(kind) {}
  void release() noexcept;

  Device* device_ = nullptr;
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
  MemoryKind kind_ = MemoryKind::device;
};

// Marks a point in a stream's work. Follows CUDA's semantics: query() and
// synchronize() concern the most recent record(); an event never recorded
// counts as complete; Stream::wait(event) waits for the record that was most
// recent when wait() was called, not for later ones.
class Event {
 public:
  virtual ~Event() = default;
  virtual void record(Stream& stream) = 0;
  virtual bool query() = 0;        // true when the recorded work has completed
  virtual void synchronize() = 0;  // blocks the calling thread until then
  virtual Device& device() const = 0;
  // Milliseconds from `start`'s completed record to this event's completed
  // record. Both must be timing events (Device::create_event(true)).
  virtual double elapsed_ms(Event& start) = 0;
  // The native handle (cudaEvent_t, hipEvent_t); nullptr on the host backend.
  virtual void* native_handle() const { return nullptr; }
};

// Work captured from a stream, replayed as one unit (a CUDA or HIP graph).
// Replays read and write the same memory as the captured work did, so the
// caller updates inputs in place between replays.
class Graph {
 public:
  virtual ~Graph() = default;
  virtual void replay(Stream& stream) = 0;
};

// An in-order queue of asynchronous work on one device.
class Stream {
 public:
  virtual ~Stream();
  virtual Device& device() const = 0;

  // Asynchronous copy of `bytes` between any two memory kinds of this device.
  void copy(Buffer& dst, std::size_t dst_offset, const Buffer& src, std::size_t src_offset,
            std::size_t bytes);
  // Asynchronous byte fill (memset).
  void fill(Buffer& dst, std::size_t offset, std::uint8_t value, std::size_t bytes);

  // Unchecked forms, for callers that already validated pointers and sizes.
  virtual void copy_bytes(void* dst, const void* src, std::size_t bytes) = 0;
  virtual void fill_bytes(void* dst, std::uint8_t value, std::size_t bytes) = 0;

  // Work queued on this stream after the call waits for `event`'s last record.
  virtual void wait(Event& event) = 0;
  // Work queued on this stream after the call waits for everything queued on
  // `other` so far (torch's Stream.wait_stream).
  virtual void wait(Stream& other) = 0;
  // Blocks the calling thread until everything queued so far has run.
  virtual void synchronize() = 0;
  // The native handle (cudaStream_t, hipStream_t); nullptr on the host
  // backend (and for a wrapped legacy default stream).
  virtual void* native_handle() const = 0;
  // Whether work queued now is being captured into a graph, whoever began
  // the capture (Stream::begin_capture, or the engine on the native stream,
  // or a stream joined to a capturing one). Never on the host backend.
  virtual bool is_capturing() const { return false; }

  // Graph capture: work queued between the two calls (on this stream, and on
  // streams forked from it through events) is recorded instead of run.
  // Backends without graphs (host) throw an Error saying so.
  virtual void begin_capture();
  virtual std::unique_ptr<Graph> end_capture();
};

// What a device's backend has done that a step path must never do (SPEC
// section 7), counted since the device was opened, from every thread.
// Device::activity() takes a snapshot; the difference of two snapshots is
// what happened between them.
struct DeviceActivity {
  std::uint64_t allocations = 0;            // Device::allocate, any memory kind
  std::uint64_t frees = 0;                  // a Buffer returning its memory
  std::uint64_t host_synchronizations = 0;  // a calling thread blocked on a stream or an event
};
DeviceActivity operator-(const DeviceActivity& after, const DeviceActivity& before);

struct DeviceInfo {
  std::string backend;           // "host", "cuda", "hip"
  std::string name;              // "NVIDIA H200", "host (2 threads)"
  std::string architecture;      // "sm_90", "gfx942", "x86_64"
  std::size_t total_memory = 0;  // bytes of device memory (0 when unknown)
  int index = 0;
};

class Device : public std::enable_shared_from_this<Device> {
 public:
  virtual ~Device() = default;
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  virtual Backend backend() const = 0;
  virtual DeviceInfo info() const = 0;

  // Throws Error naming the kind and size when the allocation fails.
  // A zero-byte allocation gives an empty Buffer.
  Buffer allocate(std::size_t bytes, MemoryKind kind);
  std::unique_ptr<Stream> create_stream();
  // Ordering-only events unless `timing` is set (timing costs on GPUs).
  virtual std::unique_ptr<Event> create_event(bool timing = false) = 0;

  // The engine's own stream (a cudaStream_t or hipStream_t of this device;
  // nullptr is the legacy default stream) as a Stream: usable wherever the
  // library takes one, the kernels' Kokkos instance bound to it here, once.
  // The library never destroys the native stream; the engine keeps it alive
  // while the returned Stream and the work queued on it live. The host
  // backend has no native streams and throws Error saying so. A stream that
  // is capturing a graph cannot be wrapped (binding the kernels allocates):
  // Error, before anything is bound.
  std::unique_ptr<Stream> wrap_stream(void* native);
  // The engine's own event (cudaEvent_t, hipEvent_t), never destroyed by the
  // library. The host backend throws Error.
  std::unique_ptr<Event> wrap_event(void* native);

  // Whether this build has kernels for this backend (a CUDA or HIP native
  // layer built without a GPU-enabled Kokkos has none: its operations throw).
  bool has_kernels() const { return kernels_ != nullptr; }
  // The Kokkos execution space the kernels run on ("Serial", "Cuda", "HIP").
  // Throws like every operation when this build has no kernels.
  std::string execution_space() const;
  // Whether kernels of this device may read or write memory of `kind`.
  bool kernel_accessible(MemoryKind kind) const { return kind != MemoryKind::host || backend() == Backend::host; }

  // The counting hook: allocations and frees are counted here, host
  // synchronisations by the backend's streams and events
  // (note_host_synchronization) at every call that blocks the calling thread.
  DeviceActivity activity() const;
  void note_host_synchronization() const noexcept { host_synchronizations_.fetch_add(1, std::memory_order_relaxed); }

 protected:
  explicit Device(const Kernels* kernels) : kernels_(kernels) {}
  virtual void* allocate_raw(std::size_t bytes, MemoryKind kind) = 0;
  virtual void free_raw(void* data, MemoryKind kind) noexcept = 0;
  virtual std::unique_ptr<Stream> make_stream() = 0;
  // Backends with native streams and events override these; the defaults
  // throw Error naming the backend.
  virtual std::unique_ptr<Stream> make_wrapped_stream(void* native);
  virtual std::unique_ptr<Event> make_wrapped_event(void* native);

 private:
  friend class Buffer;
  // The kernel layer (core/kernels/kernels.hpp) is private to the library:
  // its operations reach it through detail::kernels_of.
  friend const Kernels& detail::kernels_of(const Device& device);
  const Kernels& kernels() const;
  const Kernels* kernels_;
  std::atomic<std::uint64_t> allocations_{0};
  std::atomic<std::uint64_t> frees_{0};
  mutable std::atomic<std::uint64_t> host_synchronizations_{0};
};

// Backends compiled into this build, host first: {"host", "cuda", "hip"}.
std::vector<std::string> compiled_backends();
// Opens device `index` of a backend by name. Throws Error saying why when the
// backend is not compiled in or has no device ("no CUDA device: ...").
std::shared_ptr<Device> open_device(const std::string& backend, int index = 0);
// Why a compiled backend cannot open a device, or "" when it can.
std::string backend_unavailable_reason(const std::string& backend);

}  // namespace sparse_mla
