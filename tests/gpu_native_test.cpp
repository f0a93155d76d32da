// The GPU native layers (backends/cuda, backends/hip over backends/cuda_hip),
// on each one compiled into the build: runtime errors become Errors that name
// the call and the runtime's error name; with no device or no driver the
// backend says why, open_device throws it, and nothing crashes; with a device,
// its description, pinned host memory, native handles and the checks against
// mixing backends. stream_test.cpp covers the Stream and Event contract on
// every backend.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <ostream>
#include <regex>
#include <string>
#include <vector>

#include "sparse_mla/device.hpp"
#include "sparse_mla/error.hpp"
#include "kernels.hpp"
#include "test_util.hpp"

#ifdef SPARSE_MLA_WITH_CUDA
#include "cuda/cuda_device.hpp"
#endif
#ifdef SPARSE_MLA_WITH_HIP
#include "hip/hip_device.hpp"
#endif

namespace sparse_mla::testing {
namespace {

struct GpuApi {
  std::string backend;        // "cuda": the registry's name
  std::string label;          // "CUDA": as messages spell it
  std::string architecture;   // what DeviceInfo::architecture must match
  std::string space;          // Kokkos's name of the execution space
  std::function<std::string()> unavailable_reason;
  std::function<Error(const std::string&, int)> runtime_error;
};

// gtest shows the parameter by this name instead of its bytes.
void PrintTo(const GpuApi& api, std::ostream* out) { *out << api.backend; }

std::vector<GpuApi> compiled_gpu_apis() {
  std::vector<GpuApi> apis;
#ifdef SPARSE_MLA_WITH_CUDA
  apis.push_back({"cuda", "CUDA", "sm_[0-9]+", "Cuda", cuda::unavailable_reason, cuda::runtime_error});
#endif
#ifdef SPARSE_MLA_WITH_HIP
  apis.push_back({"hip", "HIP", "gfx[0-9a-f]+", "HIP", hip::unavailable_reason, hip::runtime_error});
#endif
  return apis;
}

class GpuNativeTest : public ::testing::TestWithParam<GpuApi> {
 protected:
  const GpuApi& api() const { return GetParam(); }
  bool has_device() const { return api().unavailable_reason().empty(); }
};

// The tests below it need a device of the backend.
#define SKIP_WITHOUT_DEVICE() \
  if (!has_device()) GTEST_SKIP() << api().backend << ": " << api().unavailable_reason()

INSTANTIATE_TEST_SUITE_P(Gpu, GpuNativeTest, ::testing::ValuesIn(compiled_gpu_apis()),
                         [](const ::testing::TestParamInfo<GpuApi>& param) { return param.param.backend; });
// A host-only build compiles this file with no GPU backend to instantiate.
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(GpuNativeTest);

bool starts_with(const std::string& text, const std::string& prefix) { return text.rfind(prefix, 0) == 0; }

// ---- runtime error translation (no device needed) ----

TEST_P(GpuNativeTest, ARuntimeErrorNamesTheCallAndTheErrorName) {
  // 1 is cudaErrorInvalidValue and hipErrorInvalidValue.
  const Error e = api().runtime_error("MemcpyAsync", 1);
  EXPECT_EQ(e.where(), api().backend + "MemcpyAsync");
  if (api().backend == "cuda") {
    EXPECT_STREQ(e.what(), "cudaMemcpyAsync: cudaErrorInvalidValue (invalid argument)");
  } else {
    // HIP 5's description is the name again, and is then left out.
    EXPECT_TRUE(starts_with(e.what(), "hipMemcpyAsync: hipErrorInvalidValue")) << e.what();
    EXPECT_EQ(std::string(e.what()).find("hipErrorInvalidValue (hipErrorInvalidValue)"), std::string::npos) << e.what();
  }
}

TEST_P(GpuNativeTest, AnOutOfMemoryCodeIsNamed) {
  // 2 is cudaErrorMemoryAllocation and hipErrorOutOfMemory.
  const Error e = api().runtime_error("Malloc", 2);
  const std::string expected = api().backend == "cuda" ? "cudaMalloc: cudaErrorMemoryAllocation (out of memory)"
                                                       : "hipMalloc: hipErrorOutOfMemory";
  EXPECT_TRUE(starts_with(e.what(), expected)) << e.what();
}

TEST_P(GpuNativeTest, AnUnknownCodeStillGivesAMessage) {
  const Error e = api().runtime_error("EventQuery", 987654);
  EXPECT_EQ(e.where(), api().backend + "EventQuery");
  const std::string what = e.what();
  EXPECT_TRUE(starts_with(what, api().backend + "EventQuery: ")) << what;
  EXPECT_GT(what.size(), e.where().size() + 2) << what;
  EXPECT_EQ(what.find('\n'), std::string::npos) << what;
}

// ---- availability: the answer on this machine, whatever it is ----

TEST_P(GpuNativeTest, TheRegistryGivesTheBackendsOwnReason) {
  const std::string reason = api().unavailable_reason();
  EXPECT_EQ(backend_unavailable_reason(api().backend), reason);
  EXPECT_EQ(api().unavailable_reason(), reason) << "asking twice gave another answer";
  const auto names = compiled_backends();
  EXPECT_NE(std::find(names.begin(), names.end(), api().backend), names.end());
}

TEST_P(GpuNativeTest, WithoutADeviceTheReasonSaysWhichAndWhy) {
  const std::string reason = api().unavailable_reason();
  if (reason.empty()) GTEST_SKIP() << "this machine has a " << api().label << " device";
  const std::string expected = "no " + api().label + " device: " + api().backend + "GetDeviceCount ";
  EXPECT_TRUE(starts_with(reason, expected)) << reason;
  // Either the runtime's error ("returned cudaErrorNoDevice (...)") or a count of 0.
  EXPECT_TRUE(reason.find(" returned " + api().backend + "Error") != std::string::npos ||
              reason.find(" found 0 devices") != std::string::npos)
      << reason;
}

TEST_P(GpuNativeTest, WithoutADeviceOpenDeviceThrowsTheReasonEveryTime) {
  const std::string reason = api().unavailable_reason();
  if (reason.empty()) GTEST_SKIP() << "this machine has a " << api().label << " device";
  for (int index : {0, 1, -1, 0}) {
    try {
      open_device(api().backend, index);
      FAIL() << "opened " << api().backend << " device " << index;
    } catch (const Error& e) {
      EXPECT_EQ(e.where(), "open_device");
      EXPECT_EQ(std::string(e.what()), "open_device: " + reason);
    }
  }
  // The host backend is untouched by the failed attempts.
  auto host = open_device("host");
  auto stream = host->create_stream();
  Buffer b = upload(*host, *stream, std::vector<std::int32_t>{1, 2, 3});
  EXPECT_EQ(download<std::int32_t>(*host, *stream, b, 3), (std::vector<std::int32_t>{1, 2, 3}));
}

// ---- with a device ----

TEST_P(GpuNativeTest, DeviceInfoDescribesTheGpu) {
  SKIP_WITHOUT_DEVICE();
  auto device = open_device(api().backend);
  const DeviceInfo info = device->info();
  EXPECT_EQ(device->backend() == Backend::cuda ? "cuda" : "hip", api().backend);
  EXPECT_EQ(info.backend, api().backend);
  EXPECT_FALSE(info.name.empty());
  EXPECT_TRUE(std::regex_match(info.architecture, std::regex(api().architecture))) << info.architecture;
  EXPECT_GT(info.total_memory, std::size_t{1} << 30);
  EXPECT_EQ(info.index, 0);
}

TEST_P(GpuNativeTest, AnIndexOutOfRangeIsRejectedWithTheCount) {
  SKIP_WITHOUT_DEVICE();
  try {
    open_device(api().backend, 1 << 20);
    FAIL() << "opened device 1048576";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("asked for index 1048576"), std::string::npos) << what;
    EXPECT_NE(what.find("the " + api().backend + " backend has "), std::string::npos) << what;
  }
  EXPECT_THROW(open_device(api().backend, -1), Error);
}

TEST_P(GpuNativeTest, AFailedAllocationNamesTheCallAndLeavesTheDeviceUsable) {
  SKIP_WITHOUT_DEVICE();
  auto device = open_device(api().backend);
  try {
    Buffer b = device->allocate(std::size_t{1} << 62, MemoryKind::device);
    FAIL() << "allocated 2^62 bytes";
  } catch (const Error& e) {
    EXPECT_EQ(e.where(), api().backend + "Malloc");
    const std::string what = e.what();
    EXPECT_NE(what.find(": " + api().backend + "Error"), std::string::npos) << what;
    EXPECT_NE(what.find("4611686018427387904 bytes of device memory"), std::string::npos) << what;
  }
  // The failure was not sticky and left no pending error behind.
  auto stream = device->create_stream();
  Buffer b = upload(*device, *stream, std::vector<std::int32_t>{7, 8, 9});
  EXPECT_EQ(download<std::int32_t>(*device, *stream, b, 3), (std::vector<std::int32_t>{7, 8, 9}));
}

TEST_P(GpuNativeTest, PinnedHostMemoryIsAddressableFromTheHostAndTheDevice) {
  SKIP_WITHOUT_DEVICE();
  auto device = open_device(api().backend);
  auto stream = device->create_stream();
  const std::size_t n = 1 << 16;
  Buffer pinned = device->allocate(n, MemoryKind::pinned_host);
  ASSERT_TRUE(pinned);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(pinned.data()) % 64, 0u);
  // The device writes it, the host reads it through the same pointer.
  stream->fill(pinned, 0, 0x5A, n);
  stream->synchronize();
  const auto* bytes = pinned.as<const std::uint8_t>();
  for (std::size_t i = 0; i < n; i += 997) ASSERT_EQ(bytes[i], 0x5A) << "byte " << i;
  // The host writes it, the device copies it out.
  std::memset(pinned.data(), 0x3C, n);
  Buffer on_device = device->allocate(n, MemoryKind::device);
  stream->copy(on_device, 0, pinned, 0, n);
  EXPECT_EQ(download<std::uint8_t>(*device, *stream, on_device, n), std::vector<std::uint8_t>(n, 0x3C));
}

TEST_P(GpuNativeTest, FillWritesEveryMemoryKindInStreamOrder) {
  // The runtime's memset writes only what the device can address; pageable
  // host memory is filled by a host function queued on the stream.
  SKIP_WITHOUT_DEVICE();
  auto device = open_device(api().backend);
  auto stream = device->create_stream();
  for (MemoryKind kind : {MemoryKind::device, MemoryKind::pinned_host, MemoryKind::host}) {
    SCOPED_TRACE(memory_kind_name(kind));
    const std::size_t n = 4099;
    Buffer b = device->allocate(n, kind);
    Buffer source = upload(*device, *stream, std::vector<std::uint8_t>(n, 0x77), MemoryKind::device);
    stream->copy(b, 0, source, 0, n);  // queued before the fills: they must come after it
    stream->fill(b, 0, 0x11, n);
    stream->fill(b, 100, 0x22, 1000);
    const auto bytes = download<std::uint8_t>(*device, *stream, b, n);
    for (std::size_t i = 0; i < n; ++i) {
      ASSERT_EQ(bytes[i], (i >= 100 && i < 1100) ? 0x22 : 0x11) << "byte " << i;
    }
  }
}

TEST_P(GpuNativeTest, StreamsHaveTheirOwnNativeHandles) {
  SKIP_WITHOUT_DEVICE();
  auto device = open_device(api().backend);
  auto a = device->create_stream();
  auto b = device->create_stream();
  EXPECT_NE(a->native_handle(), nullptr);  // never the legacy default stream
  EXPECT_NE(b->native_handle(), nullptr);
  EXPECT_NE(a->native_handle(), b->native_handle());
  EXPECT_EQ(&a->device(), device.get());
}

TEST_P(GpuNativeTest, StreamsAndEventsOfAnotherBackendAreRejected) {
  SKIP_WITHOUT_DEVICE();
  auto device = open_device(api().backend);
  auto host = open_device("host");
  auto stream = device->create_stream();
  auto event = device->create_event();
  auto host_stream = host->create_stream();
  auto host_event = host->create_event();
  const std::string other = "belongs to the host backend, not " + api().backend;
  try {
    stream->wait(*host_event);
    FAIL() << "waited on a host event";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(other), std::string::npos) << e.what();
  }
  try {
    stream->wait(*host_stream);
    FAIL() << "waited on a host stream";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(other), std::string::npos) << e.what();
  }
  EXPECT_THROW(event->record(*host_stream), Error);
  stream->synchronize();
}

TEST_P(GpuNativeTest, KernelsAreThereOrSayWhyNot) {
  SKIP_WITHOUT_DEVICE();
  auto device = open_device(api().backend);
  if (!device->has_kernels()) {
    try {
      detail::kernels_of(*device);
      FAIL() << "kernels() returned without kernels";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("this build has no " + api().backend + " kernels"), std::string::npos)
          << e.what();
    }
    return;
  }
  const Kernels& kernels = detail::kernels_of(*device);
  EXPECT_EQ(std::string(kernels.execution_space()), api().space);
  // A launch on a stream of another backend is refused before anything runs.
  auto host = open_device("host");
  auto host_stream = host->create_stream();
  Buffer x = host->allocate(64, MemoryKind::device);
  try {
    kernels.fill_i32(*host_stream, {x.as<std::int32_t>(), 16, 1});
    FAIL() << "launched on a host stream";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("belongs to the host backend"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace sparse_mla::testing
