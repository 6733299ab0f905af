// The CUDA backend: device memory, one stream, and the ops as kernel launches (kernels/)
// and cuBLASLt GEMMs. Every op validates its tensors on the host first, then enqueues work
// on the stream without synchronising, so a step can be captured in a CUDA graph; scratch
// memory grows on first use and is reused.
#include "cuda/cuda_backend.hpp"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <vector>

#include "adamw.cuh"
#include "clamp.cuh"
#include "convert.cuh"
#include "cross_entropy.cuh"
#include "greedy_tokens.cuh"
#include "cuda/cublaslt_matmul.hpp"
#include "cuda/cuda_attention.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/cuda_device.hpp"
#include "cuda/cuda_tensor_checks.hpp"
#include "cuda/device_scratch.hpp"
#include "device_error.cuh"
#include "elementwise.cuh"
#include "embedding.cuh"
#include "few_rows_matmul.cuh"
#include "fill.cuh"
#include "fp8_cast.cuh"
#include "model/bf16.hpp"
#include "model/fp8.hpp"
#include "model/fp8_checks.hpp"
#include "reduce.cuh"
#include "rmsnorm.cuh"

namespace pope {

static_assert(kernels::kGuardScheduleLr == kScheduleLr && kernels::kGuardScheduleCorrection1 == kScheduleCorrection1 &&
                  kernels::kGuardScheduleCorrection2 == kScheduleCorrection2,
              "adamw_guarded's schedule slots must match StepScheduleSlot");
static_assert(kernels::kGuardStatsLossSum == kStatsLossSum && kernels::kGuardStatsGradSquares == kStatsGradSquares &&
                  kernels::kGuardStatsApplied == kStatsApplied,
              "adamw_guarded's stats slots must match StepStatsSlot");

namespace {

using cuda::check_2d;
using cuda::check_floating;
using cuda::check_int_range;
using cuda::check_logits;
using cuda::check_matrix;
using cuda::check_vector;
using cuda::require;
using kernels::DeviceErrorRecord;

__nv_bfloat16* bf16_data(const Tensor& t) { return static_cast<__nv_bfloat16*>(t.data); }

kernels::Fp8Format kernel_format(DType format) {
  return format == DType::e4m3 ? kernels::Fp8Format::e4m3 : kernels::Fp8Format::e5m2;
}
kernels::Fp8CastPrologue kernel_prologue(Backend::Fp8Prologue prologue) {
  switch (prologue) {
    case Backend::Fp8Prologue::none: return kernels::Fp8CastPrologue::none;
    case Backend::Fp8Prologue::gelu: return kernels::Fp8CastPrologue::gelu;
    case Backend::Fp8Prologue::gelu_backward: return kernels::Fp8CastPrologue::gelu_backward;
  }
  throw std::logic_error("fp8_cast: unhandled prologue");
}
cuda::GemmOperand gemm_operand(DType format) {
  return format == DType::e4m3 ? cuda::GemmOperand::e4m3 : cuda::GemmOperand::e5m2;
}

kernels::FloatKind float_kind(DType dtype) {
  switch (dtype) {
    case DType::f32: return kernels::FloatKind::f32;
    case DType::f64: return kernels::FloatKind::f64;
    default: return kernels::FloatKind::bf16;  // callers have checked for a floating dtype
  }
}

// Rows and width of an activation [..., width] (every leading dimension counts as rows).
struct RowsWidth {
  std::int64_t rows, width;
};
RowsWidth rows_and_width(std::string_view op, const Tensor& x) {
  require(!x.shape.empty(), op, "x has no dimensions, expected [rows, channels]");
  const std::int64_t width = x.shape.back();
  return {width == 0 ? 0 : x.numel() / width, width};
}

// Splits segments into AdamW chunks of at most kAdamWChunkElements, in arena order.
std::vector<kernels::AdamWChunk> adamw_chunks(std::span<const ParamSegment> segments) {
  std::vector<kernels::AdamWChunk> chunks;
  for (const ParamSegment& segment : segments)
    for (std::int64_t begin = 0; begin < segment.numel; begin += kernels::kAdamWChunkElements)
      chunks.push_back({segment.offset + begin,
                        static_cast<int>(std::min<std::int64_t>(kernels::kAdamWChunkElements, segment.numel - begin)),
                        segment.weight_decay ? 1 : 0});
  return chunks;
}

// Refuses host memory that is not page-locked: an asynchronous copy from pageable memory
// would silently run synchronously (and cannot be recorded in a graph).
void check_page_locked(std::string_view op, const void* host) {
  cudaPointerAttributes attributes{};
  POPE_CUDA_CHECK(cudaPointerGetAttributes(&attributes, host));
  require(attributes.type == cudaMemoryTypeHost, op,
          "the host memory is not page-locked; take it from allocate_host() (or use the synchronous copy)");
}

// A CUDA event on the backend's stream; only a timed one (make_timed_fence) pays for the
// timestamp.
class CudaFence final : public TimedFence {
 public:
  CudaFence(cudaStream_t stream, bool timed) : stream_(stream), timed_(timed) {
    POPE_CUDA_CHECK(cudaEventCreateWithFlags(&event_, timed ? cudaEventDefault : cudaEventDisableTiming));
  }
  ~CudaFence() override { cudaEventDestroy(event_); }
  CudaFence(const CudaFence&) = delete;
  CudaFence& operator=(const CudaFence&) = delete;

  void record() override {
    POPE_CUDA_CHECK(cudaEventRecord(event_, stream_));
    recorded_ = true;
  }
  void wait() override { POPE_CUDA_CHECK(cudaEventSynchronize(event_)); }  // an unrecorded event returns at once
  bool ready() override {
    const cudaError_t status = cudaEventQuery(event_);
    if (status == cudaErrorNotReady) return false;
    POPE_CUDA_CHECK(status);
    return true;
  }
  double seconds_since(const TimedFence& earlier) const override {
    const auto* other = dynamic_cast<const CudaFence*>(&earlier);
    if (other == nullptr || !timed_ || !other->timed_)
      throw std::logic_error("seconds_since: both fences must be timed CUDA fences (make_timed_fence)");
    // Asked before the CUDA call, which would fail with an error that tools report even when
    // handled (compute-sanitizer lists every failed API call).
    if (!recorded_ || !other->recorded_)
      throw std::logic_error("seconds_since: a fence that was not recorded or not yet reached");
    float ms = 0.0f;
    const cudaError_t status = cudaEventElapsedTime(&ms, other->event_, event_);
    if (status == cudaErrorNotReady || status == cudaErrorInvalidResourceHandle) {
      cudaGetLastError();  // not sticky: clear it
      throw std::logic_error("seconds_since: a fence that was not recorded or not yet reached");
    }
    POPE_CUDA_CHECK(status);
    return double(ms) * 1e-3;
  }

 private:
  cudaStream_t stream_;
  bool timed_;
  bool recorded_ = false;
  cudaEvent_t event_ = nullptr;
};

// Stream capture into one CUDA graph. Thread-local capture mode: a call on this thread that
// is not capturable (an allocation, a synchronising copy) fails instead of being run.
class CudaGraphCapture final : public GraphCapture {
 public:
  explicit CudaGraphCapture(cudaStream_t stream) : stream_(stream) {}
  ~CudaGraphCapture() override {
    if (recording_) {
      cudaGraph_t abandoned = nullptr;
      if (cudaStreamEndCapture(stream_, &abandoned) == cudaSuccess && abandoned) cudaGraphDestroy(abandoned);
    }
    if (executable_) cudaGraphExecDestroy(executable_);
  }
  CudaGraphCapture(const CudaGraphCapture&) = delete;
  CudaGraphCapture& operator=(const CudaGraphCapture&) = delete;

  void begin() override {
    require(!recording_, "graph capture", "begin() called while already recording");
    POPE_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    recording_ = true;
  }

  void end() override {
    require(recording_, "graph capture", "end() called without begin()");
    recording_ = false;
    cudaGraph_t graph = nullptr;
    // Fails (capture invalidated) when a call in between could not be recorded.
    POPE_CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
    if (executable_) {
      POPE_CUDA_CHECK(cudaGraphExecDestroy(executable_));
      executable_ = nullptr;
    }
    const cudaError_t instantiated = cudaGraphInstantiate(&executable_, graph, 0);
    cudaGraphDestroy(graph);  // the executable graph is independent of it
    POPE_CUDA_CHECK(instantiated);
  }

  void replay() override {
    require(executable_ != nullptr && !recording_, "graph capture", "replay() needs a finished recording");
    POPE_CUDA_CHECK(cudaGraphLaunch(executable_, stream_));
  }

 private:
  cudaStream_t stream_;
  cudaGraphExec_t executable_ = nullptr;
  bool recording_ = false;
};

bool same_segments(std::span<const ParamSegment> a, std::span<const ParamSegment> b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(), [](const ParamSegment& x, const ParamSegment& y) {
    return x.offset == y.offset && x.numel == y.numel && x.weight_decay == y.weight_decay;
  });
}

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device_index) {
    const int count = cuda_device_count();
    if (device_index < 0 || device_index >= count)
      throw std::runtime_error(fmt::format("cuda backend: device index {} is not among the {} visible CUDA device{}",
                                           device_index, count, count == 1 ? "" : "s"));
    POPE_CUDA_CHECK(cudaSetDevice(device_index));
    cudaDeviceProp properties{};
    POPE_CUDA_CHECK(cudaGetDeviceProperties(&properties, device_index));
    description_ = fmt::format("cuda ({}, sm_{}{}, bf16)", properties.name, properties.major, properties.minor);
    fp8_tensor_cores_ = properties.major * 10 + properties.minor >= 89;
    // Non-blocking: the legacy default stream, which libraries may use, never serialises with ours.
    POPE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    POPE_CUDA_CHECK(cudaMalloc(&device_error_, sizeof(DeviceErrorRecord)));
    // On our stream: a plain cudaMemset runs on the legacy stream, which ours does not wait for.
    POPE_CUDA_CHECK(cudaMemsetAsync(device_error_, 0, sizeof(DeviceErrorRecord), stream_));
    POPE_CUDA_CHECK(cudaMalloc(&sum_result_, sizeof(double)));
    // Created only now, so that whatever they allocate lands on this backend's device.
    matmul_ = std::make_unique<cuda::CublasLtMatmul>();
    attention_ = std::make_unique<cuda::AttentionRunner>();
  }

  ~CudaBackend() override {
    // Destructors must not throw: finish queued work, then release, ignoring errors.
    cudaStreamSynchronize(stream_);
    attention_.reset();
    matmul_.reset();
    cudaFree(sum_result_);
    cudaFree(device_error_);
    cudaStreamDestroy(stream_);
  }

  DeviceKind device() const override { return DeviceKind::cuda; }
  BackendDTypes dtypes() const override { return {DType::bf16, DType::f32, DType::f32}; }
  std::string description() const override { return description_; }
  cudaStream_t stream() const { return stream_; }

  // ---- memory ---------------------------------------------------------------------------

  Buffer allocate(std::size_t bytes) override {
    void* memory = nullptr;
    POPE_CUDA_CHECK(cudaMalloc(&memory, bytes == 0 ? 1 : bytes));
    // Zeroed before returning, so that work on any stream (a communicator's, say) sees zeros;
    // allocation happens at setup, where a synchronisation costs nothing.
    cudaError_t zeroed = cudaMemsetAsync(memory, 0, bytes, stream_);
    if (zeroed == cudaSuccess) zeroed = cudaStreamSynchronize(stream_);
    if (zeroed != cudaSuccess) {
      cudaFree(memory);
      POPE_CUDA_CHECK(zeroed);
    }
    return Buffer(memory, [](void* p) { cudaFree(p); });  // a deleter cannot throw
  }

  void fill(Tensor t, double value) override {
    check_vector("fill", "t", t, t.dtype, t.numel());
    const std::size_t count = static_cast<std::size_t>(t.numel());
    cudaError_t status = cudaSuccess;
    switch (t.dtype) {
      case DType::f32: status = kernels::fill_f32(t.as<float>(), count, float(value), stream_); break;
      case DType::f64: status = kernels::fill_f64(t.as<double>(), count, value, stream_); break;
      case DType::i32: status = kernels::fill_i32(t.as<std::int32_t>(), count, std::int32_t(value), stream_); break;
      case DType::u16: status = kernels::fill_u16(t.as<std::uint16_t>(), count, std::uint16_t(value), stream_); break;
      case DType::bf16: {
        const std::uint16_t bits = float_to_bf16(float(value));
        status = kernels::fill_u16(static_cast<std::uint16_t*>(t.data), count, bits, stream_);
        break;
      }
      case DType::e4m3:
      case DType::e5m2: status = cudaMemsetAsync(t.data, float_to_fp8(float(value), t.dtype), count, stream_); break;
    }
    launched(status, "fill");
  }

  void copy(Tensor dst, Tensor src) override {
    require(dst.dtype == src.dtype && dst.numel() == src.numel(), "copy",
            fmt::format("dst is {} {}, src is {} {}; expected the same dtype and element count", dtype_name(dst.dtype),
                        shape_string(dst.shape), dtype_name(src.dtype), shape_string(src.shape)));
    check_vector("copy", "dst", dst, dst.dtype, dst.numel());
    check_vector("copy", "src", src, src.dtype, src.numel());
    if (dst.nbytes() > 0)
      POPE_CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, dst.nbytes(), cudaMemcpyDeviceToDevice, stream_));
  }

  void convert(Tensor dst, Tensor src) override {
    check_floating("convert", "dst", dst);
    check_floating("convert", "src", src);
    require(dst.numel() == src.numel(), "convert",
            fmt::format("dst has {} elements, src {}; expected the same count", dst.numel(), src.numel()));
    launched(kernels::convert(dst.data, float_kind(dst.dtype), src.data, float_kind(src.dtype),
                              static_cast<std::size_t>(dst.numel()), stream_),
             "convert");
  }

  // The host memory may be reused as soon as these return, so both wait for the copy.
  void copy_from_host(Tensor dst, const void* src) override {
    check_vector("copy_from_host", "dst", dst, dst.dtype, dst.numel());
    if (dst.nbytes() == 0) return;
    POPE_CUDA_CHECK(cudaMemcpyAsync(dst.data, src, dst.nbytes(), cudaMemcpyHostToDevice, stream_));
    POPE_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  void copy_to_host(void* dst, Tensor src) override {
    check_vector("copy_to_host", "src", src, src.dtype, src.numel());
    if (src.nbytes() > 0)
      POPE_CUDA_CHECK(cudaMemcpyAsync(dst, src.data, src.nbytes(), cudaMemcpyDeviceToHost, stream_));
    synchronize();
  }

  void synchronize() override {
    POPE_CUDA_CHECK(cudaStreamSynchronize(stream_));
    raise_device_errors();
  }

  Buffer allocate_host(std::size_t bytes) override {
    void* memory = nullptr;
    POPE_CUDA_CHECK(cudaHostAlloc(&memory, bytes == 0 ? 1 : bytes, cudaHostAllocDefault));
    std::memset(memory, 0, bytes);
    return Buffer(memory, [](void* p) { cudaFreeHost(p); });
  }

  void copy_from_host_async(Tensor dst, const void* src) override {
    check_vector("copy_from_host_async", "dst", dst, dst.dtype, dst.numel());
    if (dst.nbytes() == 0) return;
    check_page_locked("copy_from_host_async", src);
    POPE_CUDA_CHECK(cudaMemcpyAsync(dst.data, src, dst.nbytes(), cudaMemcpyHostToDevice, stream_));
  }

  void copy_to_host_async(void* dst, Tensor src) override {
    check_vector("copy_to_host_async", "src", src, src.dtype, src.numel());
    if (src.nbytes() == 0) return;
    check_page_locked("copy_to_host_async", dst);
    POPE_CUDA_CHECK(cudaMemcpyAsync(dst, src.data, src.nbytes(), cudaMemcpyDeviceToHost, stream_));
  }

  std::unique_ptr<Fence> make_fence() override { return std::make_unique<CudaFence>(stream_, false); }
  std::unique_ptr<TimedFence> make_timed_fence() override { return std::make_unique<CudaFence>(stream_, true); }

  bool supports_graphs() const override { return true; }
  std::unique_ptr<GraphCapture> make_graph_capture() override { return std::make_unique<CudaGraphCapture>(stream_); }
  std::uint64_t scratch_generation() const override {
    return cuda::scratch_changes().load(std::memory_order_relaxed);
  }

  // ---- embedding --------------------------------------------------------------------------

  void embedding_forward(Tensor out, Tensor tokens, Tensor wte) override {
    constexpr std::string_view op = "embedding_forward";
    check_2d(op, "wte", wte, DType::bf16);
    const std::int64_t rows = tokens.numel(), width = wte.dim(1);
    check_vector(op, "tokens", tokens, DType::i32, rows);
    check_matrix(op, "out", out, DType::bf16, rows, width);
    check_sizes(op, {rows, width, wte.dim(0)});
    launched(kernels::embedding_forward(bf16_data(out), tokens.as<std::int32_t>(), bf16_data(wte), int(rows),
                                        int(width), int(wte.dim(0)), device_error_, stream_),
             op);
  }

  void embedding_backward(Tensor dwte, Tensor dout, Tensor tokens) override {
    constexpr std::string_view op = "embedding_backward";
    check_2d(op, "dwte", dwte, DType::f32);
    const std::int64_t rows = tokens.numel(), width = dwte.dim(1);
    check_vector(op, "tokens", tokens, DType::i32, rows);
    check_matrix(op, "dout", dout, DType::bf16, rows, width);
    check_sizes(op, {rows, width, dwte.dim(0)});
    std::size_t scratch_bytes = 0;
    launched(kernels::embedding_backward_scratch_bytes(int(rows), &scratch_bytes), op);
    void* scratch = embedding_scratch_.reserve(scratch_bytes);
    launched(kernels::embedding_backward(dwte.as<float>(), bf16_data(dout), tokens.as<std::int32_t>(), int(rows),
                                         int(width), int(dwte.dim(0)), scratch, scratch_bytes, device_error_, stream_),
             op);
  }

  // ---- rmsnorm ------------------------------------------------------------------------------

  void rmsnorm_forward(Tensor out, Tensor rstd, Tensor x, Tensor gain, double eps) override {
    constexpr std::string_view op = "rmsnorm_forward";
    const auto [rows, width] = check_rmsnorm_forward(op, out, rstd, x, gain, eps);
    launched(kernels::rmsnorm_forward(bf16_data(out), rstd.as<float>(), bf16_data(x), bf16_data(gain), int(rows),
                                      int(width), float(eps), stream_),
             op);
  }

  void rmsnorm_backward(Tensor dx, Tensor dgain, Tensor dout, Tensor x, Tensor gain, Tensor rstd) override {
    constexpr std::string_view op = "rmsnorm_backward";
    const auto [rows, width] = rows_and_width(op, x);
    check_matrix(op, "x", x, DType::bf16, rows, width);
    check_matrix(op, "dout", dout, DType::bf16, rows, width);
    check_matrix(op, "dx", dx, DType::bf16, rows, width);
    check_vector(op, "gain", gain, DType::bf16, width);
    check_vector(op, "dgain", dgain, DType::f32, width);
    check_vector(op, "rstd", rstd, DType::f32, rows);
    require(width <= kernels::kRmsnormMaxWidth, op,
            fmt::format("x has {} channels, more than the CUDA kernel's {}", width, kernels::kRmsnormMaxWidth));
    require(rows == 0 || (dx.data != dout.data && dx.data != x.data), op,
            "dx aliases dout or x; it accumulates and must be a separate tensor");
    check_sizes(op, {rows, width});
    const std::size_t scratch_bytes = kernels::rmsnorm_backward_scratch_bytes(int(rows), int(width));
    void* scratch = rmsnorm_scratch_.reserve(scratch_bytes);
    launched(kernels::rmsnorm_backward(bf16_data(dx), dgain.as<float>(), bf16_data(dout), bf16_data(x), bf16_data(gain),
                                       rstd.as<float>(), int(rows), int(width), scratch, scratch_bytes, stream_),
             op);
  }

  // ---- matmul -------------------------------------------------------------------------------

  void matmul(Tensor out, Tensor a, Tensor b, bool transpose_a, bool transpose_b, double alpha, double beta) override {
    constexpr std::string_view op = "matmul";
    require(out.dtype == DType::bf16 || out.dtype == DType::f32, op,
            fmt::format("out is {}, expected bf16 or f32", dtype_name(out.dtype)));
    cuda::GemmCall call = gemm_call(op, out, a, b, transpose_a, transpose_b);
    if (call.m == 0 || call.n == 0) return;
    call.alpha = float(alpha);
    call.beta = float(beta);
    if (alpha == 1.0 && beta == 0.0 && run_few_rows(few_rows_call(call, kernels::FewRowsEpilogue::none, {}), op)) return;
    matmul_->run(call, stream_);
  }

  void matmul_epilogue(Tensor out, Tensor a, Tensor b, bool transpose_a, bool transpose_b, MatmulEpilogue epilogue,
                       Tensor aux) override {
    constexpr std::string_view op = "matmul_epilogue";
    cuda::GemmCall call = gemm_call(op, out, a, b, transpose_a, transpose_b);
    check_epilogue_aux(op, out, aux);
    if (call.m == 0 || call.n == 0) return;
    if (epilogue != MatmulEpilogue::gelu_backward && run_few_rows(few_rows_call(call, few_rows_epilogue(epilogue), aux), op))
      return;
    // cuBLASLt's GELU epilogues need an aux leading dimension divisible by 8 and a 16-byte
    // aligned aux; other shapes (never the model's: 4·n_embd columns) take the unfused ops.
    const bool aux_fusable = call.n % 8 == 0 && reinterpret_cast<std::uintptr_t>(aux.data) % 16 == 0;
    if (epilogue != MatmulEpilogue::add && !aux_fusable) {
      Backend::matmul_epilogue(out, a, b, transpose_a, transpose_b, epilogue, aux);
      return;
    }
    switch (epilogue) {
      case MatmulEpilogue::add:
        call.addend = aux.data;
        call.beta = 1.0f;
        break;
      case MatmulEpilogue::gelu:
        call.epilogue = cuda::GemmEpilogue::gelu;
        call.aux = aux.data;
        break;
      case MatmulEpilogue::gelu_backward:
        call.epilogue = cuda::GemmEpilogue::gelu_backward;
        call.aux = aux.data;
        break;
    }
    matmul_->run(call, stream_);
  }

  void rmsnorm_matmul(Tensor out, Tensor norm, Tensor rstd, Tensor x, Tensor gain, double eps, Tensor w,
                      std::optional<MatmulEpilogue> epilogue, Tensor aux) override {
    constexpr std::string_view op = "rmsnorm_matmul";
    check_rmsnorm_forward(op, norm, rstd, x, gain, eps);
    const cuda::GemmCall call = gemm_call(op, out, norm, w, false, true);
    if (epilogue) check_epilogue_aux(op, out, aux);
    if (call.m > 0 && call.n > 0 && epilogue != MatmulEpilogue::gelu_backward) {
      kernels::FewRowsMatmul args =
          few_rows_call(call, epilogue ? few_rows_epilogue(*epilogue) : kernels::FewRowsEpilogue::none, aux);
      args.x = bf16_data(x);
      args.gain = bf16_data(gain);
      args.eps = float(eps);
      args.norm_out = bf16_data(norm);
      args.rstd_out = rstd.as<float>();
      if (run_few_rows(args, op)) return;
    }
    Backend::rmsnorm_matmul(out, norm, rstd, x, gain, eps, w, epilogue, aux);
  }

  // ---- elementwise --------------------------------------------------------------------------

  void gelu_forward(Tensor out, Tensor x) override {
    check_vector("gelu_forward", "x", x, DType::bf16, x.numel());
    check_vector("gelu_forward", "out", out, DType::bf16, x.numel());
    launched(kernels::gelu_forward(bf16_data(out), bf16_data(x), std::size_t(x.numel()), stream_), "gelu_forward");
  }

  void gelu_backward(Tensor dx, Tensor dout, Tensor x) override {
    check_vector("gelu_backward", "x", x, DType::bf16, x.numel());
    check_vector("gelu_backward", "dout", dout, DType::bf16, x.numel());
    check_vector("gelu_backward", "dx", dx, DType::bf16, x.numel());
    launched(kernels::gelu_backward(bf16_data(dx), bf16_data(dout), bf16_data(x), std::size_t(x.numel()), stream_),
             "gelu_backward");
  }

  void add(Tensor out, Tensor a, Tensor b) override {
    check_vector("add", "a", a, DType::bf16, a.numel());
    check_vector("add", "b", b, DType::bf16, a.numel());
    check_vector("add", "out", out, DType::bf16, a.numel());
    launched(kernels::add(bf16_data(out), bf16_data(a), bf16_data(b), std::size_t(a.numel()), stream_), "add");
  }

  void clamp(Tensor x, double lowest, double highest) override {
    check_vector("clamp", "x", x, DType::f32, x.numel());
    require(lowest <= highest, "clamp", fmt::format("lowest {} above highest {}", lowest, highest));
    launched(kernels::clamp_f32(x.as<float>(), std::size_t(x.numel()), float(lowest), float(highest), stream_),
             "clamp");
  }

  // ---- FP8 (the casts of kernels/fp8_cast.cuh, cuBLASLt's FP8 products) ---------------------------

  void fp8_cast(Tensor out, Tensor out_t, Tensor x, Tensor scale, Tensor amax, Fp8Prologue prologue,
                Tensor pre) override {
    const checks::Fp8CastShape shape = checks::check_fp8_cast(DeviceKind::cuda, out, out_t, x, DType::bf16, scale, amax,
                                                              pre, prologue == Fp8Prologue::gelu_backward);
    require_fp8_tensor_cores("fp8_cast");
    launched(kernels::fp8_cast_transpose_bf16(bf16_data(x), shape.rows, shape.cols, kernel_format(shape.format),
                                              scale.as<float>(), static_cast<std::uint8_t*>(out.data),
                                              static_cast<std::uint8_t*>(out_t.data), amax.as<float>(), stream_,
                                              kernel_prologue(prologue), pre.empty() ? nullptr : bf16_data(pre)),
             "fp8_cast");
  }

  void fp8_update_scales(Tensor amax, Tensor history, Tensor scale, Tensor scale_inv, DType format,
                         int margin) override {
    const std::int64_t k = checks::check_fp8_update(DeviceKind::cuda, amax, history, scale, scale_inv, format);
    launched(kernels::fp8_update_scales(amax.as<float>(), history.as<float>(), int(history.dim(1)), scale.as<float>(),
                                        scale_inv.as<float>(), int(kFp8FactorRow), int(k), kernel_format(format),
                                        margin, stream_),
             "fp8_update_scales");
  }

  void fp8_matmul(Tensor out, Tensor a, Tensor a_scale_inv, Tensor b, Tensor b_scale_inv, double beta,
                  bool fast_accumulation, Tensor addend) override {
    const checks::Fp8MatmulShape shape =
        checks::check_fp8_matmul(DeviceKind::cuda, out, a, a_scale_inv, b, b_scale_inv, DType::bf16, addend);
    require_fp8_tensor_cores("fp8_matmul");
    if (shape.m == 0 || shape.n == 0) return;
    cuda::GemmCall call;
    call.out = out.data;
    call.out_is_f32 = out.dtype == DType::f32;
    call.a = a.data, call.b = b.data;
    call.m = shape.m, call.n = shape.n, call.k = shape.k;
    call.transpose_b = true;  // out = a · bᵀ: both operands K-major
    call.a_type = gemm_operand(a.dtype), call.b_type = gemm_operand(b.dtype);
    call.a_scale_inv = a_scale_inv.as<float>(), call.b_scale_inv = b_scale_inv.as<float>();
    call.beta = float(beta);
    call.addend = addend.empty() ? nullptr : addend.data;
    call.fast_accumulation = fast_accumulation;
    matmul_->run(call, stream_);
  }

  bool has_fp8_tensor_cores() const override { return fp8_tensor_cores_; }

  // ---- attention (the attention runner's kernels) ---------------------------------------------

  void attention_forward(const AttentionForward& args) override { attention_->forward(args, stream_); }
  void attention_backward(const AttentionBackward& args) override { attention_->backward(args, stream_); }
  void attention_decode(const AttentionDecode& args) override { attention_->decode(args, stream_); }
  std::int64_t attention_encoded_numel(const AttentionShape& shape, const PositionEncoding& encoding) const override {
    return cuda::AttentionRunner::encoded_numel(shape, encoding);
  }

  // ---- classifier and optimizer -------------------------------------------------------------

  void cross_entropy(Tensor losses, Tensor logits, Tensor targets, int vocab_size, bool compute_grad,
                     double grad_scale) override {
    constexpr std::string_view op = "cross_entropy";
    // bf16 logits in training (dlogits in place), fp32 in evaluation (Model::classifier).
    const bool f32_logits = logits.dtype == DType::f32;
    require(f32_logits || logits.dtype == DType::bf16, op,
            fmt::format("logits are {}, expected bf16 or f32", dtype_name(logits.dtype)));
    const std::int64_t rows = check_logits(op, logits, logits.dtype, vocab_size), padded = logits.dim(1);
    check_vector(op, "targets", targets, DType::i32, rows);
    check_vector(op, "losses", losses, DType::f32, rows);
    check_sizes(op, {rows, padded});
    const auto launch = [&](auto* z) {
      return kernels::cross_entropy(losses.as<float>(), z, targets.as<std::int32_t>(), int(rows), int(padded),
                                    vocab_size, compute_grad, float(grad_scale), device_error_, stream_);
    };
    launched(f32_logits ? launch(logits.as<float>()) : launch(bf16_data(logits)), op);
  }

  void greedy_tokens(Tensor ids, Tensor log_probs, Tensor logits, int vocab_size, Tensor past, int advance) override {
    constexpr std::string_view op = "greedy_tokens";
    const std::int64_t rows = check_logits(op, logits, DType::f32, vocab_size), padded = logits.dim(1);
    check_vector(op, "ids", ids, DType::i32, rows);
    check_vector(op, "log_probs", log_probs, DType::f32, rows);
    if (!past.empty()) check_vector(op, "past", past, DType::i32, 1);
    check_sizes(op, {rows, padded});
    launched(kernels::greedy_tokens(ids.as<std::int32_t>(), log_probs.as<float>(), logits.as<float>(), int(rows),
                                    int(padded), vocab_size, past.empty() ? nullptr : past.as<std::int32_t>(), advance,
                                    stream_),
             op);
  }

  double sum_of_squares(Tensor x) override {
    check_vector("sum_of_squares", "x", x, DType::f32, x.numel());
    void* scratch = sum_scratch_.reserve(kernels::sum_of_squares_scratch_bytes());
    launched(kernels::sum_of_squares(sum_result_, x.as<float>(), std::size_t(x.numel()), scratch, sum_scratch_.bytes(),
                                     stream_),
             "sum_of_squares");
    double result = 0.0;
    POPE_CUDA_CHECK(cudaMemcpyAsync(&result, sum_result_, sizeof(double), cudaMemcpyDeviceToHost, stream_));
    synchronize();
    return result;
  }

  void sum_of_squares_into(Tensor result, Tensor x) override {
    check_vector("sum_of_squares_into", "result", result, DType::f64, 1);
    check_vector("sum_of_squares_into", "x", x, DType::f32, x.numel());
    void* scratch = sum_scratch_.reserve(kernels::sum_of_squares_scratch_bytes());
    launched(kernels::sum_of_squares(result.as<double>(), x.as<float>(), std::size_t(x.numel()), scratch,
                                     sum_scratch_.bytes(), stream_),
             "sum_of_squares_into");
  }

  void accumulate_sum(Tensor total, Tensor values) override {
    check_vector("accumulate_sum", "total", total, DType::f64, 1);
    check_vector("accumulate_sum", "values", values, DType::f32, values.numel());
    launched(kernels::accumulate_sum(total.as<double>(), values.as<float>(), std::size_t(values.numel()), stream_),
             "accumulate_sum");
  }

  void adamw(Tensor params, Tensor grads, Tensor m, Tensor v, std::span<const ParamSegment> segments,
             const AdamWStep& step, Tensor compute_copy) override {
    constexpr std::string_view op = "adamw";
    const AdamWTable& table = check_adamw_arena(op, params, grads, m, v, segments, step.beta1, step.beta2, compute_copy);
    require(step.step >= 1, op, fmt::format("step is {}, expected >= 1 (1-based for bias correction)", step.step));

    // The same fp32 scalars, computed the same way, as the CPU reference's float backend.
    kernels::AdamWScalars s{};
    s.lr = float(step.lr);
    s.beta1 = float(step.beta1);
    s.beta2 = float(step.beta2);
    s.eps = float(step.eps);
    s.one_minus_beta1 = 1 - s.beta1;
    s.one_minus_beta2 = 1 - s.beta2;
    s.grad_scale = float(step.grad_scale);
    s.correction1 = float(1 - std::pow(step.beta1, double(step.step)));
    s.correction2 = float(1 - std::pow(step.beta2, double(step.step)));
    s.decay = s.lr * float(step.weight_decay);
    launched(kernels::adamw(params.as<float>(), grads.as<float>(), m.as<float>(), v.as<float>(),
                            compute_copy.empty() ? nullptr : bf16_data(compute_copy),
                            table.chunks(), table.count, s, stream_),
             op);
  }

  void adamw_guarded(Tensor params, Tensor grads, Tensor m, Tensor v, std::span<const ParamSegment> segments,
                     const AdamWHyper& hyper, Tensor schedule, Tensor stats, Tensor compute_copy) override {
    constexpr std::string_view op = "adamw_guarded";
    const AdamWTable& table =
        check_adamw_arena(op, params, grads, m, v, segments, hyper.beta1, hyper.beta2, compute_copy);
    check_vector(op, "schedule", schedule, DType::f64, kStepScheduleSize);
    check_vector(op, "stats", stats, DType::f64, kStepStatsSize);
    kernels::AdamWGuardSettings settings{};
    settings.beta1 = float(hyper.beta1);
    settings.beta2 = float(hyper.beta2);
    settings.eps = float(hyper.eps);
    settings.one_minus_beta1 = 1 - settings.beta1;
    settings.one_minus_beta2 = 1 - settings.beta2;
    settings.weight_decay = float(hyper.weight_decay);
    settings.grad_clip = hyper.grad_clip;
    auto* scratch = static_cast<kernels::AdamWDeviceScalars*>(
        adamw_guard_scratch_.reserve(sizeof(kernels::AdamWDeviceScalars)));
    launched(kernels::adamw_guarded(params.as<float>(), grads.as<float>(), m.as<float>(), v.as<float>(),
                                    compute_copy.empty() ? nullptr : bf16_data(compute_copy),
                                    table.chunks(), table.count, settings, schedule.as<double>(), stats.as<double>(),
                                    scratch, stream_),
             op);
  }

 private:
  // Turns a launcher's status into an exception naming the op.
  static void launched(cudaError_t status, std::string_view op) {
    if (status != cudaSuccess)
      throw std::runtime_error(fmt::format("{}: CUDA launch failed: {}: {}", op, cudaGetErrorName(status),
                                           cudaGetErrorString(status)));
  }

  // The kernels index rows and columns with int.
  static void check_sizes(std::string_view op, std::initializer_list<std::int64_t> sizes) {
    for (std::int64_t size : sizes) check_int_range(op, "a dimension", size);
  }

  // The device chunk table of one list of segments (see adamw_table).
  struct AdamWTable {
    std::vector<ParamSegment> segments;
    cuda::DeviceScratch table;
    int count = 0;
    const kernels::AdamWChunk* chunks() const { return static_cast<const kernels::AdamWChunk*>(table.data()); }
  };

  // Validates the arena, moments and segments of an AdamW call; returns the device chunk table
  // of `segments`.
  const AdamWTable& check_adamw_arena(std::string_view op, Tensor params, Tensor grads, Tensor m, Tensor v,
                         std::span<const ParamSegment> segments, double beta1, double beta2, Tensor compute_copy) {
    const std::int64_t total = params.numel();
    check_vector(op, "params", params, DType::f32, total);
    check_vector(op, "grads", grads, DType::f32, total);
    check_vector(op, "m", m, DType::f32, total);
    check_vector(op, "v", v, DType::f32, total);
    if (!compute_copy.empty()) check_vector(op, "compute_copy", compute_copy, DType::bf16, total);
    require(beta1 >= 0 && beta1 < 1 && beta2 >= 0 && beta2 < 1, op,
            fmt::format("beta1 {} and beta2 {} must lie in [0, 1)", beta1, beta2));
    for (std::size_t i = 0; i < segments.size(); ++i)
      require(segments[i].offset >= 0 && segments[i].numel >= 0 && segments[i].offset + segments[i].numel <= total, op,
              fmt::format("segment {} covers [{}, {}), outside the arena's {} elements", i, segments[i].offset,
                          segments[i].offset + segments[i].numel, total));
    return adamw_table(segments);
  }

  // Chunk tables live on the device, one per list of segments seen (an optimizer updates its
  // shard in up to four chunks, each with its own list), uploaded once: steady-state steps and
  // CUDA graph capture make no copies, and a table is never freed while a queued or captured
  // update may read it.
  const AdamWTable& adamw_table(std::span<const ParamSegment> segments) {
    for (const std::unique_ptr<AdamWTable>& known : adamw_tables_)
      if (same_segments(segments, known->segments)) return *known;
    const std::vector<kernels::AdamWChunk> chunks = adamw_chunks(segments);
    check_int_range("adamw", "the number of 64Ki-element chunks", std::int64_t(chunks.size()));
    auto entry = std::make_unique<AdamWTable>();
    void* table = entry->table.reserve(chunks.size() * sizeof(kernels::AdamWChunk));
    if (!chunks.empty()) {
      POPE_CUDA_CHECK(cudaMemcpyAsync(table, chunks.data(), chunks.size() * sizeof(kernels::AdamWChunk),
                                      cudaMemcpyHostToDevice, stream_));
      POPE_CUDA_CHECK(cudaStreamSynchronize(stream_));  // `chunks` dies at return
    }
    entry->segments.assign(segments.begin(), segments.end());
    entry->count = static_cast<int>(chunks.size());
    adamw_tables_.push_back(std::move(entry));
    return *adamw_tables_.back();
  }

  // Reads the record kernels fill on bad device-side input (after the stream has drained),
  // clears it and throws naming the op, the index and the value.
  void raise_device_errors() {
    DeviceErrorRecord record{};
    POPE_CUDA_CHECK(cudaMemcpyAsync(&record, device_error_, sizeof(record), cudaMemcpyDeviceToHost, stream_));
    POPE_CUDA_CHECK(cudaStreamSynchronize(stream_));
    if (record.op == kernels::kNoDeviceError) return;
    POPE_CUDA_CHECK(cudaMemsetAsync(device_error_, 0, sizeof(record), stream_));
    POPE_CUDA_CHECK(cudaStreamSynchronize(stream_));
    switch (record.op) {
      case kernels::kEmbeddingForwardToken:
      case kernels::kEmbeddingBackwardToken:
        cuda::fail(record.op == kernels::kEmbeddingForwardToken ? "embedding_forward" : "embedding_backward",
                   fmt::format("tokens[{}] = {} is outside the embedding table's {} rows (found on the GPU)",
                               record.index, record.value, record.limit));
      case kernels::kCrossEntropyTarget:
        cuda::fail("cross_entropy", fmt::format("targets[{}] = {} is not below vocab_size {} (negative targets mean "
                                                "masked; found on the GPU)",
                                                record.index, record.value, record.limit));
      default:
        cuda::fail("cuda backend", fmt::format("a kernel reported unknown error code {}", record.op));
    }
  }

  void require_fp8_tensor_cores(std::string_view op) const {
    require(fp8_tensor_cores_, op, fmt::format("{} has no FP8 tensor cores (they need sm_89 or later)", description_));
  }

  std::string description_;
  bool fp8_tensor_cores_ = false;  // sm_89 and later
  cudaStream_t stream_ = nullptr;
  DeviceErrorRecord* device_error_ = nullptr;
  double* sum_result_ = nullptr;
  // The product's operands and sizes, validated: op(a) [M, K] · op(b) [K, N] = out [M, N],
  // bf16 operands. K > 0 unless the product is empty.
  std::pair<std::int64_t, std::int64_t> check_rmsnorm_forward(std::string_view op, Tensor out, Tensor rstd, Tensor x,
                                                              Tensor gain, double eps) {
    const auto [rows, width] = rows_and_width(op, x);
    check_matrix(op, "x", x, DType::bf16, rows, width);
    check_vector(op, "gain", gain, DType::bf16, width);
    check_matrix(op, "out", out, DType::bf16, rows, width);
    check_vector(op, "rstd", rstd, DType::f32, rows);
    require(eps >= 0.0, op, fmt::format("eps is {}, expected >= 0", eps));
    check_sizes(op, {rows, width});
    return {rows, width};
  }

  void check_epilogue_aux(std::string_view op, Tensor out, Tensor aux) {
    check_2d(op, "out", out, DType::bf16);
    check_2d(op, "aux", aux, DType::bf16);
    require(aux.dim(0) == out.dim(0) && aux.dim(1) == out.dim(1), op,
            fmt::format("aux is {}, expected out's shape {}", shape_string(aux.shape), shape_string(out.shape)));
    require(aux.data != out.data, op, "aux aliases out; expected separate matrices");
  }

  static kernels::FewRowsEpilogue few_rows_epilogue(MatmulEpilogue epilogue) {
    return epilogue == MatmulEpilogue::add ? kernels::FewRowsEpilogue::add : kernels::FewRowsEpilogue::gelu;
  }

  // A product a · bᵀ of a few rows as the few-rows kernel takes it (supports() says whether it can).
  static kernels::FewRowsMatmul few_rows_call(const cuda::GemmCall& call, kernels::FewRowsEpilogue epilogue,
                                              Tensor aux) {
    kernels::FewRowsMatmul args;
    if (call.transpose_a || !call.transpose_b || call.m > kernels::kFewRowsMax) return args;  // rows = 0: unsupported
    args.rows = int(call.m);
    args.n = int(call.n);
    args.k = int(call.k);
    args.x = static_cast<const __nv_bfloat16*>(call.a);
    args.w = static_cast<const __nv_bfloat16*>(call.b);
    args.out = call.out;
    args.out_f32 = call.out_is_f32;
    args.epilogue = epilogue;
    if (epilogue == kernels::FewRowsEpilogue::add) args.addend = static_cast<const __nv_bfloat16*>(aux.data);
    if (epilogue == kernels::FewRowsEpilogue::gelu) args.aux = static_cast<__nv_bfloat16*>(aux.data);
    return args;
  }

  // Decoding's products of one token per sequence: one weight-streaming kernel instead of
  // cuBLASLt's split-K GEMM and its reduction. False when the kernel does not take the call.
  bool run_few_rows(const kernels::FewRowsMatmul& args, std::string_view op) {
    if (!kernels::few_rows_matmul_supports(args)) return false;
    launched(kernels::few_rows_matmul(args, stream_), op);
    return true;
  }

  cuda::GemmCall gemm_call(std::string_view op, Tensor out, Tensor a, Tensor b, bool transpose_a, bool transpose_b) {
    check_2d(op, "a", a, DType::bf16);
    check_2d(op, "b", b, DType::bf16);
    check_2d(op, "out", out, out.dtype);
    const std::int64_t m = a.dim(transpose_a ? 1 : 0), k = a.dim(transpose_a ? 0 : 1);
    const std::int64_t k_b = b.dim(transpose_b ? 1 : 0), n = b.dim(transpose_b ? 0 : 1);
    require(k == k_b && out.dim(0) == m && out.dim(1) == n, op,
            fmt::format("op(a) is [{}, {}] (a {}{}), op(b) is [{}, {}] (b {}{}), out {}; expected [M, K]·[K, N] = [M, N]",
                        m, k, shape_string(a.shape), transpose_a ? "ᵀ" : "", k_b, n, shape_string(b.shape),
                        transpose_b ? "ᵀ" : "", shape_string(out.shape)));
    require(k > 0 || m == 0 || n == 0, op,
            fmt::format("the inner dimension K is 0 (a {}, b {}); the CUDA backend needs K > 0", shape_string(a.shape),
                        shape_string(b.shape)));
    cuda::GemmCall call;
    call.out = out.data;
    call.out_is_f32 = out.dtype == DType::f32;
    call.a = a.data;
    call.b = b.data;
    call.m = m;
    call.n = n;
    call.k = k;
    call.transpose_a = transpose_a;
    call.transpose_b = transpose_b;
    return call;
  }

  std::unique_ptr<cuda::CublasLtMatmul> matmul_;
  std::unique_ptr<cuda::AttentionRunner> attention_;
  cuda::DeviceScratch embedding_scratch_, rmsnorm_scratch_, sum_scratch_, adamw_guard_scratch_;
  std::vector<std::unique_ptr<AdamWTable>> adamw_tables_;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(int device_index) { return std::make_unique<CudaBackend>(device_index); }

cudaStream_t cuda_backend_stream(Backend& backend) {
  auto* cuda_backend = dynamic_cast<CudaBackend*>(&backend);
  if (cuda_backend == nullptr)
    throw std::invalid_argument(fmt::format("cuda_backend_stream: backend {} is not the CUDA backend",
                                            backend.description()));
  return cuda_backend->stream();
}

}  // namespace pope
