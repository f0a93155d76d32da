# The patch step of the Kokkos the project builds (cmake/SparseMlaKokkos.cmake):
#   cmake -DSOURCE_DIR=<fetched Kokkos source> -DPATCH_DIR=<cmake/patches> -P SparseMlaPatchKokkos.cmake
# Applies each kokkos-<release>-*.patch whose release is the source's (kokkos-4.6.01-cuda13.patch to 4.6.01 only), once:
# a patch that is already applied is left alone, so the step can run again.
# Uses `patch`, else `git apply` (confined to this folder).
cmake_minimum_required(VERSION 3.25)
set(source "${SOURCE_DIR}")
file(STRINGS "${source}/CMakeLists.txt" _lines REGEX "^set\\(Kokkos_VERSION_(MAJOR|MINOR|PATCH) [0-9]+\\)")
set(_version "")
foreach(_part MAJOR MINOR PATCH)
  string(REGEX MATCH "Kokkos_VERSION_${_part} ([0-9]+)" _match "${_lines}")
  if(NOT _match)
    message(FATAL_ERROR "sparse-mla: ${source} is not a Kokkos source folder (no Kokkos_VERSION_${_part} in its CMakeLists.txt)")
  endif()
  set(_number "${CMAKE_MATCH_1}")
  if(_part STREQUAL "PATCH" AND _number LESS 10)
    set(_number "0${_number}")  # release tags spell the patch level with two digits: 4.6.01
  endif()
  list(APPEND _version "${_number}")
endforeach()
list(JOIN _version "." _version)

find_program(_patch patch)
find_program(_git git)
# `git apply` in a folder inside another repository (the build folder of this
# one) would resolve the patch's paths against that repository's top.
get_filename_component(_parent "${source}" DIRECTORY)
set(ENV{GIT_CEILING_DIRECTORIES} "${_parent}")

file(GLOB _patches "${PATCH_DIR}/kokkos-${_version}-*.patch")
foreach(_file IN LISTS _patches)
  get_filename_component(_name "${_file}" NAME)
  if(_patch)
    set(_applied_check ${_patch} -p1 -R -s -f --dry-run -i "${_file}")
    set(_apply ${_patch} -p1 -s -f -i "${_file}")
  elseif(_git)
    set(_applied_check ${_git} apply -R --check "${_file}")
    set(_apply ${_git} apply "${_file}")
  else()
    message(FATAL_ERROR "sparse-mla: applying ${_name} to Kokkos needs `patch` or `git`; neither is on PATH")
  endif()
  execute_process(COMMAND ${_applied_check} RESULT_VARIABLE _rc OUTPUT_QUIET ERROR_QUIET)
  if(_rc EQUAL 0)
    message(STATUS "sparse-mla: ${_name}: already applied")
    continue()
  endif()
  execute_process(COMMAND ${_apply} RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _out)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "sparse-mla: ${_name} does not apply to the Kokkos ${_version} source in ${source}: ${_out}")
  endif()
  message(STATUS "sparse-mla: applied ${_name}")
endforeach()
