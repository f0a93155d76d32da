#include "sparse_mla/device.hpp"

#include "sparse_mla/error.hpp"
#include "sparse_mla/kokkos_runtime.hpp"
#include "kernels.hpp"

namespace sparse_mla {

const char* memory_kind_name(MemoryKind kind) {
  switch (kind) {
    case MemoryKind::device: return "device";
    case MemoryKind::pinned_host: return "pinned_host";
    case MemoryKind::host: return "host";
  }
  return "?";
}

const char* backend_name(Backend backend) {
  switch (backend) {
    case Backend::host: return "host";
    case Backend::cuda: return "cuda";
    case Backend::hip: return "hip";
  }
  return "?";
}

Buffer::Buffer(Buffer&& other) noexcept
    : device_(other.device_), data_(other.data_), bytes_(other.bytes_), kind_(other.kind_) {
  other.device_ = nullptr;
  other.data_ = nullptr;
  other.bytes_ = 0;
}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    release();
    device_ = other.device_;
    data_ = other.data_;
    bytes_ = other.bytes_;
    kind_ = other.kind_;
    other.device_ = nullptr;
    other.data_ = nullptr;
    other.bytes_ = 0;
  }
  return *this;
}

Buffer::~Buffer() { release(); }

void Buffer::release() noexcept {
  if (data_ != nullptr && device_ != nullptr) {
    device_->free_raw(data_, kind_);
    device_->frees_.fetch_add(1, std::memory_order_relaxed);
  }
  data_ = nullptr;
  bytes_ = 0;
}

Stream::~Stream() = default;

void Stream::begin_capture() {
  fail("Stream::begin_capture", "graph capture is not supported by the ", backend_name(device().backend()), " backend");
}

std::unique_ptr<Graph> Stream::end_capture() {
  fail("Stream::end_capture", "graph capture is not supported by the ", backend_name(device().backend()), " backend");
}

namespace {
void check_range(const char* where, const char* name, const Buffer& buffer, const Device& device,
                 std::size_t offset, std::size_t bytes) {
  if (bytes == 0) return;
  if (!buffer) fail(where, name, " is an empty buffer");
  if (buffer.device() != &device) {
    fail(where, name, " belongs to another device (", backend_name(buffer.device()->backend()), ") than the stream (",
         backend_name(device.backend()), ")");
  }
  if (offset > buffer.bytes() || bytes > buffer.bytes() - offset) {
    fail(where, name, " range [", offset, ", ", offset + bytes, ") is outside its ", buffer.bytes(), " bytes");
  }
}
}  // namespace

void Stream::copy(Buffer& dst, std::size_t dst_offset, const Buffer& src, std::size_t src_offset, std::size_t bytes) {
  check_range("Stream::copy", "dst", dst, device(), dst_offset, bytes);
  check_range("Stream::copy", "src", src, device(), src_offset, bytes);
  if (bytes == 0) return;
  copy_bytes(static_cast<char*>(dst.data()) + dst_offset, static_cast<const char*>(src.data()) + src_offset, bytes);
}

void Stream::fill(Buffer& dst, std::size_t offset, std::uint8_t value, std::size_t bytes) {
  check_range("Stream::fill", "dst", dst, device(), offset, bytes);
  if (bytes == 0) return;
  fill_bytes(static_cast<char*>(dst.data()) + offset, value, bytes);
}

Buffer Device::allocate(std::size_t bytes, MemoryKind kind) {
  if (bytes == 0) return Buffer(this, nullptr, 0, kind);
  allocations_.fetch_add(1, std::memory_order_relaxed);
  void* data = allocate_raw(bytes, kind);
  if (data == nullptr) {
    fail("Device::allocate", "could not allocate ", bytes, " bytes of ", memory_kind_name(kind), " memory on ",
         info().name);
  }
  return Buffer(this, data, bytes, kind);
}

std::unique_ptr<Stream> Device::create_stream() {
  std::unique_ptr<Stream> stream = make_stream();
  if (kernels_ != nullptr) kernels_->bind(*stream);
  return stream;
}

std::unique_ptr<Stream> Device::wrap_stream(void* native) {
  std::unique_ptr<Stream> stream = make_wrapped_stream(native);
  if (kernels_ != nullptr) {
    // Binding makes the stream's Kokkos instance, which allocates: a capture
    // forbids that, and Kokkos would abort the process on the error.
    if (stream->is_capturing()) {
      fail("Device::wrap_stream", "the native stream ", native,
           " is capturing a graph and has no kernels bound yet (binding allocates, which a capture forbids): "
           "wrap it, or run one call on it, before the capture begins");
    }
    kernels_->bind(*stream);
  }
  return stream;
}

std::unique_ptr<Event> Device::wrap_event(void* native) {
  if (native == nullptr) fail("Device::wrap_event", "the native event is null");
  return make_wrapped_event(native);
}

std::unique_ptr<Stream> Device::make_wrapped_stream(void*) {
  fail("Device::wrap_stream", "the ", backend_name(backend()),
       " backend has no native streams to wrap; use Device::create_stream");
}

std::unique_ptr<Event> Device::make_wrapped_event(void*) {
  fail("Device::wrap_event", "the ", backend_name(backend()),
       " backend has no native events to wrap; use Device::create_event");
}

const Kernels& Device::kernels() const {
  if (kernels_ == nullptr) {
    const std::string kokkos = kokkos_unavailable_reason();
    if (!kokkos.empty()) fail("Device::kernels", "the ", backend_name(backend()), " backend has no kernels: ", kokkos);
    fail("Device::kernels", "this build has no ", backend_name(backend()),
         " kernels (its Kokkos has no execution space for this backend); only the native layer was compiled");
  }
  return *kernels_;
}

DeviceActivity Device::activity() const {
  return DeviceActivity{allocations_.load(std::memory_order_relaxed), frees_.load(std::memory_order_relaxed),
                        host_synchronizations_.load(std::memory_order_relaxed)};
}

DeviceActivity operator-(const DeviceActivity& after, const DeviceActivity& before) {
  return DeviceActivity{after.allocations - before.allocations, after.frees - before.frees,
                        after.host_synchronizations - before.host_synchronizations};
}

std::string Device::execution_space() const { return kernels().execution_space(); }

namespace detail {
const Kernels& kernels_of(const Device& device) { return device.kernels(); }
}  // namespace detail

}  // namespace sparse_mla
