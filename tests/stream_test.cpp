// The device interface on every backend: copies between every pair of memory
// kinds, event query and synchronize, ordering across streams joined by
// events (under the host delay switch), and every error path.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <string>
#include <numeric>
#include <vector>

#include "backend_test.hpp"
#include "host/host_device.hpp"
#include "sparse_mla/error.hpp"
#include "sparse_mla/kokkos_runtime.hpp"
#include "sparse_mla/fill.hpp"
#include "sparse_mla/host_debug.hpp"
#include "kernels.hpp"
#include "test_util.hpp"

namespace sparse_mla::testing {
namespace {

class StreamTest : public BackendTest {};
SPARSE_MLA_INSTANTIATE_BACKENDS(StreamTest);


std::vector<std::int32_t> iota(std::size_t n, std::int32_t start) {
  std::vector<std::int32_t> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

const MemoryKind all_kinds[] = {MemoryKind::device, MemoryKind::pinned_host, MemoryKind::host};

TEST_P(StreamTest, CopiesBetweenEveryPairOfMemoryKinds) {
  auto stream = device->create_stream();
  const std::size_t n = 4099;  // not a multiple of any vector width
  for (MemoryKind from : all_kinds) {
    for (MemoryKind to : all_kinds) {
      SCOPED_TRACE(std::string(memory_kind_name(from)) + " -> " + memory_kind_name(to));
      const auto values = iota(n, static_cast<std::int32_t>(from) * 1000 + static_cast<std::int32_t>(to));
      Buffer src = upload(*device, *stream, values, from);
      Buffer dst = device->allocate(n * sizeof(std::int32_t), to);
      stream->fill(dst, 0, poison_byte, dst.bytes());
      // Offsets: copy the middle, then the two ends, to check offset handling.
      const std::size_t mid = 1000 * sizeof(std::int32_t);
      stream->copy(dst, mid, src, mid, src.bytes() - mid);
      stream->copy(dst, 0, src, 0, mid);
      EXPECT_EQ(download<std::int32_t>(*device, *stream, dst, n), values);
    }
  }
}

TEST_P(StreamTest, FillWritesExactlyItsRange) {
  auto stream = device->create_stream();
  Buffer b = device->allocate(64, MemoryKind::device);
  stream->fill(b, 0, 0x11, 64);
  stream->fill(b, 5, 0x22, 7);
  const auto bytes = download<std::uint8_t>(*device, *stream, b, 64);
  for (std::size_t i = 0; i < 64; ++i) EXPECT_EQ(bytes[i], (i >= 5 && i < 12) ? 0x22 : 0x11) << "byte " << i;
}

TEST_P(StreamTest, EventNeverRecordedIsComplete) {
  auto event = device->create_event();
  EXPECT_TRUE(event->query());
  event->synchronize();  // returns at once
}

TEST_P(StreamTest, EventQueryAndSynchronizeFollowTheRecord) {
  DelayScope delay(2000);
  auto stream = device->create_stream();
  auto event = device->create_event();
  const std::size_t n = 1 << 20;
  Buffer a = device->allocate(n, MemoryKind::device);
  Buffer b = device->allocate(n, MemoryKind::device);
  for (int i = 0; i < 8; ++i) stream->copy(b, 0, a, 0, n);
  event->record(*stream);
  event->synchronize();
  EXPECT_TRUE(event->query());
  stream->synchronize();
}

TEST_P(StreamTest, EventQueryIsFalseWhileWorkIsPending) {
  if (GetParam() != "host") GTEST_SKIP() << "needs the host backend's delay switch to hold work back";
  DelayScope delay(50000);  // every task sleeps up to 50 ms
  auto stream = device->create_stream();
  auto event = device->create_event();
  Buffer a = device->allocate(64, MemoryKind::device);
  bool saw_pending = false;
  for (int trial = 0; trial < 10 && !saw_pending; ++trial) {
    for (int i = 0; i < 4; ++i) stream->fill(a, 0, 1, 64);
    event->record(*stream);
    saw_pending = !event->query();
    event->synchronize();
    EXPECT_TRUE(event->query());
  }
  EXPECT_TRUE(saw_pending) << "the queue ran synchronously: query() was never false";
}

// Producer: stream A writes `value` into x (after filling it with other
// bytes, so a stale read is visible). Consumer: stream B copies x into y.
// `join` says how B is ordered after A.
enum class Join { event, stream, none };

bool producer_consumer_trial(Device& device, Join join, std::uint8_t value) {
  auto a = device.create_stream();
  auto b = device.create_stream();
  auto produced = device.create_event();
  const std::size_t n = 4096;
  Buffer x = device.allocate(n, MemoryKind::device);
  Buffer y = device.allocate(n, MemoryKind::device);
  a->fill(x, 0, 0, n);
  a->fill(y, 0, 0, n);
  a->synchronize();
  a->fill(x, 0, 0x5A, n);
  a->fill(x, 0, value, n);
  produced->record(*a);
  if (join == Join::event) b->wait(*produced);
  if (join == Join::stream) b->wait(*a);
  b->copy(y, 0, x, 0, n);
  const auto result = download<std::uint8_t>(device, *b, y, n);
  a->synchronize();
  for (std::uint8_t byte : result) {
    if (byte != value) return false;
  }
  return true;
}

TEST_P(StreamTest, EventJoinOrdersTwoStreamsUnderDelay) {
  DelayScope delay(3000);
  for (int trial = 0; trial < 20; ++trial) {
    EXPECT_TRUE(producer_consumer_trial(*device, Join::event, static_cast<std::uint8_t>(trial + 1))) << "trial " << trial;
  }
}

TEST_P(StreamTest, StreamJoinOrdersTwoStreamsUnderDelay) {
  DelayScope delay(3000);
  for (int trial = 0; trial < 20; ++trial) {
    EXPECT_TRUE(producer_consumer_trial(*device, Join::stream, static_cast<std::uint8_t>(trial + 1))) << "trial " << trial;
  }
}

// The control for the two tests above: without the join, the consumer reads
// stale data at least once in 20 delayed trials. If this fails, the queues
// are not asynchronous and the ordering tests prove nothing.
TEST_P(StreamTest, WithoutAJoinTheConsumerReadsStaleData) {
  if (GetParam() != "host") GTEST_SKIP() << "relies on the host backend's delay switch";
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the unjoined trial is a deliberate data race, which ThreadSanitizer rightly reports";
#endif
  DelayScope delay(3000);
  int stale = 0;
  for (int trial = 0; trial < 20; ++trial) {
    if (!producer_consumer_trial(*device, Join::none, static_cast<std::uint8_t>(trial + 1))) ++stale;
  }
  EXPECT_GT(stale, 0) << "20 unjoined trials all read fresh data";
}

TEST_P(StreamTest, WaitTakesTheRecordCurrentAtTheCall) {
  // Re-recording the event after wait() must not change what the wait waits for.
  DelayScope delay(1000);
  auto a = device->create_stream();
  auto b = device->create_stream();
  auto e = device->create_event();
  Buffer x = device->allocate(256, MemoryKind::device);
  Buffer y = device->allocate(256, MemoryKind::device);
  a->fill(x, 0, 7, 256);
  e->record(*a);
  b->wait(*e);
  b->copy(y, 0, x, 0, 256);
  e->record(*a);  // a later record; b's wait is already bound
  const auto result = download<std::uint8_t>(*device, *b, y, 256);
  for (auto v : result) ASSERT_EQ(v, 7);
  a->synchronize();
}

TEST_P(StreamTest, KernelsRunInStreamOrder) {
  DelayScope delay(1000);
  auto a = device->create_stream();
  auto b = device->create_stream();
  auto e = device->create_event();
  const std::int64_t n = 10000;
  Buffer x = device->allocate(n * 4, MemoryKind::device);
  Buffer y = device->allocate(n * 4, MemoryKind::device);
  const Kernels& k = detail::kernels_of(*device);
  for (int trial = 0; trial < 10; ++trial) {
    k.fill_i32(*a, {x.as<std::int32_t>(), n, -1});
    k.fill_i32(*a, {x.as<std::int32_t>(), n, trial});
    e->record(*a);
    b->wait(*e);
    b->copy(y, 0, x, 0, y.bytes());
    const auto values = download<std::int32_t>(*device, *b, y, static_cast<std::size_t>(n));
    for (auto v : values) ASSERT_EQ(v, trial);
  }
}

// An engine's stream and event (here: native handles of the library's own,
// which the engine would have made itself) work wherever the library takes
// a Stream or an Event, kernels included, and the library never destroys
// them. The host backend has no native handles and says so.
TEST_P(StreamTest, WrappedNativeStreamsAndEventsWorkAndStayTheEngines) {
  auto engine_stream = device->create_stream();
  auto engine_event = device->create_event();
  if (device->backend() == Backend::host) {
    for (const auto& call : {std::function<void()>([&] { (void)device->wrap_stream(nullptr); }),
                             std::function<void()>([&] { (void)device->wrap_event(engine_event.get()); })}) {
      const std::string message = error_of(call);
      EXPECT_NE(message.find("the host backend has no native"), std::string::npos) << message;
    }
    EXPECT_EQ(engine_stream->native_handle(), nullptr);
    EXPECT_EQ(engine_event->native_handle(), nullptr);
    EXPECT_FALSE(engine_stream->is_capturing());
    return;
  }
  ASSERT_NE(engine_event->native_handle(), nullptr);
  const std::int64_t n = 5000;
  Buffer x = device->allocate(n * 4, MemoryKind::device);
  Buffer y = device->allocate(n * 4, MemoryKind::device);
  auto other = device->create_stream();
  for (int trial = 0; trial < 3; ++trial) {
    auto wrapped = device->wrap_stream(engine_stream->native_handle());
    auto wrapped_event = device->wrap_event(engine_event->native_handle());
    EXPECT_EQ(wrapped->native_handle(), engine_stream->native_handle());
    EXPECT_EQ(wrapped_event->native_handle(), engine_event->native_handle());
    EXPECT_EQ(&wrapped->device(), device.get());
    fill_i32(*wrapped, Tensor::of(x, DType::i32, {n}), trial + 1);  // a kernel on the engine's stream
    wrapped_event->record(*wrapped);
    other->wait(*engine_event);  // the engine's own handle sees the wrapped record
    other->copy(y, 0, x, 0, y.bytes());
    const auto values = download<std::int32_t>(*device, *other, y, static_cast<std::size_t>(n));
    for (auto v : values) ASSERT_EQ(v, trial + 1);
    EXPECT_TRUE(engine_event->query());
  }  // the wrappers go; the native stream and event stay usable
  fill_i32(*engine_stream, Tensor::of(x, DType::i32, {n}), 9);
  engine_event->record(*engine_stream);
  engine_event->synchronize();
  EXPECT_EQ(download<std::int32_t>(*device, *engine_stream, x, 1), std::vector<std::int32_t>{9});
  EXPECT_THROW((void)device->wrap_event(nullptr), Error);
}

// is_capturing tells whether work queued now is captured, whoever began the
// capture: the same native stream seen through a wrapper reports it too.
TEST_P(StreamTest, IsCapturingFollowsTheCaptureOfTheNativeStream) {
  auto stream = device->create_stream();
  EXPECT_FALSE(stream->is_capturing());
  if (device->backend() == Backend::host) return;  // no graphs
  auto wrapped = device->wrap_stream(stream->native_handle());
  EXPECT_FALSE(wrapped->is_capturing());
  stream->begin_capture();
  EXPECT_TRUE(stream->is_capturing());
  EXPECT_TRUE(wrapped->is_capturing());
  auto graph = stream->end_capture();
  EXPECT_FALSE(wrapped->is_capturing());
}

TEST_P(StreamTest, SynchronizeOnAnIdleStreamReturns) {
  auto s = device->create_stream();
  s->synchronize();
  s->synchronize();
}

TEST_P(StreamTest, StreamWaitOnItselfIsANoOp) {
  auto s = device->create_stream();
  Buffer x = device->allocate(16, MemoryKind::device);
  s->fill(x, 0, 3, 16);
  s->wait(*s);
  EXPECT_EQ(download<std::uint8_t>(*device, *s, x, 16), std::vector<std::uint8_t>(16, 3));
}

TEST_P(StreamTest, TimingEventsMeasureTheWorkBetweenThem) {
  auto s = device->create_stream();
  auto start = device->create_event(true);
  auto stop = device->create_event(true);
  const std::size_t n = std::size_t{64} << 20;
  Buffer a = device->allocate(n, MemoryKind::device);
  Buffer b = device->allocate(n, MemoryKind::device);
  s->fill(a, 0, 1, n);
  start->record(*s);
  for (int i = 0; i < 4; ++i) s->copy(b, 0, a, 0, n);
  stop->record(*s);
  stop->synchronize();
  const double ms = stop->elapsed_ms(*start);
  EXPECT_GT(ms, 0.0);
  EXPECT_LT(ms, 60000.0);
}

TEST_P(StreamTest, ElapsedTimeNeedsTimingEventsThatRan) {
  auto s = device->create_stream();
  auto plain = device->create_event();
  auto timed = device->create_event(true);
  auto never = device->create_event(true);
  plain->record(*s);
  timed->record(*s);
  s->synchronize();
  EXPECT_THROW(timed->elapsed_ms(*plain), Error);
  EXPECT_THROW(timed->elapsed_ms(*never), Error);
}

// ---- error paths ----

TEST_P(StreamTest, CopyOutsideTheBufferIsRejectedAndWritesNothing) {
  auto s = device->create_stream();
  Buffer src = upload(*device, *s, std::vector<std::uint8_t>(100, 9));
  Buffer dst = upload(*device, *s, std::vector<std::uint8_t>(64, 1));
  try {
    s->copy(dst, 0, src, 0, 100);
    FAIL() << "no exception";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dst range [0, 100) is outside its 64 bytes"), std::string::npos) << e.what();
  }
  EXPECT_THROW(s->copy(dst, 60, src, 0, 8), Error);
  EXPECT_THROW(s->copy(dst, 0, src, 99, 2), Error);
  EXPECT_THROW(s->copy(dst, 65, src, 0, 0 + 1), Error);
  EXPECT_THROW(s->fill(dst, 64, 0, 1), Error);
  EXPECT_EQ(download<std::uint8_t>(*device, *s, dst, 64), std::vector<std::uint8_t>(64, 1));
}

TEST_P(StreamTest, CopyFromAnEmptyBufferIsRejected) {
  auto s = device->create_stream();
  Buffer empty;
  Buffer dst = device->allocate(8, MemoryKind::device);
  EXPECT_THROW(s->copy(dst, 0, empty, 0, 8), Error);
  s->copy(dst, 0, empty, 0, 0);  // zero bytes: nothing to check, nothing done
}

TEST_P(StreamTest, BuffersOfAnotherDeviceAreRejected) {
  auto other = open_device(GetParam());
  auto s = device->create_stream();
  Buffer mine = device->allocate(16, MemoryKind::device);
  Buffer theirs = other->allocate(16, MemoryKind::device);
  try {
    s->copy(mine, 0, theirs, 0, 16);
    FAIL() << "no exception";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("src belongs to another device"), std::string::npos) << e.what();
  }
}

TEST_P(StreamTest, ImpossibleAllocationThrowsNamingTheSize) {
  try {
    Buffer b = device->allocate(std::size_t{1} << 62, MemoryKind::device);
    FAIL() << "allocated 2^62 bytes";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("4611686018427387904 bytes"), std::string::npos) << e.what();
  }
}

TEST_P(StreamTest, ZeroByteAllocationIsEmpty) {
  Buffer b = device->allocate(0, MemoryKind::pinned_host);
  EXPECT_FALSE(b);
  EXPECT_EQ(b.bytes(), 0u);
}

TEST_P(StreamTest, BufferMoveTransfersOwnership) {
  Buffer a = device->allocate(32, MemoryKind::pinned_host);
  void* p = a.data();
  Buffer b = std::move(a);
  EXPECT_EQ(b.data(), p);
  EXPECT_EQ(a.data(), nullptr);  // NOLINT(bugprone-use-after-move): checking the moved-from state
  EXPECT_EQ(b.kind(), MemoryKind::pinned_host);
  EXPECT_EQ(b.device(), device.get());
  a = std::move(b);
  EXPECT_EQ(a.data(), p);
}

// The host backend's own checks: streams and events of another backend.
TEST(HostBackend, UnknownBackendAndBadIndexAreRejected) {
  try {
    open_device("tpu");
    FAIL() << "no exception";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown backend 'tpu'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(open_device("host", 1), Error);
  // The host backend is unavailable only where Kokkos cannot start (a GPU-enabled Kokkos without its GPU).
  EXPECT_EQ(backend_unavailable_reason("host"), kokkos_unavailable_reason());
  EXPECT_EQ(compiled_backends().front(), "host");
}

TEST(HostBackend, ATaskErrorIsRethrownBySynchronizeOnce) {
  // Work that fails on a worker thread must not vanish: the next
  // synchronize() reports it (like a sticky GPU error), and only once.
  auto device = open_device("host");
  auto s = device->create_stream();
  auto& queue = dynamic_cast<host::HostStream&>(*s);
  Buffer x = device->allocate(8, MemoryKind::device);
  queue.enqueue([] { throw Error("test task", "boom"); });
  s->fill(x, 0, 4, 8);  // later work still runs
  try {
    s->synchronize();
    FAIL() << "the task's error was lost";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "test task: boom");
  }
  s->synchronize();
  EXPECT_EQ(download<std::uint8_t>(*device, *s, x, 8), std::vector<std::uint8_t>(8, 4));
}

TEST(HostBackend, GraphCaptureIsRefusedWithAReason) {
  auto device = open_device("host");
  auto s = device->create_stream();
  try {
    s->begin_capture();
    FAIL() << "no exception";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not supported by the host backend"), std::string::npos) << e.what();
  }
  EXPECT_THROW(s->end_capture(), Error);
}

TEST(HostBackend, DelaySwitchReadsItsSetting) {
  const auto saved = host::debug_delay_us();
  host::set_debug_delay_us(1234);
  EXPECT_EQ(host::debug_delay_us(), 1234u);
  host::set_debug_delay_us(saved);
}

}  // namespace
}  // namespace sparse_mla::testing
