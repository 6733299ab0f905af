#include "cuda/side_stream.hpp"

#include "cuda/cuda_check.hpp"

namespace pope::cuda {

SideStream::~SideStream() {
  for (cudaEvent_t event : {forked_, joined_, spare_})
    if (event != nullptr) cudaEventDestroy(event);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

void SideStream::create() {
  if (stream_ != nullptr) return;
  int least = 0, greatest = 0;
  POPE_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  POPE_CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, greatest));
  for (cudaEvent_t* event : {&forked_, &joined_, &spare_})
    POPE_CUDA_CHECK(cudaEventCreateWithFlags(event, cudaEventDisableTiming));
}

cudaStream_t SideStream::fork(cudaStream_t main) {
  create();
  POPE_CUDA_CHECK(cudaEventRecord(forked_, main));
  POPE_CUDA_CHECK(cudaStreamWaitEvent(stream_, forked_, 0));
  return stream_;
}

void SideStream::join(cudaStream_t main) {
  create();
  POPE_CUDA_CHECK(cudaEventRecord(joined_, stream_));
  POPE_CUDA_CHECK(cudaStreamWaitEvent(main, joined_, 0));
}

cudaStream_t SideStream::stream() {
  create();
  return stream_;
}

cudaEvent_t SideStream::fork_event() {
  create();
  return spare_;
}

}  // namespace pope::cuda
