// The seed's index-group API of the module (groups.cpp):
// SparseMLAIndexGroupBuilder, SparseMLAIndexGroup, HiSparseMLAIndexGroup and
// HiSparseCacheHandle.
#pragma once

#include <pybind11/pybind11.h>

namespace sparse_mla::python {

void register_groups(pybind11::module_& m);

}  // namespace sparse_mla::python
