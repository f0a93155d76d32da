#include "bench_timing.hpp"

#include <algorithm>
#include <memory>

#include "sparse_mla/error.hpp"

namespace sparse_mla::cli {

namespace {

void queue_launches(Stream& stream, BenchCase& bench_case, const TimingPlan& plan) {
  for (int i = 0; i < plan.launches; ++i) bench_case.launch(stream, i % plan.sets);
}

// Captures one replay's launches, or returns nullptr when the backend does
// not capture graphs (it refuses begin_capture with an Error).
std::unique_ptr<Graph> try_capture(Stream& stream, BenchCase& bench_case, const TimingPlan& plan) {
  try {
    stream.begin_capture();
  } catch (const Error&) {
    return nullptr;
  }
  try {
    queue_launches(stream, bench_case, plan);
  } catch (...) {
    stream.end_capture();  // leave the stream usable before reporting
    throw;
  }
  return stream.end_capture();
}

}  // namespace

double median_of(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

Timing time_case(Device& device, Stream& stream, BenchCase& bench_case, const TimingPlan& plan,
                 const std::function<void()>& tick) {
  // One direct pass first: lazy initialisation (Kokkos, module loading) must
  // neither be captured nor timed.
  queue_launches(stream, bench_case, plan);
  stream.synchronize();

  std::unique_ptr<Graph> graph = try_capture(stream, bench_case, plan);
  auto replay = [&] {
    if (graph) {
      graph->replay(stream);
    } else {
      queue_launches(stream, bench_case, plan);
    }
  };

  auto start = device.create_event(true);
  auto stop = device.create_event(true);
  for (int w = 0; w < plan.warmup; ++w) {
    replay();
    stream.synchronize();
    tick();
  }
  Timing timing;
  timing.method = graph ? "graph" : "events";
  bench_case.before_timed(device, stream);
  for (int r = 0; r < plan.repeat; ++r) {
    start->record(stream);
    replay();
    stop->record(stream);
    stop->synchronize();
    timing.per_launch_us.push_back(stop->elapsed_ms(*start) * 1000.0 / plan.launches);
    tick();
  }
  stream.synchronize();
  timing.median_us = median_of(timing.per_launch_us);
  timing.min_us = *std::min_element(timing.per_launch_us.begin(), timing.per_launch_us.end());
  timing.max_us = *std::max_element(timing.per_launch_us.begin(), timing.per_launch_us.end());
  return timing;
}

}  // namespace sparse_mla::cli
