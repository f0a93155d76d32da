// Every test source is written once and runs on every backend compiled into
// the build (host always). A GPU backend without a device skips with the
// reason the backend gives.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "sparse_mla/device.hpp"
#include "sparse_mla/error.hpp"

namespace sparse_mla::testing {

// The parameter is a backend's name.
class BackendTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const std::string reason = backend_unavailable_reason(backend());
    if (!reason.empty()) GTEST_SKIP() << backend() << ": " << reason;
    device = open_device(backend());
    if (!device->has_kernels()) GTEST_SKIP() << backend() << ": this build has no kernels for this backend";
  }
  std::string backend() const { return GetParam(); }
  std::shared_ptr<Device> device;
};

// A BackendTest that also skips, with the backend's reason, where the
// backend does not capture graphs (the host backend).
class GraphBackendTest : public BackendTest {
 protected:
  void SetUp() override {
    BackendTest::SetUp();
    if (IsSkipped()) return;
    auto probe = device->create_stream();
    try {
      probe->begin_capture();
      probe->end_capture();
    } catch (const Error& e) {
      GTEST_SKIP() << e.what();
    }
  }
};

inline std::string backend_param_name(const ::testing::TestParamInfo<std::string>& info) { return info.param; }

}  // namespace sparse_mla::testing

#define SPARSE_MLA_INSTANTIATE_BACKENDS(Suite)                                                 \
  INSTANTIATE_TEST_SUITE_P(Backends, Suite, ::testing::ValuesIn(::sparse_mla::compiled_backends()), \
                           ::sparse_mla::testing::backend_param_name)
