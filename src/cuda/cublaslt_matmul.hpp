// Row-major GEMMs on the GPU through cuBLASLt: bf16 or per-tensor scaled FP8 operands, fp32
// accumulation (CUBLAS_COMPUTE_32F), bf16 or f32 output (f32 with beta = 1 accumulates weight
// gradients).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

namespace pope::cuda {

// What cuBLASLt applies to the product before storing it (bf16 out only, aux bf16 [M, N]).
enum class GemmEpilogue : int {
  none,
  gelu,           // aux = product, out = gelu(product)
  gelu_backward,  // out = product · gelu'(aux)
};

// How an operand is stored: bf16, or FP8 (e4m3, e5m2; not both e5m2) with a device f32
// dequantization factor, the operand standing for its bytes' values times that factor.
enum class GemmOperand : int { bf16, e4m3, e5m2 };

// out[M, N] = epilogue(alpha · op(a) · op(b) + beta · c), all row-major and contiguous:
// a is [M, K] ([K, M] when transpose_a), b is [K, N] ([N, K] when transpose_b), c is `addend`
// when set, else out itself (beta ≠ 0 then accumulates).
struct GemmCall {
  void* out = nullptr;
  bool out_is_f32 = false;  // else bf16
  const void* a = nullptr;  // a_type
  const void* b = nullptr;  // b_type
  // FP8 operands need both K-major (cuBLASLt's FP8 kernels take only that layout): a not
  // transposed, b transposed, out = a · bᵀ. A transposed product casts the transposes instead.
  GemmOperand a_type = GemmOperand::bf16, b_type = GemmOperand::bf16;
  const float* a_scale_inv = nullptr;  // FP8 a: its dequantization factor (device)
  const float* b_scale_inv = nullptr;  // FP8 b: likewise
  bool fast_accumulation = false;      // FP8 only: cuBLASLt's faster, less exact accumulation
  const void* addend = nullptr;  // [M, N] in out's dtype, read with beta; null: out
  std::int64_t m = 0, n = 0, k = 0;
  bool transpose_a = false, transpose_b = false;
  float alpha = 1.0f, beta = 0.0f;
  GemmEpilogue epilogue = GemmEpilogue::none;
  void* aux = nullptr;  // the epilogue's pre-activation matrix (bf16 [M, N])
};

class CublasLtMatmul {
 public:
  CublasLtMatmul();
  ~CublasLtMatmul();
  CublasLtMatmul(const CublasLtMatmul&) = delete;
  CublasLtMatmul& operator=(const CublasLtMatmul&) = delete;

  // Enqueues the product on `stream`. Shapes must already be validated (m, n, k > 0).
  // Throws std::runtime_error when cuBLASLt has no algorithm for the problem or fails.
  void run(const GemmCall& call, cudaStream_t stream);

 private:
  // Everything that changes the descriptors or the algorithm cuBLASLt picks: shape,
  // transposes, operand and output dtypes, whether C is read (beta ≠ 0), the epilogue, the
  // accumulation mode and the pointers' alignments (a, b, out, c, aux).
  using PlanKey = std::tuple<std::int64_t, std::int64_t, std::int64_t, bool, bool, bool, bool, int, int, int, int, int,
                             int, int, int, bool>;
  struct Plan;

  const Plan& plan_for(const GemmCall& call);
  static void set_call_pointers(const Plan& plan, const GemmCall& call);

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  std::map<PlanKey, std::unique_ptr<Plan>> plans_;
};

}  // namespace pope::cuda
