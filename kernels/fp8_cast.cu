#include <cuda_fp8.h>

#include <cmath>
#include <cstdint>

#include "block_reduce.cuh"
#include "fp8_cast.cuh"
#include "gelu.cuh"
#include "grid.cuh"

namespace pope::kernels {

namespace {

constexpr int kTile = 32;       // a cast block covers kTile × kTile elements
constexpr int kTileRows = 8;    // kTile × kTileRows threads (one dimension), kTile / kTileRows rows each

// |x| as its bit pattern: for non-negative floats the unsigned order is the float order, and a
// NaN (after fabsf, positive) sorts above +inf, so the max of the patterns is NaN when any is.
__device__ unsigned magnitude_bits(float x) { return __float_as_uint(fabsf(x)); }

__device__ void fold_amax(unsigned bits, float* amax) {
  __shared__ unsigned partial[kWarpSize];
  bits = block_reduce(bits, partial, MaxOp{}, 0u);
  if (threadIdx.x == 0 && amax != nullptr)
    atomicMax(reinterpret_cast<unsigned*>(amax), bits);
}

__device__ std::uint8_t to_fp8(float v, Fp8Format format) {
  return __nv_cvt_float_to_fp8(v, __NV_SATFINITE, format == Fp8Format::e4m3 ? __NV_E4M3 : __NV_E5M2);
}

// The value a cast takes from its inputs at one element: x, or GELU or its backward applied and
// the result rounded to bf16, as kernels/elementwise.cu would store it for an unfused cast.
template <Fp8CastPrologue P> __device__ float prologue_value(__nv_bfloat16 x, __nv_bfloat16 pre) {
  if constexpr (P == Fp8CastPrologue::none) {
    return __bfloat162float(x);
  } else if constexpr (P == Fp8CastPrologue::gelu) {
    return __bfloat162float(__float2bfloat16(gelu_tanh(__bfloat162float(x))));
  } else {
    return __bfloat162float(__float2bfloat16(__bfloat162float(x) * gelu_tanh_derivative(__bfloat162float(pre))));
  }
}

// One kTile × kTile tile per block: rows read and the row-major copy written along the columns,
// the transposed copy written from shared memory along the rows.
template <Fp8CastPrologue P>
__global__ void cast_transpose_kernel(const __nv_bfloat16* x, const __nv_bfloat16* pre, std::int64_t rows,
                                      std::int64_t cols, Fp8Format format, const float* scale, std::uint8_t* out,
                                      std::uint8_t* out_t, float* amax) {
  __shared__ std::uint8_t tile[kTile][kTile + 4];  // padded against bank conflicts on the transposed read
  const std::int64_t r0 = std::int64_t(blockIdx.y) * kTile, c0 = std::int64_t(blockIdx.x) * kTile;
  const int tx = threadIdx.x % kTile, ty = threadIdx.x / kTile;
  const float s = *scale;
  unsigned bits = 0;
  for (int k = ty; k < kTile; k += kTileRows) {
    const std::int64_t r = r0 + k, c = c0 + tx;
    if (r < rows && c < cols) {
      const std::int64_t at = r * cols + c;
      const float v = prologue_value<P>(x[at], P == Fp8CastPrologue::gelu_backward ? pre[at] : __nv_bfloat16{});
      bits = max(bits, magnitude_bits(v));
      const std::uint8_t q = to_fp8(v * s, format);
      if (out != nullptr) out[at] = q;
      tile[k][tx] = q;
    }
  }
  if (out_t != nullptr) {
    __syncthreads();
    for (int k = ty; k < kTile; k += kTileRows) {
      const std::int64_t c = c0 + k, r = r0 + tx;
      if (r < rows && c < cols) out_t[c * rows + r] = tile[tx][k];
    }
  }
  fold_amax(bits, amax);
}

// The same cast on 64 × 64 tiles in 16-byte loads and 8-byte stores, for shapes whose rows and
// columns are multiples of 64 (the model's): the scalar tile kernel above moves 2-byte loads and
// 1-byte stores, a quarter of the memory bandwidth.
constexpr int kVecTile = 64, kVecThreads = 256, kVec = 8;  // kVec elements per thread and access

template <Fp8CastPrologue P>
__global__ void __launch_bounds__(kVecThreads)
    cast_transpose_vec_kernel(const __nv_bfloat16* x, const __nv_bfloat16* pre, std::int64_t rows, std::int64_t cols,
                              Fp8Format format, const float* scale, std::uint8_t* out, std::uint8_t* out_t,
                              float* amax) {
  __shared__ alignas(8) std::uint8_t tile[kVecTile][kVecTile + kVec];  // padded: fewer bank conflicts
  const std::int64_t r0 = std::int64_t(blockIdx.y) * kVecTile, c0 = std::int64_t(blockIdx.x) * kVecTile;
  constexpr int kPerRow = kVecTile / kVec, kRowsPerPass = kVecThreads / kPerRow;
  const int lane_c = (int(threadIdx.x) % kPerRow) * kVec, lane_r = int(threadIdx.x) / kPerRow;
  const float s = *scale;
  unsigned bits = 0;
  for (int r = lane_r; r < kVecTile; r += kRowsPerPass) {
    const std::int64_t at = (r0 + r) * cols + c0 + lane_c;
    const uint4 raw = *reinterpret_cast<const uint4*>(x + at);
    uint4 raw_pre{};
    if constexpr (P == Fp8CastPrologue::gelu_backward) raw_pre = *reinterpret_cast<const uint4*>(pre + at);
    const auto* v = reinterpret_cast<const __nv_bfloat16*>(&raw);
    const auto* v_pre = reinterpret_cast<const __nv_bfloat16*>(&raw_pre);
    alignas(8) std::uint8_t q[kVec];
    for (int j = 0; j < kVec; ++j) {
      const float f = prologue_value<P>(v[j], v_pre[j]);
      bits = max(bits, magnitude_bits(f));
      q[j] = to_fp8(f * s, format);
    }
    if (out != nullptr) *reinterpret_cast<uint2*>(out + at) = *reinterpret_cast<const uint2*>(q);
    *reinterpret_cast<uint2*>(&tile[r][lane_c]) = *reinterpret_cast<const uint2*>(q);
  }
  if (out_t != nullptr) {
    __syncthreads();
    for (int c = lane_r; c < kVecTile; c += kRowsPerPass) {
      alignas(8) std::uint8_t q[kVec];
      for (int j = 0; j < kVec; ++j) q[j] = tile[lane_c + j][c];
      *reinterpret_cast<uint2*>(out_t + (c0 + c) * rows + r0 + lane_c) = *reinterpret_cast<const uint2*>(q);
    }
  }
  fold_amax(bits, amax);
}

__global__ void update_scales_kernel(float* amax, float* history, int length, float* scale, float* scale_inv,
                                     int factor_row, int count, float max_value, float margin_factor) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= count) return;
  const float a = amax[i];
  amax[i] = 0.0f;
  if (!isfinite(a)) return;
  float* h = history + std::int64_t(i) * length;
  float m = a;
  for (int j = length - 1; j > 0; --j) {
    h[j] = h[j - 1];
    m = fmaxf(m, h[j]);
  }
  h[0] = a;
  const float s = max_value / m * margin_factor;
  if (m > 0.0f && isfinite(s)) {
    scale[i] = s;
    scale_inv[std::int64_t(i) * factor_row] = 1.0f / s;
  }
}

template <Fp8CastPrologue P>
cudaError_t launch_cast(const __nv_bfloat16* x, const __nv_bfloat16* pre, std::int64_t rows, std::int64_t cols,
                        Fp8Format format, const float* scale, std::uint8_t* out, std::uint8_t* out_t, float* amax,
                        cudaStream_t stream) {
  if (rows % kVecTile == 0 && cols % kVecTile == 0 && aligned16(x) && aligned16(pre) && aligned16(out) &&
      aligned16(out_t)) {
    const dim3 tiles(unsigned(cols / kVecTile), unsigned(rows / kVecTile));
    if (tiles.y > 65535u) return cudaErrorInvalidValue;
    cast_transpose_vec_kernel<P><<<tiles, kVecThreads, 0, stream>>>(x, pre, rows, cols, format, scale, out, out_t, amax);
    return cudaGetLastError();
  }
  const dim3 blocks(unsigned((cols + kTile - 1) / kTile), unsigned((rows + kTile - 1) / kTile));
  if (blocks.y > 65535u) return cudaErrorInvalidValue;
  cast_transpose_kernel<P><<<blocks, kTile * kTileRows, 0, stream>>>(x, pre, rows, cols, format, scale, out, out_t, amax);
  return cudaGetLastError();
}

}  // namespace

cudaError_t fp8_cast_transpose_bf16(const __nv_bfloat16* x, std::int64_t rows, std::int64_t cols, Fp8Format format,
                                    const float* scale, std::uint8_t* out, std::uint8_t* out_t, float* amax,
                                    cudaStream_t stream, Fp8CastPrologue prologue, const __nv_bfloat16* pre) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  switch (prologue) {
    case Fp8CastPrologue::none:
      return launch_cast<Fp8CastPrologue::none>(x, nullptr, rows, cols, format, scale, out, out_t, amax, stream);
    case Fp8CastPrologue::gelu:
      return launch_cast<Fp8CastPrologue::gelu>(x, nullptr, rows, cols, format, scale, out, out_t, amax, stream);
    case Fp8CastPrologue::gelu_backward:
      if (pre == nullptr) return cudaErrorInvalidValue;
      return launch_cast<Fp8CastPrologue::gelu_backward>(x, pre, rows, cols, format, scale, out, out_t, amax, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t fp8_update_scales(float* amax, float* history, int length, float* scale, float* scale_inv,
                              int factor_row, int count, Fp8Format format, int margin, cudaStream_t stream) {
  if (count <= 0) return cudaSuccess;
  if (length < 1) return cudaErrorInvalidValue;
  constexpr int kThreads = 128;
  update_scales_kernel<<<(count + kThreads - 1) / kThreads, kThreads, 0, stream>>>(
      amax, history, length, scale, scale_inv, factor_row, count, fp8_max(format), std::ldexp(1.0f, -margin));
  return cudaGetLastError();
}

}  // namespace pope::kernels
