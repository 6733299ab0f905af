// The CPU reference backend: host memory plus the ops of cpu_ops.hpp, computed in Real
// (float for training on a CPU, double for finite-difference gradient checks). Readable
// first; OpenMP over rows/heads and OpenBLAS for matmul keep small models usable.
#include "cpu/cpu_backend.hpp"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <type_traits>

#include "cpu/cpu_checks.hpp"
#include "cpu/cpu_ops.hpp"
#include "cpu/cpu_parallel.hpp"
#include "model/bf16.hpp"
#include "model/fp8.hpp"

namespace pope {

namespace {

constexpr std::size_t kAlignment = 64;  // a cache line; also what AVX-512 loads like

template <class Element> void fill_as(int threads, Tensor t, Element value) {
  auto* data = static_cast<Element*>(t.data);
  parallel_for(threads, t.numel(), [&](std::int64_t i) { data[i] = value; });
}

// Every CPU op has finished when it returns, so there is nothing to wait for, and the time
// of a fence's work is the time record() was called.
class FinishedFence final : public TimedFence {
 public:
  void record() override {
    reached_ = std::chrono::steady_clock::now();
    recorded_ = true;
  }
  void wait() override {}
  bool ready() override { return true; }
  double seconds_since(const TimedFence& earlier) const override {
    const auto* other = dynamic_cast<const FinishedFence*>(&earlier);
    if (other == nullptr || !recorded_ || !other->recorded_)
      throw std::logic_error("seconds_since: both fences must be recorded CPU fences");
    return std::chrono::duration<double>(reached_ - other->reached_).count();
  }

 private:
  std::chrono::steady_clock::time_point reached_{};
  bool recorded_ = false;
};

template <class Real> class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int threads) : threads_(threads) {}

  DeviceKind device() const override { return DeviceKind::cpu; }
  BackendDTypes dtypes() const override { return {kReal, kReal, kReal}; }
  std::string description() const override {
    return fmt::format("cpu ({}, {} thread{}, OpenBLAS)", std::is_same_v<Real, float> ? "float" : "double", threads_,
                       threads_ == 1 ? "" : "s");
  }

  Buffer allocate(std::size_t bytes) override {
    const std::size_t rounded = std::max<std::size_t>(kAlignment, (bytes + kAlignment - 1) / kAlignment * kAlignment);
    void* memory = std::aligned_alloc(kAlignment, rounded);
    if (memory == nullptr) throw std::bad_alloc();
    std::memset(memory, 0, rounded);
    return Buffer(memory, [](void* p) { std::free(p); });
  }

  void fill(Tensor t, double value) override {
    switch (t.dtype) {
      case DType::f32: fill_as(threads_, t, static_cast<float>(value)); return;
      case DType::f64: fill_as(threads_, t, value); return;
      case DType::i32: fill_as(threads_, t, static_cast<std::int32_t>(value)); return;
      case DType::bf16: fill_as(threads_, t, float_to_bf16(static_cast<float>(value))); return;
      case DType::u16: fill_as(threads_, t, static_cast<std::uint16_t>(value)); return;
      case DType::e4m3:
      case DType::e5m2: std::memset(t.data, float_to_fp8(static_cast<float>(value), t.dtype), t.nbytes()); return;
    }
  }

  void copy(Tensor dst, Tensor src) override {
    cpu::require(dst.dtype == src.dtype && dst.numel() == src.numel(), "copy",
                 fmt::format("dst is {} {}, src is {} {}; expected the same dtype and element count",
                             dtype_name(dst.dtype), shape_string(dst.shape), dtype_name(src.dtype),
                             shape_string(src.shape)));
    if (dst.nbytes() > 0) std::memmove(dst.data, src.data, dst.nbytes());
  }
  void convert(Tensor dst, Tensor src) override { cpu::convert(threads_, dst, src); }
  void copy_from_host(Tensor dst, const void* src) override {
    if (dst.nbytes() > 0) std::memcpy(dst.data, src, dst.nbytes());
  }
  void copy_to_host(void* dst, Tensor src) override {
    if (src.nbytes() > 0) std::memcpy(dst, src.data, src.nbytes());
  }
  void synchronize() override {}  // every op has finished when it returns

  // Ordinary host memory: the "asynchronous" copies finish before they return.
  Buffer allocate_host(std::size_t bytes) override { return allocate(bytes); }
  void copy_from_host_async(Tensor dst, const void* src) override { copy_from_host(dst, src); }
  void copy_to_host_async(void* dst, Tensor src) override { copy_to_host(dst, src); }
  std::unique_ptr<Fence> make_fence() override { return std::make_unique<FinishedFence>(); }
  std::unique_ptr<TimedFence> make_timed_fence() override { return std::make_unique<FinishedFence>(); }

  void embedding_forward(Tensor out, Tensor tokens, Tensor wte) override {
    cpu::embedding_forward<Real>(threads_, out, tokens, wte);
  }
  void embedding_backward(Tensor dwte, Tensor dout, Tensor tokens) override {
    cpu::embedding_backward<Real>(threads_, dwte, dout, tokens);
  }
  void rmsnorm_forward(Tensor out, Tensor rstd, Tensor x, Tensor gain, double eps) override {
    cpu::rmsnorm_forward<Real>(threads_, out, rstd, x, gain, eps);
  }
  void rmsnorm_backward(Tensor dx, Tensor dgain, Tensor dout, Tensor x, Tensor gain, Tensor rstd) override {
    cpu::rmsnorm_backward<Real>(threads_, dx, dgain, dout, x, gain, rstd);
  }
  void matmul(Tensor out, Tensor a, Tensor b, bool transpose_a, bool transpose_b, double alpha,
              double beta) override {
    cpu::matmul<Real>(threads_, out, a, b, transpose_a, transpose_b, alpha, beta);
  }
  void gelu_forward(Tensor out, Tensor x) override { cpu::gelu_forward<Real>(threads_, out, x); }
  void gelu_backward(Tensor dx, Tensor dout, Tensor x) override { cpu::gelu_backward<Real>(threads_, dx, dout, x); }
  void add(Tensor out, Tensor a, Tensor b) override { cpu::add<Real>(threads_, out, a, b); }
  void clamp(Tensor x, double lowest, double highest) override { cpu::clamp<Real>(threads_, x, lowest, highest); }
  void fp8_cast(Tensor out, Tensor out_t, Tensor x, Tensor scale, Tensor amax, Fp8Prologue prologue,
                Tensor pre) override {
    cpu::fp8_cast<Real>(threads_, out, out_t, x, scale, amax, prologue, pre);
  }
  void fp8_update_scales(Tensor amax, Tensor history, Tensor scale, Tensor scale_inv, DType format,
                         int margin) override {
    cpu::fp8_update_scales(amax, history, scale, scale_inv, format, margin);
  }
  void fp8_matmul(Tensor out, Tensor a, Tensor a_scale_inv, Tensor b, Tensor b_scale_inv, double beta,
                  bool /*fast_accumulation: the CPU is exact*/, Tensor addend) override {
    cpu::fp8_matmul<Real>(threads_, out, a, a_scale_inv, b, b_scale_inv, beta, addend);
  }
  void attention_forward(const AttentionForward& args) override { cpu::attention_forward<Real>(threads_, args); }
  void attention_backward(const AttentionBackward& args) override { cpu::attention_backward<Real>(threads_, args); }
  void attention_decode(const AttentionDecode& args) override { cpu::attention_decode<Real>(threads_, args); }
  void cross_entropy(Tensor losses, Tensor logits, Tensor targets, int vocab_size, bool compute_grad,
                     double grad_scale) override {
    cpu::cross_entropy<Real>(threads_, losses, logits, targets, vocab_size, compute_grad, grad_scale);
  }
  void greedy_tokens(Tensor ids, Tensor log_probs, Tensor logits, int vocab_size, Tensor past, int advance) override {
    cpu::greedy_tokens<Real>(threads_, ids, log_probs, logits, vocab_size, past, advance);
  }
  double sum_of_squares(Tensor x) override { return cpu::sum_of_squares<Real>(threads_, x); }
  void sum_of_squares_into(Tensor result, Tensor x) override { cpu::sum_of_squares_into<Real>(threads_, result, x); }
  void accumulate_sum(Tensor total, Tensor values) override { cpu::accumulate_sum<Real>(total, values); }
  void adamw(Tensor params, Tensor grads, Tensor m, Tensor v, std::span<const ParamSegment> segments,
             const AdamWStep& step, Tensor compute_copy) override {
    cpu::adamw<Real>(threads_, params, grads, m, v, segments, step, compute_copy);
  }
  void adamw_guarded(Tensor params, Tensor grads, Tensor m, Tensor v, std::span<const ParamSegment> segments,
                     const AdamWHyper& hyper, Tensor schedule, Tensor stats, Tensor compute_copy) override {
    cpu::adamw_guarded<Real>(threads_, params, grads, m, v, segments, hyper, schedule, stats, compute_copy);
  }

 private:
  static constexpr DType kReal = dtype_of<Real>();
  int threads_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const std::string& precision, int threads) {
  if (threads < 0) throw std::invalid_argument(fmt::format("cpu backend: threads is {}, expected >= 0 (0 = all)", threads));
  const int resolved = threads == 0 ? omp_get_max_threads() : threads;
  if (precision == "float") return std::make_unique<CpuBackend<float>>(resolved);
  if (precision == "double") return std::make_unique<CpuBackend<double>>(resolved);
  throw std::invalid_argument(fmt::format("cpu backend: precision '{}' is unknown, expected \"float\" or \"double\"", precision));
}

}  // namespace pope
