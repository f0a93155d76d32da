// The GPU native layer, written once over a runtime-traits type `R`
// (gpu_runtime.hpp): GpuDevice, GpuStream, GpuEvent, the translation of
// runtime error codes into sparse_mla::Error, and the entry points that
// backends/<api>/<api>_device.cpp forwards to.
//
// Rules this layer keeps:
//   - Every runtime call is checked; a failure throws Error whose where() is
//     the call ("cudaMemcpyAsync") and whose message adds the runtime's error
//     name and description ("cudaErrorInvalidValue (invalid argument)").
//   - Calls that depend on the current device run under a DeviceGuard, which
//     sets the object's device and restores the caller's afterwards.
//   - Nothing in the stream and event paths synchronises the host or
//     allocates (but a fill of pageable host memory, which no kernel path
//     does), so a stream can be captured into a CUDA graph.
//   - With no device or no driver, unavailable_reason() says so and
//     open_device() throws it; nothing else is called.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <utility>

#include "sparse_mla/device.hpp"
#include "sparse_mla/error.hpp"
#include "sparse_mla/kokkos_runtime.hpp"
#include "kernels.hpp"

namespace sparse_mla::gpu {

// "cudaErrorInvalidValue (invalid argument)"; "hipErrorNoDevice" where the
// runtime's description is only the name again (HIP 5); the number where the
// runtime does not know the code.
template <class R>
std::string error_text(typename R::error_t error) {
  const char* name = R::error_name(error);
  const char* description = R::error_string(error);
  const std::string known_prefix = R::prefix;
  std::string text = name != nullptr ? name : "";
  if (text.compare(0, known_prefix.size(), known_prefix) != 0) {
    return detail::concat("unrecognized error code ", static_cast<long long>(error));
  }
  if (description != nullptr && text != description) text += detail::concat(" (", description, ")");
  return text;
}

// The Error for a failed call; `call` is the runtime function without its
// prefix ("MemcpyAsync"). Clears the runtime's last-error slot so that a
// failure that is not sticky does not resurface in a later, unrelated check.
template <class R, class... Context>
Error runtime_error(const std::string& call, typename R::error_t error, const Context&... context) {
  (void)R::GetLastError();
  return Error(R::prefix + call, detail::concat(error_text<R>(error), context...));
}

template <class R, class... Context>
void check(const char* call, typename R::error_t error, const Context&... context) {
  if (error != R::success) throw runtime_error<R>(call, error, context...);
}

// Sets the current device for its lifetime and restores the previous one.
template <class R>
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    check<R>("GetDevice", R::GetDevice(&previous_));
    if (previous_ != device) {
      check<R>("SetDevice", R::SetDevice(device), " (device ", device, ")");
      restore_ = true;
    }
  }
  ~DeviceGuard() {
    if (restore_) (void)R::SetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
  bool restore_ = false;
};

template <class R>
class GpuDevice;
template <class R>
class GpuStream;

// Whether the current device can address `data` directly: device memory and
// mapped pinned memory can, pageable host memory cannot (except where the
// system lets GPUs address pageable memory, which the runtime then reports).
template <class R>
bool device_can_address(const void* data) {
  typename R::pointer_attributes_t attributes{};
  if (R::PointerGetAttributes(&attributes, data) != R::success) {
    (void)R::GetLastError();  // HIP 5 answers hipErrorInvalidValue for memory it does not know
    return false;
  }
  return attributes.devicePointer != nullptr;
}

// A byte fill of pageable host memory, run by the runtime on a host thread in
// stream order: the runtime's memset only writes memory the device can address.
// A stream callback rather than a host function node (cudaLaunchHostFunc):
// Debian's libamdhip64 5.2 declares hipLaunchHostFunc but does not export it.
template <class R>
struct HostFill {
  void* dst;
  std::uint8_t value;
  std::size_t bytes;
  static void run(typename R::stream_t, typename R::error_t status, void* task) {
    const std::unique_ptr<HostFill> fill(static_cast<HostFill*>(task));
    if (status == R::success) std::memset(fill->dst, fill->value, fill->bytes);
  }
};

template <class R>
GpuStream<R>& as_gpu_stream(Stream& stream, const char* where) {
  auto* gpu = dynamic_cast<GpuStream<R>*>(&stream);
  if (gpu == nullptr) {
    fail(where, "the stream belongs to the ", backend_name(stream.device().backend()), " backend, not ",
         backend_name(R::backend));
  }
  return *gpu;
}

// Ordering only (timing disabled, cheaper) unless made for timing.
template <class R>
class GpuEvent final : public Event {
 public:
  GpuEvent(GpuDevice<R>& device, bool timing) : device_(device), timing_(timing) {
    DeviceGuard<R> guard(device_.index());
    check<R>("EventCreateWithFlags",
             R::EventCreateWithFlags(&event_, timing ? R::event_default : R::event_disable_timing));
  }
  // The engine's event: used, never destroyed. Whether it times is the
  // engine's choice; elapsed_ms lets the runtime say.
  GpuEvent(GpuDevice<R>& device, typename R::event_t native) : device_(device), timing_(true), owned_(false), event_(native) {}
  ~GpuEvent() override {
    if (owned_) (void)R::EventDestroy(event_);
  }
  GpuEvent(const GpuEvent&) = delete;
  GpuEvent& operator=(const GpuEvent&) = delete;

  void record(Stream& stream) override {
    GpuStream<R>& gpu = as_gpu_stream<R>(stream, "Event::record");
    DeviceGuard<R> guard(gpu.device_index());
    check<R>("EventRecord", R::EventRecord(event_, gpu.native()));
  }
  bool query() override {
    const auto status = R::EventQuery(event_);
    if (status == R::not_ready) {
      (void)R::GetLastError();  // not an error: clear it
      return false;
    }
    check<R>("EventQuery", status);
    return true;
  }
  void synchronize() override {
    device_.note_host_synchronization();
    check<R>("EventSynchronize", R::EventSynchronize(event_));
  }
  Device& device() const override { return device_; }
  typename R::event_t native() const { return event_; }
  void* native_handle() const override { return static_cast<void*>(event_); }

  double elapsed_ms(Event& start) override {
    auto* begin = dynamic_cast<GpuEvent<R>*>(&start);
    if (begin == nullptr) fail("Event::elapsed_ms", "the start event belongs to another backend");
    if (!timing_ || !begin->timing_) fail("Event::elapsed_ms", "both events must be created with timing enabled");
    float ms = 0.0f;
    check<R>("EventElapsedTime", R::EventElapsedTime(&ms, begin->event_, event_));
    return ms;
  }

 private:
  GpuDevice<R>& device_;
  bool timing_;
  bool owned_ = true;
  typename R::event_t event_ = nullptr;
};

// An instantiated graph; replays run on any stream of the same device.
template <class R>
class GpuGraph final : public Graph {
 public:
  GpuGraph(int device, typename R::graph_exec_t exec) : device_(device), exec_(exec) {}
  ~GpuGraph() override { (void)R::GraphExecDestroy(exec_); }
  GpuGraph(const GpuGraph&) = delete;
  GpuGraph& operator=(const GpuGraph&) = delete;
  void replay(Stream& stream) override;

 private:
  int device_;
  typename R::graph_exec_t exec_;
};

// A non-blocking native stream (it never synchronises with the legacy
// default stream). Owns one private event for wait(Stream).
template <class R>
class GpuStream final : public Stream {
 public:
  explicit GpuStream(GpuDevice<R>& device) : device_(device), join_(device, false) {
    DeviceGuard<R> guard(device_.index());
    check<R>("StreamCreateWithFlags", R::StreamCreateWithFlags(&stream_, R::stream_non_blocking));
  }
  // The engine's stream: used, never destroyed.
  GpuStream(GpuDevice<R>& device, typename R::stream_t native)
      : device_(device), join_(device, false), stream_(native), owned_(false) {}
  ~GpuStream() override {
    kernel_instance_.reset();  // the Kokkos instance goes first, while the stream exists
    if (owned_) (void)R::StreamDestroy(stream_);
  }
  GpuStream(const GpuStream&) = delete;
  GpuStream& operator=(const GpuStream&) = delete;

  Device& device() const override { return device_; }
  int device_index() const { return device_.index(); }
  typename R::stream_t native() const { return stream_; }
  void* native_handle() const override { return static_cast<void*>(stream_); }

  // The kernel layer's instance for this stream: the Kokkos execution-space
  // instance that runs on it (gpu_exec.hpp), kept untyped because the native
  // layer is compiled without Kokkos. Set once when the stream is made (so
  // that no launch creates one, which allocates and synchronises, and would
  // break graph capture), read by every launch.
  const std::shared_ptr<void>& kernel_instance() const { return kernel_instance_; }
  void set_kernel_instance(std::shared_ptr<void> instance) { kernel_instance_ = std::move(instance); }

  // The default copy kind lets the runtime infer the direction from the
  // pointers (unified addressing), so one call serves every pair of kinds.
  // A copy to or from pageable host memory may block the calling thread: it
  // counts as a host synchronisation.
  void copy_bytes(void* dst, const void* src, std::size_t bytes) override {
    DeviceGuard<R> guard(device_index());
    if (!device_can_address<R>(dst) || !device_can_address<R>(src)) device_.note_host_synchronization();
    check<R>("MemcpyAsync", R::MemcpyAsync(dst, src, bytes, R::memcpy_default, stream_), " (", bytes, " bytes)");
  }
  // Device and pinned memory: the runtime's memset. Pageable host memory
  // (MemoryKind::host): a callback queued on the stream (not capturable; the
  // kernels' paths never fill host memory).
  void fill_bytes(void* dst, std::uint8_t value, std::size_t bytes) override {
    DeviceGuard<R> guard(device_index());
    if (device_can_address<R>(dst)) {
      check<R>("MemsetAsync", R::MemsetAsync(dst, static_cast<int>(value), bytes, stream_), " (", bytes, " bytes)");
      return;
    }
    auto task = std::make_unique<HostFill<R>>(HostFill<R>{dst, value, bytes});
    check<R>("StreamAddCallback", R::StreamAddCallback(stream_, &HostFill<R>::run, task.get(), 0u), " (fill of ",
             bytes, " bytes of host memory)");
    task.release();  // HostFill::run frees it
  }
  void wait(Event& event) override {
    auto* gpu = dynamic_cast<GpuEvent<R>*>(&event);
    if (gpu == nullptr) {
      fail("Stream::wait(Event)", "the event belongs to the ", backend_name(event.device().backend()),
           " backend, not ", backend_name(R::backend));
    }
    DeviceGuard<R> guard(device_index());
    check<R>("StreamWaitEvent", R::StreamWaitEvent(stream_, gpu->native(), 0u));
  }
  // Records the other stream's private event on it and waits for that record.
  // Reusing one event is correct: a wait binds to the record that is current
  // when StreamWaitEvent is called, and later records do not move it. No call
  // here synchronises, so this is legal inside a stream capture.
  void wait(Stream& other) override {
    GpuStream<R>& source = as_gpu_stream<R>(other, "Stream::wait(Stream)");
    if (&source == this) return;  // in order already
    source.join_.record(source);
    wait(source.join_);
  }
  void synchronize() override {
    device_.note_host_synchronization();
    DeviceGuard<R> guard(device_index());
    check<R>("StreamSynchronize", R::StreamSynchronize(stream_));
  }
  bool is_capturing() const override {
    typename R::capture_status_t status{};
    check<R>("StreamIsCapturing", R::StreamIsCapturing(stream_, &status));
    return status != R::capture_none;
  }

  // Streams joined to this one through events (Stream::wait on an event
  // recorded here) are captured too, and must join back before end_capture.
  void begin_capture() override {
    DeviceGuard<R> guard(device_index());
    check<R>("StreamBeginCapture", R::StreamBeginCapture(stream_, R::capture_mode));
  }
  std::unique_ptr<Graph> end_capture() override {
    DeviceGuard<R> guard(device_index());
    typename R::graph_t graph = nullptr;
    check<R>("StreamEndCapture", R::StreamEndCapture(stream_, &graph));
    typename R::graph_exec_t exec = nullptr;
    const auto status = R::GraphInstantiateWithFlags(&exec, graph, 0ull);
    (void)R::GraphDestroy(graph);
    check<R>("GraphInstantiateWithFlags", status);
    return std::make_unique<GpuGraph<R>>(device_index(), exec);
  }

 private:
  GpuDevice<R>& device_;
  GpuEvent<R> join_;
  typename R::stream_t stream_ = nullptr;
  bool owned_ = true;
  std::shared_ptr<void> kernel_instance_;
};

template <class R>
class GpuDevice final : public Device {
 public:
  // `kernel_set` is nullptr when this build has no Kokkos kernels for R.
  GpuDevice(int device_index, DeviceInfo device_info, const Kernels* kernel_set)
      : Device(kernel_set), index_(device_index), info_(std::move(device_info)) {}

  Backend backend() const override { return R::backend; }
  DeviceInfo info() const override { return info_; }
  int index() const { return index_; }
  std::unique_ptr<Event> create_event(bool timing) override { return std::make_unique<GpuEvent<R>>(*this, timing); }

 protected:
  std::unique_ptr<Stream> make_stream() override { return std::make_unique<GpuStream<R>>(*this); }
  std::unique_ptr<Stream> make_wrapped_stream(void* native) override {
    return std::make_unique<GpuStream<R>>(*this, static_cast<typename R::stream_t>(native));
  }
  std::unique_ptr<Event> make_wrapped_event(void* native) override {
    return std::make_unique<GpuEvent<R>>(*this, static_cast<typename R::event_t>(native));
  }

  void* allocate_raw(std::size_t bytes, MemoryKind kind) override {
    switch (kind) {
      case MemoryKind::device: return allocate_device(bytes);
      case MemoryKind::pinned_host: return allocate_pinned(bytes);
      case MemoryKind::host: return allocate_host(bytes);
    }
    return nullptr;
  }

  // Errors on the way out are dropped: a destructor cannot report them, and
  // after the runtime has shut down (static destructors) every call fails.
  void free_raw(void* data, MemoryKind kind) noexcept override {
    if (kind == MemoryKind::host) {
      std::free(data);
      return;
    }
    int previous = 0;
    const bool switch_device = R::GetDevice(&previous) == R::success && previous != index_;
    if (switch_device) (void)R::SetDevice(index_);
    (void)(kind == MemoryKind::device ? R::Free(data) : R::HostFree(data));
    if (switch_device) (void)R::SetDevice(previous);
  }

 private:
  void* allocate_device(std::size_t bytes) {
    DeviceGuard<R> guard(index_);
    void* data = nullptr;
    check<R>("Malloc", R::Malloc(&data, bytes), " allocating ", bytes, " bytes of device memory on ", info_.name);
    return data;
  }

  // Page-locked, mapped into the device's address space, portable to every
  // device. The kernels read it through the host pointer, which needs unified
  // addressing: the device address must be the host address.
  void* allocate_pinned(std::size_t bytes) {
    DeviceGuard<R> guard(index_);
    void* data = nullptr;
    const auto status = R::HostAllocMapped(&data, bytes);
    if (status != R::success) {
      throw runtime_error<R>(R::host_alloc_call, status, " allocating ", bytes, " bytes of pinned host memory for ",
                             info_.name);
    }
    void* mapped = nullptr;
    const auto map_status = R::HostGetDevicePointer(&mapped, data, 0u);
    if (map_status != R::success || mapped != data) {
      (void)R::HostFree(data);
      if (map_status != R::success) throw runtime_error<R>("HostGetDevicePointer", map_status);
      fail("Device::allocate", "pinned host memory at ", data, " is mapped at device address ", mapped, " on ",
           info_.name, ": the kernels read pinned memory through the host pointer, which needs unified addressing");
    }
    return data;
  }

  // Pageable host memory, aligned like a device allocation; kernels never
  // read it, copies stage it through the runtime.
  static void* allocate_host(std::size_t bytes) {
    constexpr std::size_t alignment = 64;
    if (bytes > SIZE_MAX - alignment) return nullptr;
    return std::aligned_alloc(alignment, (bytes + alignment - 1) / alignment * alignment);
  }

  int index_;
  DeviceInfo info_;
};

template <class R>
void GpuGraph<R>::replay(Stream& stream) {
  GpuStream<R>& gpu = as_gpu_stream<R>(stream, "Graph::replay");
  if (gpu.device_index() != device_) fail("Graph::replay", "the graph was captured on device ", device_, ", the stream is on device ", gpu.device_index());
  DeviceGuard<R> guard(device_);
  check<R>("GraphLaunch", R::GraphLaunch(exec_, gpu.native()));
}

// Why no device of this runtime can be opened, or "" when one can.
template <class R>
std::string unavailable_reason() {
  int count = 0;
  const auto status = R::GetDeviceCount(&count);
  if (status != R::success) {
    (void)R::GetLastError();
    return detail::concat("no ", R::label, " device: ", R::prefix, "GetDeviceCount returned ", error_text<R>(status));
  }
  if (count <= 0) return detail::concat("no ", R::label, " device: ", R::prefix, "GetDeviceCount found 0 devices");
  return "";
}

template <class R>
const Kernels* compiled_kernels() {
  if constexpr (R::has_kernels) {
    return &R::kokkos_kernels();
  } else {
    return nullptr;
  }
}

template <class R>
std::shared_ptr<Device> open_device(int index) {
  const std::string reason = unavailable_reason<R>();
  if (!reason.empty()) fail("open_device", reason);
  int count = 0;
  check<R>("GetDeviceCount", R::GetDeviceCount(&count));
  if (index < 0 || index >= count) {
    fail("open_device", "the ", backend_name(R::backend), " backend has ", count, count == 1 ? " device" : " devices",
         " (indices 0 to ", count - 1, "), asked for index ", index);
  }
  typename R::device_prop_t prop{};
  check<R>("GetDeviceProperties", R::GetDeviceProperties(&prop, index), " (device ", index, ")");
  DeviceInfo info;
  info.backend = backend_name(R::backend);
  info.name = prop.name;
  info.architecture = R::architecture(prop);
  info.total_memory = prop.totalGlobalMem;
  info.index = index;
  // Kokkos is initialised on the device opened first, before its kernels exist.
  if constexpr (R::has_kernels) ensure_kokkos_initialized(index);
  return std::make_shared<GpuDevice<R>>(index, std::move(info), compiled_kernels<R>());
}

}  // namespace sparse_mla::gpu
