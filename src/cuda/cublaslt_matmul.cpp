// cuBLASLt works on column-major matrices. A row-major [R, C] matrix is the column-major
// [C, R] matrix, its transpose, so the row-major product out = op(a) · op(b) is computed as
// the column-major outᵀ = op(b)ᵀ · op(a)ᵀ: cuBLASLt's first operand is our b (transposed
// when transpose_b), its second our a (transposed when transpose_a), and its m, n are our
// n, m. Descriptors, layouts and the heuristic's algorithm are built once per PlanKey and
// reused, so a training step only enqueues cublasLtMatmul calls. The epilogues' aux matrix
// has out's shape, so it is column-major [n, m] with leading dimension n as well; its
// pointer, like FP8 operands' scale pointers, is set on the descriptor just before each call
// (pointers change per layer, the descriptor is shared, and cublasLtMatmul reads the
// attributes when it is enqueued). An FP8 product out = a · bᵀ is cuBLASLt's "TN" layout:
// its first operand (our b) transposed, its second (our a) not.
#include "cuda/cublaslt_matmul.hpp"

#include <fmt/format.h>

#include <stdexcept>
#include <string>

#include "cuda/cuda_check.hpp"

namespace pope::cuda {

namespace {

constexpr std::size_t kWorkspaceBytes = 32u << 20;  // 32 MiB: what cuBLASLt's Hopper kernels ask for at most

void check_cublas(cublasStatus_t status, const char* what) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  throw std::runtime_error(fmt::format("cuBLASLt error in {}: {}: {}", what, cublasLtGetStatusName(status),
                                       cublasLtGetStatusString(status)));
}

// The largest power of two ≤ 16 that divides the address: cuBLASLt picks faster kernels
// for 16-byte aligned operands and must be told when they are not.
int alignment_bytes(const void* pointer) {
  const auto address = reinterpret_cast<std::uintptr_t>(pointer);
  int alignment = 16;
  while (alignment > 1 && address % alignment != 0) alignment /= 2;
  return alignment;
}

cublasLtMatrixLayout_t make_layout(cudaDataType_t type, std::int64_t rows, std::int64_t cols) {
  cublasLtMatrixLayout_t layout = nullptr;
  check_cublas(cublasLtMatrixLayoutCreate(&layout, type, static_cast<std::uint64_t>(rows),
                                          static_cast<std::uint64_t>(cols), rows),
               "cublasLtMatrixLayoutCreate");
  return layout;
}

}  // namespace

struct CublasLtMatmul::Plan {
  cublasLtMatmulDesc_t operation = nullptr;
  cublasLtMatrixLayout_t first = nullptr, second = nullptr, output = nullptr;  // our b, our a, out
  cublasLtMatmulAlgo_t algorithm{};

  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    // Destroy calls only fail for null descriptors; nothing useful to do about it here.
    if (output) cublasLtMatrixLayoutDestroy(output);
    if (second) cublasLtMatrixLayoutDestroy(second);
    if (first) cublasLtMatrixLayoutDestroy(first);
    if (operation) cublasLtMatmulDescDestroy(operation);
  }
};

CublasLtMatmul::CublasLtMatmul() {
  check_cublas(cublasLtCreate(&handle_), "cublasLtCreate");
  POPE_CUDA_CHECK(cudaMalloc(&workspace_, kWorkspaceBytes));
}

CublasLtMatmul::~CublasLtMatmul() {
  plans_.clear();
  if (workspace_) cudaFree(workspace_);
  if (handle_) cublasLtDestroy(handle_);
}

namespace {

cublasLtEpilogue_t cublaslt_epilogue(GemmEpilogue epilogue) {
  switch (epilogue) {
    case GemmEpilogue::none:
      return CUBLASLT_EPILOGUE_DEFAULT;
    case GemmEpilogue::gelu:
      return CUBLASLT_EPILOGUE_GELU_AUX;
    case GemmEpilogue::gelu_backward:
      return CUBLASLT_EPILOGUE_DGELU;
  }
  throw std::logic_error("matmul: unhandled epilogue");
}

const void* c_operand(const GemmCall& call) { return call.addend != nullptr ? call.addend : call.out; }

cudaDataType_t operand_type(GemmOperand operand) {
  switch (operand) {
    case GemmOperand::bf16: return CUDA_R_16BF;
    case GemmOperand::e4m3: return CUDA_R_8F_E4M3;
    case GemmOperand::e5m2: return CUDA_R_8F_E5M2;
  }
  throw std::logic_error("matmul: unhandled operand type");
}

bool is_fp8(const GemmCall& call) { return call.a_type != GemmOperand::bf16 || call.b_type != GemmOperand::bf16; }

const char* operand_name(GemmOperand operand) {
  switch (operand) {
    case GemmOperand::bf16: return "bf16";
    case GemmOperand::e4m3: return "e4m3";
    case GemmOperand::e5m2: return "e5m2";
  }
  return "?";
}

// The call as an error message gives it: enough to rebuild it in a test.
std::string describe(const GemmCall& call) {
  std::string text = fmt::format(
      "out [{}, {}] ({}) = op(a) [{}, {}] ({}{}) · op(b) [{}, {}] ({}{}) with beta {}, epilogue {}; alignments in "
      "bytes a {}, b {}, out {}, c {}",
      call.m, call.n, call.out_is_f32 ? "f32" : "bf16", call.m, call.k, operand_name(call.a_type),
      call.transpose_a ? ", transposed" : "", call.k, call.n, operand_name(call.b_type),
      call.transpose_b ? ", transposed" : "", call.beta, static_cast<int>(call.epilogue), alignment_bytes(call.a),
      alignment_bytes(call.b), alignment_bytes(call.out), alignment_bytes(c_operand(call)));
  if (is_fp8(call))
    text += fmt::format(", dequantization factors {}, {}{}", alignment_bytes(call.a_scale_inv), alignment_bytes(call.b_scale_inv),
                        call.fast_accumulation ? "; fast accumulation" : "");
  return text;
}

// The combinations cuBLASLt's FP8 kernels take; anything else is a caller's bug.
void check_fp8_call(const GemmCall& call) {
  if (call.a_type == GemmOperand::bf16 || call.b_type == GemmOperand::bf16)
    throw std::logic_error("matmul: FP8 needs both operands in FP8");
  if (call.a_type == GemmOperand::e5m2 && call.b_type == GemmOperand::e5m2)
    throw std::logic_error("matmul: cuBLASLt has no e5m2 × e5m2 product");
  if (call.transpose_a || !call.transpose_b)
    throw std::logic_error("matmul: FP8 operands must both be K-major (out = a · bᵀ)");
  if (call.a_scale_inv == nullptr || call.b_scale_inv == nullptr)
    throw std::logic_error("matmul: FP8 operands need their dequantization factors");
  // cuBLASLt refuses the product (CUBLAS_STATUS_NOT_SUPPORTED) when a factor is not so aligned.
  if (alignment_bytes(call.a_scale_inv) < 16 || alignment_bytes(call.b_scale_inv) < 16)
    throw std::logic_error("matmul: FP8 dequantization factors must be 16-byte aligned");
}

}  // namespace

const CublasLtMatmul::Plan& CublasLtMatmul::plan_for(const GemmCall& call) {
  const PlanKey key{call.m,
                    call.n,
                    call.k,
                    call.transpose_a,
                    call.transpose_b,
                    call.out_is_f32,
                    call.beta != 0.0f,
                    alignment_bytes(call.a),
                    alignment_bytes(call.b),
                    alignment_bytes(call.out),
                    alignment_bytes(c_operand(call)),
                    static_cast<int>(call.epilogue),
                    call.aux != nullptr ? alignment_bytes(call.aux) : 0,
                    static_cast<int>(call.a_type),
                    static_cast<int>(call.b_type),
                    call.fast_accumulation};
  if (auto found = plans_.find(key); found != plans_.end()) return *found->second;

  const bool fp8 = is_fp8(call);
  auto plan = std::make_unique<Plan>();
  check_cublas(cublasLtMatmulDescCreate(&plan->operation, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
  if (fp8) {
    const std::int8_t fast = call.fast_accumulation ? 1 : 0;
    check_cublas(cublasLtMatmulDescSetAttribute(plan->operation, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof(fast)),
                 "set FAST_ACCUM");
  }
  const cublasOperation_t first_op = call.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t second_op = call.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  check_cublas(
      cublasLtMatmulDescSetAttribute(plan->operation, CUBLASLT_MATMUL_DESC_TRANSA, &first_op, sizeof(first_op)),
      "set TRANSA");
  check_cublas(
      cublasLtMatmulDescSetAttribute(plan->operation, CUBLASLT_MATMUL_DESC_TRANSB, &second_op, sizeof(second_op)),
      "set TRANSB");
  if (call.epilogue != GemmEpilogue::none) {
    if (call.out_is_f32 || call.aux == nullptr)
      throw std::logic_error("matmul: an epilogue needs a bf16 out and an aux matrix");
    const cublasLtEpilogue_t epilogue = cublaslt_epilogue(call.epilogue);
    const std::int64_t aux_ld = call.n;
    const cudaDataType_t aux_type = CUDA_R_16BF;
    check_cublas(
        cublasLtMatmulDescSetAttribute(plan->operation, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)),
        "set EPILOGUE");
    check_cublas(
        cublasLtMatmulDescSetAttribute(plan->operation, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof(aux_ld)),
        "set EPILOGUE_AUX_LD");
    check_cublas(cublasLtMatmulDescSetAttribute(plan->operation, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE,
                                                &aux_type, sizeof(aux_type)),
                 "set EPILOGUE_AUX_DATA_TYPE");
  }
  // The heuristic checks the aux pointer's alignment, so it must be set before asking.
  set_call_pointers(*plan, call);
  // Stored (column-major) shapes: b is [n, k] unless transposed ([k, n]); a is [k, m] unless
  // transposed ([m, k]); out is [n, m].
  plan->first = make_layout(operand_type(call.b_type), call.transpose_b ? call.k : call.n,
                            call.transpose_b ? call.n : call.k);
  plan->second = make_layout(operand_type(call.a_type), call.transpose_a ? call.m : call.k,
                             call.transpose_a ? call.k : call.m);
  plan->output = make_layout(call.out_is_f32 ? CUDA_R_32F : CUDA_R_16BF, call.n, call.m);

  cublasLtMatmulPreference_t raw_preference = nullptr;
  check_cublas(cublasLtMatmulPreferenceCreate(&raw_preference), "cublasLtMatmulPreferenceCreate");
  const std::unique_ptr<cublasLtMatmulPreferenceOpaque_t, decltype(&cublasLtMatmulPreferenceDestroy)> preference(
      raw_preference, &cublasLtMatmulPreferenceDestroy);
  auto prefer = [&](cublasLtMatmulPreferenceAttributes_t attribute, auto value, const char* name) {
    check_cublas(cublasLtMatmulPreferenceSetAttribute(preference.get(), attribute, &value, sizeof(value)), name);
  };
  prefer(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, std::uint64_t{kWorkspaceBytes}, "set MAX_WORKSPACE_BYTES");
  prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, std::uint32_t(alignment_bytes(call.b)), "set MIN_ALIGNMENT_A");
  prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, std::uint32_t(alignment_bytes(call.a)), "set MIN_ALIGNMENT_B");
  prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, std::uint32_t(alignment_bytes(c_operand(call))),
         "set MIN_ALIGNMENT_C");
  prefer(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, std::uint32_t(alignment_bytes(call.out)), "set MIN_ALIGNMENT_D");
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  check_cublas(cublasLtMatmulAlgoGetHeuristic(handle_, plan->operation, plan->first, plan->second, plan->output,
                                              plan->output, preference.get(), 1, &heuristic, &found),
               "cublasLtMatmulAlgoGetHeuristic");
  if (found == 0 || heuristic.state != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error("matmul: cuBLASLt has no algorithm for " + describe(call));
  plan->algorithm = heuristic.algo;
  return *plans_.emplace(key, std::move(plan)).first->second;
}

void CublasLtMatmul::set_call_pointers(const Plan& plan, const GemmCall& call) {
  auto set = [&](cublasLtMatmulDescAttributes_t attribute, const void* pointer, const char* name) {
    check_cublas(cublasLtMatmulDescSetAttribute(plan.operation, attribute, &pointer, sizeof(pointer)), name);
  };
  if (call.epilogue != GemmEpilogue::none) set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, call.aux, "set EPILOGUE_AUX_POINTER");
  if (is_fp8(call)) {
    // cuBLASLt's A is our b, its B our a.
    set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, call.b_scale_inv, "set A_SCALE_POINTER");
    set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, call.a_scale_inv, "set B_SCALE_POINTER");
  }
}

void CublasLtMatmul::run(const GemmCall& call, cudaStream_t stream) {
  if (is_fp8(call)) check_fp8_call(call);  // every call: the factors' alignment is not in the plan's key
  const Plan& plan = plan_for(call);
  set_call_pointers(plan, call);
  const cublasStatus_t status =
      cublasLtMatmul(handle_, plan.operation, &call.alpha, call.b, plan.first, call.a, plan.second, &call.beta,
                     c_operand(call), plan.output, call.out, plan.output, &plan.algorithm, workspace_, kWorkspaceBytes,
                     stream);
  if (status != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(fmt::format("cuBLASLt error in cublasLtMatmul: {}: {}, for {}", cublasLtGetStatusName(status),
                                         cublasLtGetStatusString(status), describe(call)));
}

}  // namespace pope::cuda
