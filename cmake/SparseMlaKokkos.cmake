# Kokkos for this build: an installed Kokkos where it has what the build
# needs, else Kokkos built with the project (FetchContent, like kokkos-fft's
# internal Kokkos) for the preset's backend and GPU.
#
#   Kokkos_ROOT                 an installed Kokkos (find_package); it must have the backend
#                               the build needs, or the configure stops and says so
#   SPARSE_MLA_INTERNAL_KOKKOS  build Kokkos with the project even where an installed one has it
#   SPARSE_MLA_KOKKOS_SOURCE    what the project builds: a Kokkos release tarball or an unpacked
#                               folder (default: the environment variable of that name, else
#                               kokkos-4.6.01.tar.xz in SPARSE_MLA_DEPS_DIR, else tag 4.6.01
#                               from GitHub)
#
# The backend needed: CUDA or HIP where SPARSE_MLA_REQUIRE_GPU_KERNELS is on
# (the cuda and hip presets), built for SPARSE_MLA_CUDA_ARCH or
# SPARSE_MLA_HIP_ARCH; none otherwise (an installed Kokkos of any backend
# does; the one built here has Kokkos's default host backend, Serial).
# Kokkos built here carries the project's patches (cmake/patches), is
# static and position-independent, and is installed with the library.
#
# Sets, as an installed Kokkos's package does, Kokkos::kokkos, Kokkos_VERSION,
# Kokkos_ENABLE_<BACKEND> and Kokkos_CXX_COMPILER_ID; and
# SPARSE_MLA_KOKKOS_ORIGIN (where Kokkos comes from, for messages) and
# SPARSE_MLA_INTERNAL_KOKKOS_BUILT.
#
# CUDA: the compiler stays the host compiler (g++); Kokkos's launcher
# (kokkos_launch_compiler, set on RULE_LAUNCH_COMPILE by an installed Kokkos's
# package or by Kokkos built here) sends every compile and link that uses
# Kokkos to its nvcc_wrapper. nvcc_wrapper runs $CUDA_ROOT/bin/nvcc, else the
# nvcc on PATH: the launcher is given the toolkit FindCUDAToolkit found as
# CUDA_ROOT, so PATH need not name it. Such a build does not use ccache: as the
# compiler launcher, Kokkos's launcher would run it instead of nvcc_wrapper,
# and in front of nvcc it caches nothing (ccache 4.7 misreads nvcc_wrapper's
# -Xcompiler and refuses its separate -M step).

find_package(Threads REQUIRED)
include(FetchContent)

option(SPARSE_MLA_INTERNAL_KOKKOS "Build Kokkos with the project even where an installed Kokkos has the backend needed" OFF)
set(SPARSE_MLA_KOKKOS_SOURCE "$ENV{SPARSE_MLA_KOKKOS_SOURCE}" CACHE PATH
  "Kokkos source to build with the project: a release tarball or an unpacked folder (empty: kokkos-4.6.01.tar.xz in SPARSE_MLA_DEPS_DIR, else tag 4.6.01 from GitHub)")
set(SPARSE_MLA_KOKKOS_GIT_TAG 1b1383c6001f3bfe9fe309ca923c2d786600cc79)  # tag 4.6.01
set(SPARSE_MLA_KOKKOS_RELEASE 4.6.01)

# The GPUs Kokkos 4.6 builds for, by its Kokkos_ARCH_<NAME> (cmake/kokkos_arch.cmake).
set(_sparse_mla_kokkos_cuda_archs KEPLER30 KEPLER32 KEPLER35 KEPLER37 MAXWELL50 MAXWELL52 MAXWELL53 PASCAL60
  PASCAL61 VOLTA70 VOLTA72 TURING75 AMPERE80 AMPERE86 ADA89 HOPPER90 BLACKWELL100 BLACKWELL120)
set(_sparse_mla_kokkos_hip_archs AMD_GFX906 AMD_GFX908 AMD_GFX90A AMD_GFX940 AMD_GFX942 AMD_GFX942_APU AMD_GFX1030
  AMD_GFX1100 AMD_GFX1103)

# The Kokkos_ARCH_<NAME> of GPU `arch` (sm_90, gfx942) in <out>; stops when Kokkos knows no such GPU.
function(_sparse_mla_kokkos_arch_name backend arch arch_variable out)
  set(_name "")
  if(backend STREQUAL "CUDA")
    if(arch MATCHES "^sm_([0-9]+)$")
      set(_cc "${CMAKE_MATCH_1}")
      foreach(_candidate IN LISTS _sparse_mla_kokkos_cuda_archs)
        if(_candidate MATCHES "^[A-Z]+${_cc}$")
          set(_name "${_candidate}")
        endif()
      endforeach()
    endif()
    set(_known "${_sparse_mla_kokkos_cuda_archs}")
    list(TRANSFORM _known REPLACE "^[A-Z]+" "sm_")
  else()
    string(TOUPPER "AMD_${arch}" _candidate)
    if(_candidate IN_LIST _sparse_mla_kokkos_hip_archs)
      set(_name "${_candidate}")
    endif()
    set(_known "${_sparse_mla_kokkos_hip_archs}")
    list(TRANSFORM _known REPLACE "^AMD_GFX" "gfx")
    list(TRANSFORM _known TOLOWER)
  endif()
  if(NOT _name)
    list(JOIN _known " " _known)
    message(FATAL_ERROR "sparse-mla: ${arch_variable} is '${arch}', a GPU Kokkos ${SPARSE_MLA_KOKKOS_RELEASE} does not build for (it knows ${_known})")
  endif()
  set(${out} "${_name}" PARENT_SCOPE)
endfunction()

# Stops, in one line, when the compiler cannot compile for `arch`.
function(_sparse_mla_check_compiler_arch backend arch arch_variable)
  set(_key "${backend};${arch};${CMAKE_CXX_COMPILER};${CUDAToolkit_NVCC_EXECUTABLE}")
  if(_SPARSE_MLA_COMPILER_ARCH_CHECKED STREQUAL _key)
    return()
  endif()
  if(backend STREQUAL "CUDA")
    execute_process(COMMAND "${CUDAToolkit_NVCC_EXECUTABLE}" --list-gpu-code OUTPUT_VARIABLE _codes ERROR_QUIET)
    string(REGEX REPLACE "[\r\n]+" " " _codes "${_codes}")
    string(STRIP "${_codes}" _codes)
    if(NOT " ${_codes} " MATCHES " ${arch} ")
      message(FATAL_ERROR "sparse-mla: ${arch_variable} is ${arch}, which nvcc ${CUDAToolkit_VERSION} (${CUDAToolkit_NVCC_EXECUTABLE}) does not compile for (it knows ${_codes})")
    endif()
  else()
    set(_probe "${PROJECT_BINARY_DIR}/CMakeFiles/sparse-mla-hip-arch.cpp")
    file(WRITE "${_probe}" "")
    execute_process(COMMAND "${CMAKE_CXX_COMPILER}" --offload-arch=${arch} -x hip -c "${_probe}" -o "${_probe}.o"
                    RESULT_VARIABLE _rc OUTPUT_QUIET ERROR_VARIABLE _err)
    if(NOT _rc EQUAL 0)
      string(REGEX MATCH "error: [^;\n]*" _err "${_err}")
      message(FATAL_ERROR "sparse-mla: ${arch_variable} is ${arch}, which ${CMAKE_CXX_COMPILER} (${CMAKE_CXX_COMPILER_ID} ${CMAKE_CXX_COMPILER_VERSION}) does not compile for (${_err}); gfx942 needs ROCm 5.7 or later, gfx90a (MI200) works with Debian's hipcc")
    endif()
  endif()
  set(_SPARSE_MLA_COMPILER_ARCH_CHECKED "${_key}" CACHE INTERNAL "")
endfunction()

# The CUDA toolkit's root, for Kokkos's nvcc_wrapper (CUDA_ROOT), in <out>.
function(_sparse_mla_cuda_root out)
  get_filename_component(_bin "${CUDAToolkit_NVCC_EXECUTABLE}" DIRECTORY)
  get_filename_component(_root "${_bin}" DIRECTORY)
  set(${out} "${_root}" PARENT_SCOPE)
endfunction()

# Gives Kokkos's launcher (the global RULE_LAUNCH_COMPILE and RULE_LAUNCH_LINK) CUDA_ROOT.
function(_sparse_mla_route_kokkos_launcher root)
  foreach(_rule RULE_LAUNCH_COMPILE RULE_LAUNCH_LINK)
    get_property(_launch GLOBAL PROPERTY ${_rule})
    if(_launch MATCHES "kokkos_launch_compiler" AND NOT _launch MATCHES "CUDA_ROOT=")
      set_property(GLOBAL PROPERTY ${_rule} "env CUDA_ROOT=${root} ${_launch}")
    endif()
  endforeach()
endfunction()

# The CUDA toolkit's nvcc, or one line saying it is missing.
macro(_sparse_mla_require_nvcc)
  find_package(CUDAToolkit QUIET)
  if(NOT CUDAToolkit_NVCC_EXECUTABLE OR NOT EXISTS "${CUDAToolkit_NVCC_EXECUTABLE}")
    message(FATAL_ERROR "sparse-mla: the CUDA kernels need the CUDA toolkit's nvcc, which is neither on PATH nor in /usr/local/cuda/bin (install the toolkit, or set CUDAToolkit_ROOT)")
  endif()
endmacro()

# ccache as the compiler launcher, where Kokkos's own launcher does not run the compiles.
macro(_sparse_mla_ccache_launcher)
  if(SPARSE_MLA_CCACHE AND SPARSE_MLA_CCACHE_PROGRAM AND NOT CMAKE_CXX_COMPILER_LAUNCHER)
    set(CMAKE_CXX_COMPILER_LAUNCHER "${SPARSE_MLA_CCACHE_PROGRAM}")
  endif()
endmacro()

# Kokkos built with the project for `backend` (CUDA, HIP, or empty: the host).
macro(_sparse_mla_build_kokkos backend)
  if(SPARSE_MLA_KOKKOS_SOURCE)
    get_filename_component(_source "${SPARSE_MLA_KOKKOS_SOURCE}" ABSOLUTE BASE_DIR "${PROJECT_SOURCE_DIR}")
    if(NOT EXISTS "${_source}")
      message(FATAL_ERROR "sparse-mla: SPARSE_MLA_KOKKOS_SOURCE is ${_source}, which does not exist (a Kokkos release tarball or an unpacked folder)")
    endif()
    set(_fetch URL "${_source}" DOWNLOAD_EXTRACT_TIMESTAMP TRUE)
  elseif(SPARSE_MLA_DEPS_DIR AND EXISTS "${SPARSE_MLA_DEPS_DIR}/kokkos-${SPARSE_MLA_KOKKOS_RELEASE}.tar.xz")
    set(_source "${SPARSE_MLA_DEPS_DIR}/kokkos-${SPARSE_MLA_KOKKOS_RELEASE}.tar.xz")
    set(_fetch URL "${_source}" DOWNLOAD_EXTRACT_TIMESTAMP TRUE)
  else()
    set(_source "https://github.com/kokkos/kokkos (tag ${SPARSE_MLA_KOKKOS_RELEASE})")
    set(_fetch GIT_REPOSITORY https://github.com/kokkos/kokkos.git GIT_TAG ${SPARSE_MLA_KOKKOS_GIT_TAG})
  endif()
  FetchContent_Declare(kokkos ${_fetch}
    PATCH_COMMAND "${CMAKE_COMMAND}" -DSOURCE_DIR=<SOURCE_DIR> -DPATCH_DIR=${CMAKE_CURRENT_LIST_DIR}/patches
                  -P "${CMAKE_CURRENT_LIST_DIR}/SparseMlaPatchKokkos.cmake")

  set(Kokkos_ENABLE_ROCTHRUST OFF CACHE BOOL "Kokkos: rocThrust (Kokkos::sort on HIP; the project does not use it)")
  foreach(_backend CUDA HIP)
    if(_backend STREQUAL "${backend}")
      set(Kokkos_ENABLE_${_backend} ON CACHE BOOL "Kokkos: the ${_backend} backend" FORCE)
    else()
      set(Kokkos_ENABLE_${_backend} OFF CACHE BOOL "Kokkos: the ${_backend} backend" FORCE)
    endif()
  endforeach()
  # One GPU architecture: the wanted one on, any other a previous configure set off.
  set(_arch_name "")
  set(_what "the host backend")
  if(NOT "${backend}" STREQUAL "")
    set(_arch_variable SPARSE_MLA_${backend}_ARCH)
    _sparse_mla_kokkos_arch_name(${backend} "${${_arch_variable}}" ${_arch_variable} _arch_name)
    set(_what "${backend}, Kokkos_ARCH_${_arch_name}")
  endif()
  foreach(_name IN LISTS _sparse_mla_kokkos_cuda_archs _sparse_mla_kokkos_hip_archs)
    if(_name STREQUAL _arch_name)
      set(Kokkos_ARCH_${_name} ON CACHE BOOL "Kokkos: build for this GPU" FORCE)
    elseif(Kokkos_ARCH_${_name})
      set(Kokkos_ARCH_${_name} OFF CACHE BOOL "Kokkos: build for this GPU" FORCE)
    endif()
  endforeach()

  set(_saved_cuda_root "$ENV{CUDA_ROOT}")
  if("${backend}" STREQUAL "CUDA")
    _sparse_mla_cuda_root(_cuda_root)
    set(ENV{CUDA_ROOT} "${_cuda_root}")  # for Kokkos's checks of nvcc_wrapper at configure time
  else()
    _sparse_mla_ccache_launcher()
  endif()
  message(STATUS "sparse-mla: building Kokkos ${SPARSE_MLA_KOKKOS_RELEASE} with the project (${_what}) from ${_source}")
  sparse_mla_make_available(kokkos)  # cmake/SparseMlaDependencies.cmake
  set(ENV{CUDA_ROOT} "${_saved_cuda_root}")
  if("${backend}" STREQUAL "CUDA")
    _sparse_mla_route_kokkos_launcher("${_cuda_root}")
  endif()

  set(Kokkos_VERSION ${SPARSE_MLA_KOKKOS_RELEASE})
  set(Kokkos_CXX_COMPILER_ID "${KOKKOS_CXX_COMPILER_ID}")
  if("${backend}" STREQUAL "CUDA")
    string(REGEX REPLACE "^sm_" "" Kokkos_CUDA_ARCHITECTURES "${SPARSE_MLA_CUDA_ARCH}")
  elseif("${backend}" STREQUAL "HIP")
    set(Kokkos_HIP_ARCHITECTURES "${SPARSE_MLA_HIP_ARCH}")
  endif()
  set(SPARSE_MLA_KOKKOS_ORIGIN "Kokkos ${Kokkos_VERSION} built with the project from ${_source}")
  set(SPARSE_MLA_INTERNAL_KOKKOS_BUILT ON)
endmacro()

# An installed Kokkos, found where find_package(Kokkos) looks (Kokkos_ROOT first).
macro(_sparse_mla_use_installed_kokkos)
  find_package(Kokkos REQUIRED)
  include(${CMAKE_CURRENT_LIST_DIR}/SparseMlaKokkosFixup.cmake)
  sparse_mla_fix_kokkos_target()
  if(Kokkos_ENABLE_CUDA)
    _sparse_mla_require_nvcc()
    _sparse_mla_cuda_root(_cuda_root)
    _sparse_mla_route_kokkos_launcher("${_cuda_root}")
  else()
    _sparse_mla_ccache_launcher()
  endif()
  set(SPARSE_MLA_KOKKOS_ORIGIN "Kokkos ${Kokkos_VERSION} at ${Kokkos_DIR}")
  set(SPARSE_MLA_INTERNAL_KOKKOS_BUILT OFF)
endmacro()

# The backend the kernels need.
set(_sparse_mla_backend "")
if(SPARSE_MLA_REQUIRE_GPU_KERNELS)
  if(SPARSE_MLA_ENABLE_CUDA AND SPARSE_MLA_ENABLE_HIP)
    message(FATAL_ERROR "sparse-mla: SPARSE_MLA_REQUIRE_GPU_KERNELS with both CUDA and HIP: a Kokkos has one GPU backend; build them in two folders (presets cuda and hip)")
  elseif(SPARSE_MLA_ENABLE_CUDA)
    set(_sparse_mla_backend CUDA)
    _sparse_mla_require_nvcc()
  elseif(SPARSE_MLA_ENABLE_HIP)
    set(_sparse_mla_backend HIP)
  endif()
endif()
if(_sparse_mla_backend)
  set(_sparse_mla_arch_variable SPARSE_MLA_${_sparse_mla_backend}_ARCH)
  if(NOT ${_sparse_mla_arch_variable})
    message(FATAL_ERROR "sparse-mla: SPARSE_MLA_REQUIRE_GPU_KERNELS needs ${_sparse_mla_arch_variable}, the GPU to build for (sm_90, gfx942)")
  endif()
  _sparse_mla_check_compiler_arch(${_sparse_mla_backend} "${${_sparse_mla_arch_variable}}" ${_sparse_mla_arch_variable})
endif()

if(SPARSE_MLA_INTERNAL_KOKKOS)
  _sparse_mla_build_kokkos("${_sparse_mla_backend}")
elseif(_sparse_mla_backend)
  # Looked for in a folder scope of its own, whose targets stay there: a
  # Kokkos without the backend must not clash with the one built here.
  get_property(_sparse_mla_launch_compile GLOBAL PROPERTY RULE_LAUNCH_COMPILE)
  get_property(_sparse_mla_launch_link GLOBAL PROPERTY RULE_LAUNCH_LINK)
  add_subdirectory(${CMAKE_CURRENT_LIST_DIR}/probe-kokkos ${PROJECT_BINARY_DIR}/probe-kokkos)
  if(_SPARSE_MLA_PROBED_KOKKOS_DIR AND _sparse_mla_backend IN_LIST _SPARSE_MLA_PROBED_KOKKOS_DEVICES)
    _sparse_mla_use_installed_kokkos()
  else()
    set_property(GLOBAL PROPERTY RULE_LAUNCH_COMPILE "${_sparse_mla_launch_compile}")
    set_property(GLOBAL PROPERTY RULE_LAUNCH_LINK "${_sparse_mla_launch_link}")
    set(_sparse_mla_kokkos_root "${Kokkos_ROOT}")
    if(NOT _sparse_mla_kokkos_root)
      set(_sparse_mla_kokkos_root "$ENV{Kokkos_ROOT}")
    endif()
    if(_sparse_mla_kokkos_root AND NOT _SPARSE_MLA_PROBED_KOKKOS_DIR)
      message(FATAL_ERROR "sparse-mla: Kokkos_ROOT is ${_sparse_mla_kokkos_root}, where find_package finds no Kokkos: point it at a Kokkos install prefix, or unset it to build Kokkos with the project")
    elseif(_sparse_mla_kokkos_root)
      message(FATAL_ERROR "sparse-mla: Kokkos_ROOT is ${_sparse_mla_kokkos_root}, and the Kokkos found (${_SPARSE_MLA_PROBED_KOKKOS_VERSION} at ${_SPARSE_MLA_PROBED_KOKKOS_DIR}) has no ${_sparse_mla_backend} backend (it has ${_SPARSE_MLA_PROBED_KOKKOS_DEVICES}): point Kokkos_ROOT at a Kokkos built with -DKokkos_ENABLE_${_sparse_mla_backend}=ON, or unset it to build Kokkos with the project")
    elseif(_SPARSE_MLA_PROBED_KOKKOS_DIR)
      message(STATUS "sparse-mla: Kokkos ${_SPARSE_MLA_PROBED_KOKKOS_VERSION} at ${_SPARSE_MLA_PROBED_KOKKOS_DIR} has no ${_sparse_mla_backend} backend")
    endif()
    _sparse_mla_build_kokkos(${_sparse_mla_backend})
  endif()
else()
  find_package(Kokkos QUIET)
  if(Kokkos_FOUND)
    _sparse_mla_use_installed_kokkos()
  else()
    _sparse_mla_build_kokkos("")
  endif()
endif()
message(STATUS "sparse-mla: ${SPARSE_MLA_KOKKOS_ORIGIN} (CUDA: ${Kokkos_ENABLE_CUDA}, HIP: ${Kokkos_ENABLE_HIP})")
