#include "host_device.hpp"
#include "sparse_mla/kokkos_runtime.hpp"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>
#include <random>
#include <string>

#include "sparse_mla/error.hpp"

namespace sparse_mla::host {

const Kernels& host_kernels();  // host_kernels.cpp


HostStream& as_host_stream(Stream& stream, const char* where) {
  auto* host = dynamic_cast<HostStream*>(&stream);
  if (host == nullptr) fail(where, "the stream belongs to the ", backend_name(stream.device().backend()), " backend, not host");
  return *host;
}

HostEvent& as_host_event(Event& event, const char* where) {
  auto* host = dynamic_cast<HostEvent*>(&event);
  if (host == nullptr) fail(where, "the event belongs to the ", backend_name(event.device().backend()), " backend, not host");
  return *host;
}


void Marker::set() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    time_ = std::chrono::steady_clock::now();
    set_ = true;
  }
  cv_.notify_all();
}

std::chrono::steady_clock::time_point Marker::time() {
  std::lock_guard<std::mutex> lock(mutex_);
  return time_;
}

bool Marker::is_set() {
  std::lock_guard<std::mutex> lock(mutex_);
  return set_;
}

void Marker::wait() {
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait(lock, [this] { return set_; });
}

HostStream::HostStream(HostDevice& device) : device_(device) { worker_ = std::thread([this] { run(); }); }

HostStream::~HostStream() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  has_work_.notify_all();
  worker_.join();  // the worker drains the queue before it stops
}

Device& HostStream::device() const { return device_; }

void HostStream::run() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      has_work_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and drained
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    random_delay();
    if (const std::uint32_t fixed = fixed_delay_us_.load(std::memory_order_relaxed)) {
      std::this_thread::sleep_for(std::chrono::microseconds(fixed));
    }
    std::exception_ptr error;
    try {
      task();
    } catch (...) {
      error = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (error && !error_) error_ = error;
      ++finished_;
    }
    drained_.notify_all();
  }
}

void HostStream::enqueue(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(std::move(task));
    ++queued_;
  }
  has_work_.notify_one();
}

std::shared_ptr<Marker> HostStream::mark() {
  auto marker = std::make_shared<Marker>();
  enqueue([marker] { marker->set(); });
  return marker;
}

void HostStream::copy_bytes(void* dst, const void* src, std::size_t bytes) {
  enqueue([dst, src, bytes] { std::memmove(dst, src, bytes); });
}

void HostStream::fill_bytes(void* dst, std::uint8_t value, std::size_t bytes) {
  enqueue([dst, value, bytes] { std::memset(dst, value, bytes); });
}

void HostStream::wait(Event& event) {
  std::shared_ptr<Marker> marker = as_host_event(event, "Stream::wait(Event)").last_record();
  if (marker) enqueue([marker] { marker->wait(); });
}

void HostStream::wait(Stream& other) {
  HostStream& source = as_host_stream(other, "Stream::wait(Stream)");
  if (&source == this) return;  // in-order already
  std::shared_ptr<Marker> marker = source.mark();
  enqueue([marker] { marker->wait(); });
}

void HostStream::synchronize() {
  device_.note_host_synchronization();
  std::unique_lock<std::mutex> lock(mutex_);
  const std::uint64_t target = queued_;
  drained_.wait(lock, [this, target] { return finished_ >= target; });
  if (error_) {
    std::exception_ptr error = error_;
    error_ = nullptr;
    std::rethrow_exception(error);
  }
}

void HostEvent::record(Stream& stream) {
  std::shared_ptr<Marker> marker = as_host_stream(stream, "Event::record").mark();
  std::lock_guard<std::mutex> lock(mutex_);
  marker_ = std::move(marker);
}

std::shared_ptr<Marker> HostEvent::last_record() {
  std::lock_guard<std::mutex> lock(mutex_);
  return marker_;
}

bool HostEvent::query() {
  std::shared_ptr<Marker> marker = last_record();
  return !marker || marker->is_set();
}

void HostEvent::synchronize() {
  device_.note_host_synchronization();
  std::shared_ptr<Marker> marker = last_record();
  if (marker) marker->wait();
}

Device& HostEvent::device() const { return device_; }

double HostEvent::elapsed_ms(Event& start) {
  HostEvent& begin = as_host_event(start, "Event::elapsed_ms");
  if (!timing_ || !begin.timing_) fail("Event::elapsed_ms", "both events must be created with timing enabled");
  std::shared_ptr<Marker> from = begin.last_record();
  std::shared_ptr<Marker> to = last_record();
  if (!from || !to) fail("Event::elapsed_ms", "both events must have been recorded");
  if (!from->is_set() || !to->is_set()) fail("Event::elapsed_ms", "the recorded work has not completed yet");
  return std::chrono::duration<double, std::milli>(to->time() - from->time()).count();
}

// Without Kokkos (a GPU-enabled Kokkos on a machine without its GPU) the
// host device still has streams, events and memory; its kernels say why not.
HostDevice::HostDevice() : Device(kokkos_unavailable_reason().empty() ? &host_kernels() : nullptr) {}

DeviceInfo HostDevice::info() const {
  DeviceInfo info;
  info.backend = "host";
  const unsigned threads = std::thread::hardware_concurrency();
  info.name = "host CPU (" + std::to_string(threads) + " hardware threads)";
#if defined(__x86_64__)
  info.architecture = "x86_64";
#elif defined(__aarch64__)
  info.architecture = "aarch64";
#else
  info.architecture = "unknown";
#endif
  info.total_memory = 0;
  info.index = 0;
  return info;
}

std::unique_ptr<Event> HostDevice::create_event(bool timing) { return std::make_unique<HostEvent>(*this, timing); }

std::unique_ptr<Stream> HostDevice::make_stream() { return std::make_unique<HostStream>(*this); }

// 64-byte alignment, as wide as a GPU allocation's guarantee that the kernels
// rely on for 16-byte loads.
void* HostDevice::allocate_raw(std::size_t bytes, MemoryKind /*kind*/) {
  constexpr std::size_t alignment = 64;
  const std::size_t rounded = (bytes + alignment - 1) / alignment * alignment;
  return std::aligned_alloc(alignment, rounded);
}

void HostDevice::free_raw(void* data, MemoryKind /*kind*/) noexcept { std::free(data); }

std::shared_ptr<Device> open_host_device(int index) {
  if (index != 0) fail("open_device", "the host backend has one device (index 0), asked for index ", index);
  return std::make_shared<HostDevice>();
}

}  // namespace sparse_mla::host
