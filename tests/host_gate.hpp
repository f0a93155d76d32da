// Holds a host stream at one task until the gate opens (or gives up after
// 10 s), so that nothing queued behind it can run. A call queued while it is
// held must return without waiting for it: a host synchronisation inside the
// call would block until the gate gave up. GPU streams: no gate.
#pragma once

#include <atomic>
#include <chrono>
#include <future>
#include <memory>

#include "host/host_device.hpp"
#include "sparse_mla/device.hpp"

namespace sparse_mla::testing {

class HostGate {
 public:
  explicit HostGate(Stream& stream) : opened_(promise_.get_future().share()) {
    auto* host_stream = dynamic_cast<host::HostStream*>(&stream);
    if (host_stream == nullptr) return;
    auto passed = passed_;
    auto opened = opened_;
    host_stream->enqueue([passed, opened] {
      (void)opened.wait_for(std::chrono::seconds(10));
      passed->store(true);
    });
  }
  ~HostGate() { open(); }
  HostGate(const HostGate&) = delete;
  HostGate& operator=(const HostGate&) = delete;

  bool still_closed() const { return !passed_->load(); }
  void open() {
    if (!is_open_) promise_.set_value();
    is_open_ = true;
  }

 private:
  std::promise<void> promise_;
  std::shared_future<void> opened_;
  std::shared_ptr<std::atomic<bool>> passed_ = std::make_shared<std::atomic<bool>>(false);
  bool is_open_ = false;
};

}  // namespace sparse_mla::testing
