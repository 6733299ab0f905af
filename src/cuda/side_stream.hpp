// A second stream beside an op's own, for its small kernels that do not wait on its big ones:
// a PJ-bias's table built while q̃, k̃ are encoded, its gradient reduced while the query kernel
// runs. Launched one after the other, those latency-bound kernels (a few dozen blocks each) left
// most of the GPU idle for their whole length.
//
// fork(main) makes the side stream wait for everything queued on `main` so far and returns it;
// join(main) makes `main` wait for everything queued on the side stream so far. An op that forks
// joins before it returns, so callers see one stream. Both are event edges, which CUDA graph
// capture records as the graph's dependencies. The stream has the device's highest priority, so
// the side kernels' few blocks go ahead of the big kernel's waiting ones and the join does not
// wait on them.
#pragma once

#include <cuda_runtime.h>

namespace pope::cuda {

class SideStream {
 public:
  SideStream() = default;
  ~SideStream();
  SideStream(const SideStream&) = delete;
  SideStream& operator=(const SideStream&) = delete;

  cudaStream_t fork(cudaStream_t main);
  void join(cudaStream_t main);
  // The stream (created on the current device on first use) and a spare event for a fork that
  // the caller's kernel layer records itself (kernels cannot include this header).
  cudaStream_t stream();
  cudaEvent_t fork_event();

 private:
  void create();
  cudaStream_t stream_ = nullptr;
  cudaEvent_t forked_ = nullptr, joined_ = nullptr, spare_ = nullptr;
};

}  // namespace pope::cuda
