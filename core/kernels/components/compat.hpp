// Which form of the device primitives a compilation pass builds: the one
// place that tells CUDA, HIP and portable Kokkos apart (as vLLM's
// csrc/cuda_compat.h does). The primitives beside this header (Ginkgo's
// common/cuda_hip/components layout) test these forms; the kernels call the
// primitives and contain no backend #ifdef (they branch on device::form with
// `if constexpr` where a kernel needs to).
//
// Each primitive has up to three forms, picked per compilation pass:
//   cuda      nvcc's device pass (__CUDA_ARCH__): warp intrinsics, PTX hints;
//   hip       hipcc's device pass (__HIP_DEVICE_COMPILE__): the same
//             intrinsics with HIP's names, 64-bit wavefront ballots;
//   portable  everything else (host spaces, and every pass of a build
//             configured with SPARSE_MLA_PORTABLE_PRIMITIVES=ON): Kokkos team
//             operations and atomics, plain loads and stores, integer
//             arithmetic for the conversions.
// The portable form computes the same results bit for bit; the native forms
// are shorter instruction sequences for the same thing.
#pragma once

#include <Kokkos_Core.hpp>

// SPARSE_MLA_FORM_CUDA and SPARSE_MLA_FORM_HIP: for the primitives' headers
// only.
#if defined(SPARSE_MLA_PORTABLE_PRIMITIVES)
#define SPARSE_MLA_FORM_CUDA 0
#define SPARSE_MLA_FORM_HIP 0
#elif defined(__CUDA_ARCH__)
#define SPARSE_MLA_FORM_CUDA 1
#define SPARSE_MLA_FORM_HIP 0
#elif defined(__HIP_DEVICE_COMPILE__)
#define SPARSE_MLA_FORM_CUDA 0
#define SPARSE_MLA_FORM_HIP 1
#else
#define SPARSE_MLA_FORM_CUDA 0
#define SPARSE_MLA_FORM_HIP 0
#endif

// A loop the device compilers must not unroll (#pragma unroll 1), for loops
// whose body's loads must follow the previous iteration's stores. Host
// compilers take no such pragma (g++ warns on it).
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
#define SPARSE_MLA_NO_UNROLL _Pragma("unroll 1")
#else
#define SPARSE_MLA_NO_UNROLL
#endif

// Types that may alias any other (g++ needs the attribute to read a buffer of
// int32 or bytes through Int4; the device compilers do not take it there).
#if defined(__GNUC__) && !defined(__CUDA_ARCH__) && !defined(__HIP_DEVICE_COMPILE__)
#define SPARSE_MLA_MAY_ALIAS __attribute__((__may_alias__))
#else
#define SPARSE_MLA_MAY_ALIAS
#endif

namespace sparse_mla::kernels::device {

// Which form this pass compiles. Device code may branch on it with
// `if constexpr`; host code must not (nvcc's host pass sees `portable`): it
// tests portable_build.
enum class Form { portable, cuda, hip };
#if SPARSE_MLA_FORM_CUDA
inline constexpr Form form = Form::cuda;
#elif SPARSE_MLA_FORM_HIP
inline constexpr Form form = Form::hip;
#else
inline constexpr Form form = Form::portable;
#endif

// The same in every pass: whether the build was configured to run the
// portable forms on GPUs too (SPARSE_MLA_PORTABLE_PRIMITIVES=ON).
#if defined(SPARSE_MLA_PORTABLE_PRIMITIVES)
inline constexpr bool portable_build = true;
#else
inline constexpr bool portable_build = false;
#endif

}  // namespace sparse_mla::kernels::device
