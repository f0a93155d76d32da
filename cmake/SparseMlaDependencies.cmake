# GoogleTest (the tests), CLI11 (the CLI) and nlohmann-json (validation):
# the system's packages where find_package finds them, else the dependency
# folder, else fetched from GitHub at a fixed commit (FetchContent).
#
#   SPARSE_MLA_DEPS_DIR  the dependency folder, for a machine without network or packages
#                        (default: the environment variable of that name, else .deps in the
#                        source tree where it exists). Its layout:
#     kokkos-4.6.01.tar.xz             Kokkos's release source (cmake/SparseMlaKokkos.cmake)
#     googletest/                      GoogleTest's source (its top-level CMakeLists.txt)
#     include/CLI/, include/nlohmann/  CLI11's and nlohmann-json's headers
#     share/cmake/CLI11/, share/cmake/nlohmann_json/
#                                      their CMake package files (optional: the headers do)
#   tools/ci/gpu-deps.sh assembles it from Debian's packages.
include(FetchContent)

set(_sparse_mla_deps_default "$ENV{SPARSE_MLA_DEPS_DIR}")
if(NOT _sparse_mla_deps_default AND EXISTS "${PROJECT_SOURCE_DIR}/.deps")
  set(_sparse_mla_deps_default "${PROJECT_SOURCE_DIR}/.deps")
endif()
set(SPARSE_MLA_DEPS_DIR "${_sparse_mla_deps_default}" CACHE PATH
  "Dependency folder: kokkos-4.6.01.tar.xz, googletest/ (source), include/ (CLI11 and nlohmann-json headers)")
if(SPARSE_MLA_DEPS_DIR)
  get_filename_component(SPARSE_MLA_DEPS_DIR "${SPARSE_MLA_DEPS_DIR}" ABSOLUTE BASE_DIR "${PROJECT_SOURCE_DIR}")
  if(NOT IS_DIRECTORY "${SPARSE_MLA_DEPS_DIR}")
    message(FATAL_ERROR "sparse-mla: SPARSE_MLA_DEPS_DIR is ${SPARSE_MLA_DEPS_DIR}, which is not a folder")
  endif()
endif()

# GoogleTest: GTest::gtest and GTest::gtest_main.
function(sparse_mla_find_gtest)
  find_package(GTest QUIET)
  if(GTest_FOUND)
    return()
  endif()
  if(NOT FETCHCONTENT_SOURCE_DIR_GOOGLETEST AND EXISTS "${SPARSE_MLA_DEPS_DIR}/googletest/CMakeLists.txt")
    set(FETCHCONTENT_SOURCE_DIR_GOOGLETEST "${SPARSE_MLA_DEPS_DIR}/googletest")
  endif()
  set(INSTALL_GTEST OFF CACHE BOOL "GoogleTest: install it with the project")
  set(BUILD_GMOCK OFF CACHE BOOL "GoogleTest: build GoogleMock")
  FetchContent_Declare(googletest
    GIT_REPOSITORY https://github.com/google/googletest.git
    GIT_TAG 58d77fa8070e8cec2dc1ed015d66b454c8d78850)  # release-1.12.1
  _sparse_mla_say_where(GoogleTest googletest)
  sparse_mla_make_available(googletest)
endfunction()

# CLI11::CLI11.
function(sparse_mla_find_cli11)
  _sparse_mla_header_library(CLI11 "" CLI11::CLI11 CLI/CLI.hpp
    https://github.com/CLIUtils/CLI11.git 291c58789c031208f08f4f261a858b5b7083e8e2)  # v2.3.2
endfunction()

# nlohmann_json::nlohmann_json, version 3.
function(sparse_mla_find_nlohmann_json)
  _sparse_mla_header_library(nlohmann_json 3 nlohmann_json::nlohmann_json nlohmann/json.hpp
    https://github.com/nlohmann/json.git bc889afb4c5bf1c0d8ee29ef35eaaf4c8bef8a5d)  # v3.11.2
endfunction()

# A header-only library: its package (installed, or in the dependency folder's
# share/cmake), else its headers in the dependency folder's include/, else fetched.
function(_sparse_mla_header_library package version target header repository commit)
  if(TARGET ${target})
    return()
  endif()
  find_package(${package} ${version} CONFIG QUIET PATHS "${SPARSE_MLA_DEPS_DIR}")
  if(${package}_FOUND)
    return()
  endif()
  if(SPARSE_MLA_DEPS_DIR AND EXISTS "${SPARSE_MLA_DEPS_DIR}/include/${header}")
    add_library(${target} INTERFACE IMPORTED GLOBAL)
    set_target_properties(${target} PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${SPARSE_MLA_DEPS_DIR}/include")
    message(STATUS "sparse-mla: ${package}: the headers in ${SPARSE_MLA_DEPS_DIR}/include")
    return()
  endif()
  string(TOLOWER "${package}" _name)
  FetchContent_Declare(${_name} GIT_REPOSITORY ${repository} GIT_TAG ${commit})
  _sparse_mla_say_where(${package} ${_name})
  sparse_mla_make_available(${_name})
endfunction()

# FetchContent_MakeAvailable(name), its targets made system targets: their
# headers do not see our warning flags. (Not FetchContent_Declare's SYSTEM:
# CMake 3.25.1 passes it on to ExternalProject_Add as part of the download URL.)
function(sparse_mla_make_available name)
  FetchContent_MakeAvailable(${name})
  _sparse_mla_mark_system("${${name}_SOURCE_DIR}")
endfunction()

function(_sparse_mla_mark_system directory)
  get_property(_targets DIRECTORY "${directory}" PROPERTY BUILDSYSTEM_TARGETS)
  foreach(_target IN LISTS _targets)
    set_property(TARGET ${_target} PROPERTY SYSTEM TRUE)
  endforeach()
  get_property(_subdirectories DIRECTORY "${directory}" PROPERTY SUBDIRECTORIES)
  foreach(_subdirectory IN LISTS _subdirectories)
    _sparse_mla_mark_system("${_subdirectory}")
  endforeach()
endfunction()

function(_sparse_mla_say_where package name)
  string(TOUPPER "${name}" _upper)
  if(FETCHCONTENT_SOURCE_DIR_${_upper})
    message(STATUS "sparse-mla: ${package}: built from ${FETCHCONTENT_SOURCE_DIR_${_upper}}")
  else()
    message(STATUS "sparse-mla: ${package}: not installed and not in SPARSE_MLA_DEPS_DIR ('${SPARSE_MLA_DEPS_DIR}'): fetching it from GitHub")
  endif()
endfunction()
