// One warpgroup's wgmma products on known inputs, for test_wgmma.cpp: the building blocks of the
// Hopper attention kernels (swizzled tiles, descriptors, accumulator and A-operand layouts)
// checked on their own.
#include "wgmma_products.hpp"

#include "attention/mma_tiles.cuh"
#include "attention/wgmma.cuh"

namespace pope::testing {

namespace {

using bf16 = __nv_bfloat16;
namespace wg = kernels::wgmma;

__global__ void __launch_bounds__(wg::kWarpgroupThreads)
    wgmma_products_kernel(const bf16* a, const bf16* b, const bf16* p, const bf16* v, float* s_out, float* o_out,
                          float* u_out, int* supported) {
#ifdef POPE_WGMMA
  __shared__ __align__(1024) bf16 a_tile[64 * 128];
  __shared__ __align__(1024) bf16 b_tile[64 * 128];
  __shared__ __align__(1024) bf16 v_tile[64 * 64];
  __shared__ __align__(1024) bf16 p_tile[64 * 64];
  const int t = int(threadIdx.x);
  for (int i = t; i < 64 * 128; i += wg::kWarpgroupThreads) {
    const int r = i / 128, c = i % 128;
    a_tile[wg::swizzled_index(64, r, c)] = a[i];
    b_tile[wg::swizzled_index(64, r, c)] = b[i];
  }
  for (int i = t; i < 64 * 64; i += wg::kWarpgroupThreads) {
    v_tile[wg::swizzled_index(64, i / 64, i % 64)] = v[i];
    p_tile[wg::swizzled_index(64, i / 64, i % 64)] = p[i];
  }
  wg::fence_shared_for_async();
  __syncthreads();

  const int warp = t / 32, g = t % 32 / 4, q = t % 4;
  float s[8][4];
  wg::product_k_major<128>(s, a_tile, 64, b_tile, 64);

  // P (64 × 64, row major in global memory) as A fragments of this warp's 16 rows.
  std::uint32_t fragments[4][4];
  const int r0 = 16 * warp + g;
  auto pair = [&](int r, int c) { return kernels::mma_tiles::pack_bf16(float(p[r * 64 + c]), float(p[r * 64 + c + 1])); };
#pragma unroll
  for (int step = 0; step < 4; ++step) {
    const int c = 16 * step + 2 * q;
    fragments[step][0] = pair(r0, c);
    fragments[step][1] = pair(r0 + 8, c);
    fragments[step][2] = pair(r0, c + 8);
    fragments[step][3] = pair(r0 + 8, c + 8);
  }
  float o[8][4];
  kernels::mma_tiles::clear(o);
  wg::accumulate_registers<4>(o, fragments, v_tile);
  float u[8][4];
  wg::product_mn_major<64>(u, p_tile, v_tile);  // pᵀ · v: p's rows are K, its columns M

#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = r0 + 8 * (e / 2), column = 8 * j + 2 * q + (e & 1);
      s_out[row * 64 + column] = s[j][e];
      o_out[row * 64 + column] = o[j][e];
      u_out[row * 64 + column] = u[j][e];
    }
  if (t == 0) *supported = 1;
#else
  if (threadIdx.x == 0) *supported = 0;
#endif
}

}  // namespace

cudaError_t wgmma_products(const __nv_bfloat16* a, const __nv_bfloat16* b, const __nv_bfloat16* p,
                           const __nv_bfloat16* v, float* s, float* o, float* u, int* supported) {
  wgmma_products_kernel<<<1, wg::kWarpgroupThreads>>>(a, b, p, v, s, o, u, supported);
  return cudaGetLastError();
}

}  // namespace pope::testing
