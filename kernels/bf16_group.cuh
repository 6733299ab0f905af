// Groups of consecutive bf16 values moved with one memory access: 8 values (one 16-byte
// vector load or store) where rows are 16-byte aligned and a multiple of 8 wide, else 1.
// Kernels are templated on the group width and the launcher picks it at run time. F32Group
// is the fp32 counterpart for the few kernels that also take fp32 rows (8 floats = two
// 16-byte accesses, so the same width and alignment conditions serve both).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <initializer_list>
#include <type_traits>

#include "grid.cuh"

namespace pope::kernels {

constexpr int kVectorGroup = 8;  // bf16 values in 16 bytes

template <int kWidth> struct alignas(2 * kWidth) Bf16Group {
  __nv_bfloat16 element[kWidth];

  __device__ float get(int k) const { return __bfloat162float(element[k]); }
  __device__ void set(int k, float value) { element[k] = __float2bfloat16_rn(value); }
};

template <int kWidth> struct alignas(kWidth == 1 ? 4 : 16) F32Group {
  float element[kWidth];

  __device__ float get(int k) const { return element[k]; }
  __device__ void set(int k, float value) { element[k] = value; }
};

// The group type for an element type: VectorGroup<float, W> or VectorGroup<__nv_bfloat16, W>.
template <class Element, int kWidth>
using VectorGroup = std::conditional_t<std::is_same_v<Element, float>, F32Group<kWidth>, Bf16Group<kWidth>>;

template <int kWidth> __device__ Bf16Group<kWidth> load_group(const __nv_bfloat16* base, std::size_t group) {
  return reinterpret_cast<const Bf16Group<kWidth>*>(base)[group];
}
template <int kWidth> __device__ void store_group(__nv_bfloat16* base, std::size_t group, Bf16Group<kWidth> value) {
  reinterpret_cast<Bf16Group<kWidth>*>(base)[group] = value;
}
template <int kWidth> __device__ F32Group<kWidth> load_group(const float* base, std::size_t group) {
  return reinterpret_cast<const F32Group<kWidth>*>(base)[group];
}
template <int kWidth> __device__ void store_group(float* base, std::size_t group, F32Group<kWidth> value) {
  reinterpret_cast<F32Group<kWidth>*>(base)[group] = value;
}

// Calls launch(std::integral_constant<int, W>{}) with W = kVectorGroup when rows of `width`
// elements starting at every pointer in `pointers` can be read as 16-byte groups, else W = 1.
template <class Launch>
cudaError_t launch_with_group_width(int width, std::initializer_list<const void*> pointers, Launch launch) {
  bool vectorizable = width % kVectorGroup == 0;
  for (const void* pointer : pointers) vectorizable = vectorizable && aligned16(pointer);
  if (vectorizable) return launch(std::integral_constant<int, kVectorGroup>{});
  return launch(std::integral_constant<int, 1>{});
}

}  // namespace pope::kernels
