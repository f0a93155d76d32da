// The operations a backend must run, as one interface.
//
// Every backend implements it with the same Kokkos sources in core/kernels/,
// instantiated for its execution space (core/kernels/kokkos_kernels.hpp).
// Arguments are plain views (pointers, sizes, strides in elements) that the
// public entry points have already validated: kernels never allocate, never
// synchronise and never check.
#pragma once

#include <cstdint>

namespace sparse_mla {

class Stream;

struct FillI32Args {
  std::int32_t* data;
  std::int64_t count;
  std::int32_t value;
};

class Kernels {
 public:
  virtual ~Kernels() = default;
  // Kokkos's name of the execution space: "Serial", "OpenMP", "Cuda", "HIP".
  virtual const char* execution_space() const = 0;
  // Binds an execution-space instance to the stream (its kernel context).
  virtual void bind(Stream& stream) const = 0;

  // data[0 .. count) = value: poisoning outputs, clearing slot maps.
  virtual void fill_i32(Stream& stream, const FillI32Args& args) const = 0;
};

}  // namespace sparse_mla
