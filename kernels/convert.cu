#include <cuda_bf16.h>

#include "convert.cuh"
#include "grid.cuh"

namespace pope::kernels {

namespace {

__device__ double load_as_double(float x) { return x; }
__device__ double load_as_double(double x) { return x; }
__device__ double load_as_double(__nv_bfloat16 x) { return __bfloat162float(x); }

template <class T> __device__ T store_from_double(double x);
template <> __device__ float store_from_double<float>(double x) { return static_cast<float>(x); }
template <> __device__ double store_from_double<double>(double x) { return x; }
template <> __device__ __nv_bfloat16 store_from_double<__nv_bfloat16>(double x) {
  return __float2bfloat16_rn(static_cast<float>(x));
}

template <class Dst, class Src> __global__ void convert_kernel(Dst* dst, const Src* src, std::size_t count) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < count;
       i += std::size_t(gridDim.x) * blockDim.x)
    dst[i] = store_from_double<Dst>(load_as_double(src[i]));
}

template <class Dst, class Src>
cudaError_t launch(void* dst, const void* src, std::size_t count, cudaStream_t stream) {
  constexpr int kThreads = 256;
  convert_kernel<<<grid_stride_blocks(count, kThreads), kThreads, 0, stream>>>(
      static_cast<Dst*>(dst), static_cast<const Src*>(src), count);
  return cudaGetLastError();
}

template <class Dst>
cudaError_t launch_from(void* dst, const void* src, FloatKind src_kind, std::size_t count, cudaStream_t stream) {
  switch (src_kind) {
    case FloatKind::f32: return launch<Dst, float>(dst, src, count, stream);
    case FloatKind::f64: return launch<Dst, double>(dst, src, count, stream);
    case FloatKind::bf16: return launch<Dst, __nv_bfloat16>(dst, src, count, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace

cudaError_t convert(void* dst, FloatKind dst_kind, const void* src, FloatKind src_kind, std::size_t count,
                    cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  switch (dst_kind) {
    case FloatKind::f32: return launch_from<float>(dst, src, src_kind, count, stream);
    case FloatKind::f64: return launch_from<double>(dst, src, src_kind, count, stream);
    case FloatKind::bf16: return launch_from<__nv_bfloat16>(dst, src, src_kind, count, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace pope::kernels
