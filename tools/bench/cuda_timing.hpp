// Timing shared by the CUDA-only tools under tools/bench: the method of
// `sparse-mla bench` (launches captured into one graph, cycling over
// rotation sets, median per launch over replays) in plain CUDA.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

namespace sparse_mla::bench {

inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

// Median microseconds per launch: `launches` launches (launch i uses set
// i % sets) captured into one graph, replayed 25 times, the first 3 untimed.
inline double time_graph(cudaStream_t stream, int launches, int sets, const std::function<void(int)>& launch) {
  for (int s = 0; s < sets; ++s) launch(s);
  check(cudaStreamSynchronize(stream), "warm-up");
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "capture");
  for (int i = 0; i < launches; ++i) launch(i % sets);
  check(cudaStreamEndCapture(stream, &graph), "capture");
  check(cudaGraphInstantiateWithFlags(&exec, graph, 0), "instantiate");
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "event");
  check(cudaEventCreate(&stop), "event");
  std::vector<double> per_launch;
  for (int r = 0; r < 25; ++r) {
    check(cudaEventRecord(start, stream), "record");
    check(cudaGraphLaunch(exec, stream), "replay");
    check(cudaEventRecord(stop, stream), "record");
    check(cudaEventSynchronize(stop), "sync");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start, stop), "elapsed");
    if (r >= 3) per_launch.push_back(ms * 1000.0 / launches);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  std::sort(per_launch.begin(), per_launch.end());
  return per_launch[per_launch.size() / 2];
}

}  // namespace sparse_mla::bench
