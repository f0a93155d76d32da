// Debug switch of the host backend: each task a host stream runs first
// sleeps a random time in [0, max_delay_us) microseconds, so that a missing
// wait between streams shows up as a wrong result instead of passing by luck.
// Starts from the environment variable SPARSE_MLA_HOST_DELAY_US (0 = off).
#pragma once

#include <cstdint>

namespace sparse_mla::host {

void set_debug_delay_us(std::uint32_t max_delay_us);
std::uint32_t debug_delay_us();

}  // namespace sparse_mla::host
