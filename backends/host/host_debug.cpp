// The host backend's debug delay (sparse_mla/host_debug.hpp).
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <random>
#include <thread>

#include "host_device.hpp"
#include "sparse_mla/error.hpp"
#include "sparse_mla/host_debug.hpp"

namespace sparse_mla::host {

namespace {

std::uint32_t delay_from_environment() {
  const char* value = std::getenv("SPARSE_MLA_HOST_DELAY_US");
  if (value == nullptr || *value == '\0') return 0;
  char* end = nullptr;
  const unsigned long parsed = std::strtoul(value, &end, 10);
  if (end == value || *end != '\0' || parsed > 10'000'000UL) {
    fail("SPARSE_MLA_HOST_DELAY_US", "must be a number of microseconds up to 10000000, got '", value, "'");
  }
  return static_cast<std::uint32_t>(parsed);
}

std::atomic<std::uint32_t>& delay_setting() {
  static std::atomic<std::uint32_t> delay{delay_from_environment()};
  return delay;
}

}  // namespace

void random_delay() {
  const std::uint32_t max_delay = delay_setting().load(std::memory_order_relaxed);
  if (max_delay == 0) return;
  thread_local std::minstd_rand rng{std::random_device{}()};
  std::this_thread::sleep_for(std::chrono::microseconds(rng() % max_delay));
}

void set_debug_delay_us(std::uint32_t max_delay_us) { delay_setting().store(max_delay_us); }
std::uint32_t debug_delay_us() { return delay_setting().load(); }

}  // namespace sparse_mla::host
