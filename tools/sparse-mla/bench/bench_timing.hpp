// How `sparse-mla bench` times a case.
//
// One *replay* queues `launches` launches, cycling through the rotation sets,
// between two timing events; the per-launch time of a replay is its elapsed
// time divided by `launches`, and the result is the median over `repeat`
// replays. Where the backend captures graphs (CUDA, HIP) the launches are
// captured once and each replay is one graph launch, so launch overhead is not
// timed; elsewhere (the host backend refuses capture) the launches are queued
// directly and the events still bracket only the queued work.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "bench_case.hpp"
#include "sparse_mla/device.hpp"

namespace sparse_mla::cli {

struct TimingPlan {
  int sets = 1;      // rotation sets the case holds
  int launches = 1;  // launches per replay (>= sets; launch i uses set i % sets)
  int warmup = 1;    // untimed replays first
  int repeat = 5;    // timed replays
};

struct Timing {
  std::string method;               // "graph" or "events"
  std::vector<double> per_launch_us;  // one figure per timed replay
  double median_us = 0;
  double min_us = 0;
  double max_us = 0;
};

// `tick` is called after every replay (warm-up included), for the progress bar.
Timing time_case(Device& device, Stream& stream, BenchCase& bench_case, const TimingPlan& plan,
                 const std::function<void()>& tick);

double median_of(std::vector<double> values);

}  // namespace sparse_mla::cli
