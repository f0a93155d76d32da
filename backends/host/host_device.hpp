// The host backend: the device is this CPU, "device" and "pinned_host" memory
// are aligned host memory, and every stream is a real asynchronous in-order
// queue served by its own worker thread. Events and waits really hold queues
// back, so CI without a GPU exercises the same ordering logic as a GPU would.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "sparse_mla/device.hpp"
#include "sparse_mla/host_debug.hpp"

namespace sparse_mla::host {

// A completion point: set once by the queue that reaches it.
class Marker {
 public:
  void set();
  bool is_set();
  void wait();
  // When set() ran (valid once set).
  std::chrono::steady_clock::time_point time();

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool set_ = false;
  std::chrono::steady_clock::time_point time_{};
};

class HostDevice;

class HostStream final : public Stream {
 public:
  explicit HostStream(HostDevice& device);
  ~HostStream() override;

  Device& device() const override;
  void copy_bytes(void* dst, const void* src, std::size_t bytes) override;
  void fill_bytes(void* dst, std::uint8_t value, std::size_t bytes) override;
  void wait(Event& event) override;
  void wait(Stream& other) override;
  void synchronize() override;
  void* native_handle() const override { return nullptr; }

  // Queues `task` behind everything queued so far. An exception a task throws
  // is kept and rethrown by the next synchronize(), like a sticky GPU error.
  void enqueue(std::function<void()> task);
  // Queues a marker that is set when the queue reaches it.
  std::shared_ptr<Marker> mark();
  // Debug: every task of this stream first sleeps `us` microseconds (on top
  // of SPARSE_MLA_HOST_DELAY_US), so that this one stream lags behind the
  // others and work that waits for too little of it runs too early, every
  // time. 0 = off.
  void set_debug_delay_us(std::uint32_t us) { fixed_delay_us_.store(us); }

 private:
  void run();

  HostDevice& device_;
  std::mutex mutex_;
  std::condition_variable has_work_;
  std::condition_variable drained_;
  std::deque<std::function<void()>> queue_;
  std::uint64_t queued_ = 0;
  std::uint64_t finished_ = 0;
  bool stopping_ = false;
  std::atomic<std::uint32_t> fixed_delay_us_{0};
  std::exception_ptr error_;
  std::thread worker_;
};

class HostEvent final : public Event {
 public:
  HostEvent(HostDevice& device, bool timing) : device_(device), timing_(timing) {}
  void record(Stream& stream) override;
  bool query() override;
  void synchronize() override;
  Device& device() const override;
  double elapsed_ms(Event& start) override;
  bool timing() const { return timing_; }
  // The completion point of the last record (nullptr when never recorded).
  std::shared_ptr<Marker> last_record();

 private:
  HostDevice& device_;
  bool timing_;
  std::mutex mutex_;
  std::shared_ptr<Marker> marker_;
};

class HostDevice final : public Device {
 public:
  HostDevice();
  Backend backend() const override { return Backend::host; }
  DeviceInfo info() const override;
  std::unique_ptr<Event> create_event(bool timing) override;

 protected:
  void* allocate_raw(std::size_t bytes, MemoryKind kind) override;
  void free_raw(void* data, MemoryKind kind) noexcept override;
  std::unique_ptr<Stream> make_stream() override;
};

std::shared_ptr<Device> open_host_device(int index);

// Sleeps the debug delay of sparse_mla/host_debug.hpp (host_debug.cpp);
// each task of a host stream calls it first.
void random_delay();

// The host object behind a Stream or Event of this backend; throws Error
// naming `where` when it belongs to another backend.
HostStream& as_host_stream(Stream& stream, const char* where);
HostEvent& as_host_event(Event& event, const char* where);

}  // namespace sparse_mla::host
