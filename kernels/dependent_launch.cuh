// Programmatic dependent launch (compute capability 9.0+): a kernel launched with
// launch_dependent() may be scheduled while the kernel before it in the stream is still
// running, so that its blocks are resident, and their work that reads nothing the earlier
// kernel writes is done, when that kernel ends. Such a kernel calls wait_for_producer() before it
// reads anything the earlier kernel writes or writes anything it reads; a kernel calls
// allow_dependents() to let the next one be scheduled early. Both are no-ops without the launch
// attribute (an ordinary launch, or a GPU before Hopper). Decoding's one-token step is a chain of
// short kernels, each a few µs, where the gaps between them are a large share.
#pragma once

#include <cuda_runtime.h>

#include <utility>

namespace pope::kernels {

__device__ inline void wait_for_producer() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ inline void allow_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

// Whether the current device schedules dependent launches early (compute capability ≥ 9).
inline bool dependent_launch_supported() {
  int device = 0, major = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) return false;
  return major >= 9;
}

// kernel<<<grid, block, 0, stream>>>(args...), allowed to start before the previous kernel in
// the stream ends (where the device supports it).
template <class... Params, class... Args>
cudaError_t launch_dependent(void (*kernel)(Params...), dim3 grid, dim3 block, cudaStream_t stream, Args&&... args) {
  static const bool supported = dependent_launch_supported();
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = 0;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = supported ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

}  // namespace pope::kernels
