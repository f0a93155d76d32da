# The GPU backends' build logic, written once for CUDA and HIP:
#   sparse_mla_find_cuda_runtime()   CUDA::cudart (FindCUDAToolkit)
#   sparse_mla_find_hip_runtime()    sparse_mla::hip_runtime (libamdhip64 and its headers)
#   sparse_mla_add_gpu_backend(...)  a backend's sources, definitions and checks
# The two find functions are also used by the installed package config, so
# that a downstream build links the same runtime the library was built with.

# The CUDA toolkit: nvcc on PATH, CUDAToolkit_ROOT, CUDA_PATH, or
# /usr/local/cuda, in FindCUDAToolkit's order. Only the runtime library and
# its headers are used; nothing is compiled by nvcc unless Kokkos asks for it.
macro(sparse_mla_find_cuda_runtime)
  find_package(CUDAToolkit REQUIRED)
endmacro()

# The HIP runtime. hip-config.cmake from Debian's libamdhip64-dev (HIP 5.2)
# cannot be used with g++: it requires hipcc, hipconfig, the AMD device
# libraries and clang's runtime, and stops with a fatal error without them.
# Only the runtime library and its headers are needed here, and they are found
# directly (ROCm under $ROCM_PATH, $HIP_PATH or /opt/rocm; Debian under /usr).
function(sparse_mla_find_hip_runtime)
  if(TARGET sparse_mla::hip_runtime)
    return()
  endif()
  set(_hints ENV ROCM_PATH ENV HIP_PATH /opt/rocm)
  find_path(SPARSE_MLA_HIP_INCLUDE_DIR hip/hip_runtime_api.h HINTS ${_hints} PATH_SUFFIXES include)
  find_library(SPARSE_MLA_HIP_LIBRARY amdhip64 HINTS ${_hints} PATH_SUFFIXES lib lib64)
  if(NOT SPARSE_MLA_HIP_INCLUDE_DIR OR NOT SPARSE_MLA_HIP_LIBRARY)
    message(FATAL_ERROR "sparse-mla: the HIP runtime was not found (hip/hip_runtime_api.h: ${SPARSE_MLA_HIP_INCLUDE_DIR}, "
                        "libamdhip64: ${SPARSE_MLA_HIP_LIBRARY}). Install ROCm (and set ROCM_PATH if it is not in "
                        "/opt/rocm) or, on Debian/Ubuntu, libamdhip64-dev.")
  endif()
  add_library(sparse_mla::hip_runtime UNKNOWN IMPORTED GLOBAL)
  # An imported target's include directories are system directories: the
  # runtime headers do not see our warning flags.
  set_target_properties(sparse_mla::hip_runtime PROPERTIES
    IMPORTED_LOCATION "${SPARSE_MLA_HIP_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${SPARSE_MLA_HIP_INCLUDE_DIR}")
  message(STATUS "sparse-mla: HIP runtime ${SPARSE_MLA_HIP_LIBRARY}")
endfunction()

# The GPU targets the found Kokkos compiles for, in the runtime's own
# spelling ("sm_90", "gfx942"), in <out>; empty when Kokkos does not say.
function(_sparse_mla_kokkos_gpu_archs kokkos_backend out)
  set(_archs "")
  if(kokkos_backend STREQUAL "CUDA")
    if(Kokkos_CUDA_ARCHITECTURES)  # Kokkos 4: "90"
      foreach(_a IN LISTS Kokkos_CUDA_ARCHITECTURES)
        list(APPEND _archs "sm_${_a}")
      endforeach()
    else()  # Kokkos 3: Kokkos_ARCH lists names such as HOPPER90
      foreach(_a IN LISTS Kokkos_ARCH)
        if(_a MATCHES "^(KEPLER|MAXWELL|PASCAL|VOLTA|TURING|AMPERE|ADA|HOPPER|BLACKWELL)([0-9]+)$")
          list(APPEND _archs "sm_${CMAKE_MATCH_2}")
        endif()
      endforeach()
    endif()
  else()
    if(Kokkos_HIP_ARCHITECTURES)  # Kokkos 4: "gfx942"
      set(_archs ${Kokkos_HIP_ARCHITECTURES})
    else()  # AMD_GFX942, VEGA90A, ...
      foreach(_a IN LISTS Kokkos_ARCH)
        if(_a MATCHES "^AMD_(GFX[0-9A-F]+)")
          string(TOLOWER "${CMAKE_MATCH_1}" _gfx)
          list(APPEND _archs "${_gfx}")
        elseif(_a MATCHES "^VEGA([0-9A-F]+)$")
          string(TOLOWER "gfx${CMAKE_MATCH_1}" _gfx)
          list(APPEND _archs "${_gfx}")
        endif()
      endforeach()
    endif()
  endif()
  set(${out} "${_archs}" PARENT_SCOPE)
endfunction()

# sparse_mla_add_gpu_backend(<api> <KOKKOS_BACKEND> <runtime target> <arch variable>)
# Called from backends/<api>/CMakeLists.txt. Always compiles the native layer
# (<api>_device.cpp, with the host compiler when Kokkos does not need another);
# compiles <api>_kernels.cpp when the found Kokkos has that execution space,
# and then checks that Kokkos compiles for the GPU that <arch variable> names.
function(sparse_mla_add_gpu_backend api kokkos_backend runtime arch_variable)
  string(TOUPPER "${api}" _API)
  target_sources(sparse_mla PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/${api}_device.cpp)
  target_link_libraries(sparse_mla PRIVATE ${runtime})
  target_compile_definitions(sparse_mla PUBLIC SPARSE_MLA_WITH_${_API})

  if(NOT Kokkos_ENABLE_${kokkos_backend})
    target_compile_definitions(sparse_mla PRIVATE SPARSE_MLA_${_API}_KERNELS=0)
    # (With SPARSE_MLA_REQUIRE_GPU_KERNELS, cmake/SparseMlaKokkos.cmake has made sure it has.)
    set(_why "${SPARSE_MLA_KOKKOS_ORIGIN} has no ${kokkos_backend} execution space")
    message(STATUS "sparse-mla: ${api} backend: native layer only (${_why}; Device::kernels() throws)")
    return()
  endif()

  target_sources(sparse_mla PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/${api}_kernels.cpp)
  if(_API STREQUAL "CUDA" AND SPARSE_MLA_CUDA_LINEINFO)
    # On the kernels' translation unit, which Kokkos' launcher compiles with
    # nvcc_wrapper. Not in CMAKE_CXX_FLAGS: CMake's compiler checks run the
    # plain host compiler, which takes -lineinfo for a library to link.
    set_property(SOURCE ${CMAKE_CURRENT_SOURCE_DIR}/${api}_kernels.cpp TARGET_DIRECTORY sparse_mla
                 APPEND PROPERTY COMPILE_OPTIONS -lineinfo)
  endif()
  if(_API STREQUAL "CUDA" AND SPARSE_MLA_WERROR AND Kokkos_CXX_COMPILER_ID STREQUAL "NVIDIA")
    # nvcc's own diagnostics (a host function called from device code, which
    # it compiles into code that does not run) are not the host compiler's:
    # -Werror does not reach them. nvcc_wrapper passes --Werror=... to nvcc.
    set_property(SOURCE ${CMAKE_CURRENT_SOURCE_DIR}/${api}_kernels.cpp TARGET_DIRECTORY sparse_mla
                 APPEND PROPERTY COMPILE_OPTIONS --Werror=all-warnings)
  endif()
  target_compile_definitions(sparse_mla PRIVATE SPARSE_MLA_${_API}_KERNELS=1)
  _sparse_mla_kokkos_gpu_archs(${kokkos_backend} _archs)
  set(_wanted "${${arch_variable}}")
  if(_wanted AND _archs AND NOT _wanted IN_LIST _archs)
    message(FATAL_ERROR "sparse-mla: ${arch_variable} is ${_wanted}, but ${SPARSE_MLA_KOKKOS_ORIGIN} compiles for ${_archs} "
                        "(Kokkos fixes the GPU when it is built): set -D${arch_variable}=${_archs}, point Kokkos_ROOT at a "
                        "Kokkos built with the matching -DKokkos_ARCH_<NAME>=ON, or unset Kokkos_ROOT to build Kokkos with the project")
  endif()
  if(NOT _archs)
    set(_archs "unknown")
  endif()
  message(STATUS "sparse-mla: ${api} backend: native layer and Kokkos ${kokkos_backend} kernels for ${_archs}")
endfunction()
