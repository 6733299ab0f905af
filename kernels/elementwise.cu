// One kernel template maps a float function over bf16 inputs. Where every pointer is 16-byte
// aligned each thread moves 8 elements per 16-byte load/store (the ops are bandwidth-bound);
// the remainder, or everything when a pointer is unaligned, goes element by element.
#include "bf16_group.cuh"
#include "elementwise.cuh"
#include "gelu.cuh"

namespace pope::kernels {

namespace {

struct GeluForward {
  static constexpr int kInputs = 1;
  __device__ float operator()(const float* in) const { return gelu_tanh(in[0]); }
};

struct GeluBackward {
  static constexpr int kInputs = 2;  // dout, x
  __device__ float operator()(const float* in) const { return in[0] * gelu_tanh_derivative(in[1]); }
};

struct Add {
  static constexpr int kInputs = 2;
  __device__ float operator()(const float* in) const { return in[0] + in[1]; }
};

template <class Op> struct Inputs {
  const __nv_bfloat16* pointer[Op::kInputs];
};

template <class Op>
__global__ void map_bf16_kernel(__nv_bfloat16* out, Inputs<Op> inputs, std::size_t count, bool vectorized, Op op) {
  const std::size_t first = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x;
  const std::size_t stride = std::size_t(gridDim.x) * blockDim.x;
  const std::size_t groups = vectorized ? count / kVectorGroup : 0;
  for (std::size_t g = first; g < groups; g += stride) {
    Bf16Group<kVectorGroup> values[Op::kInputs];
    for (int k = 0; k < Op::kInputs; ++k) values[k] = load_group<kVectorGroup>(inputs.pointer[k], g);
    Bf16Group<kVectorGroup> result;
    for (int e = 0; e < kVectorGroup; ++e) {
      float arguments[Op::kInputs];
      for (int k = 0; k < Op::kInputs; ++k) arguments[k] = values[k].get(e);
      result.set(e, op(arguments));
    }
    store_group(out, g, result);
  }
  for (std::size_t i = groups * kVectorGroup + first; i < count; i += stride) {
    float arguments[Op::kInputs];
    for (int k = 0; k < Op::kInputs; ++k) arguments[k] = __bfloat162float(inputs.pointer[k][i]);
    out[i] = __float2bfloat16_rn(op(arguments));
  }
}

template <class Op>
cudaError_t launch_map(__nv_bfloat16* out, Inputs<Op> inputs, std::size_t count, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  bool vectorized = aligned16(out);
  for (int k = 0; k < Op::kInputs; ++k) vectorized = vectorized && aligned16(inputs.pointer[k]);
  constexpr int kThreads = 256;
  const std::size_t work_items = vectorized ? count / kVectorGroup + count % kVectorGroup : count;
  map_bf16_kernel<<<grid_stride_blocks(work_items, kThreads), kThreads, 0, stream>>>(out, inputs, count, vectorized,
                                                                                      Op{});
  return cudaGetLastError();
}

}  // namespace

cudaError_t gelu_forward(__nv_bfloat16* out, const __nv_bfloat16* x, std::size_t count, cudaStream_t stream) {
  return launch_map(out, Inputs<GeluForward>{{x}}, count, stream);
}

cudaError_t gelu_backward(__nv_bfloat16* dx, const __nv_bfloat16* dout, const __nv_bfloat16* x, std::size_t count,
                          cudaStream_t stream) {
  return launch_map(dx, Inputs<GeluBackward>{{dout, x}}, count, stream);
}

cudaError_t add(__nv_bfloat16* out, const __nv_bfloat16* a, const __nv_bfloat16* b, std::size_t count,
                cudaStream_t stream) {
  return launch_map(out, Inputs<Add>{{a, b}}, count, stream);
}

}  // namespace pope::kernels
