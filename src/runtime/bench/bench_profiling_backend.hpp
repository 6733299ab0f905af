// A timing decorator over another Backend: forwards every op and, while enabled, brackets
// each one with two timed fences of the inner backend (CUDA events on the GPU), summing the
// device time between them per op name (and per shape for products and FP8 casts). Nothing synchronises
// between ops, so the profiled step runs as a real eager one and short ops are not inflated by
// launch and wake-up latency (synchronising around each op added tens of microseconds to
// every short op). An op's time still includes any wait of the device for the host to queue
// it, so a host-bound stretch shows up in the ops it delays. times() waits for the last fence.
// While disabled it only forwards.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "pope/backend.hpp"
#include "pope/bench.hpp"

namespace pope {

class ProfilingBackend final : public Backend {
 public:
  explicit ProfilingBackend(Backend& inner) : inner_(inner) {}

  void set_enabled(bool enabled) { enabled_ = enabled; }
  // Accumulated times, the slowest first; waits for the ops timed so far to finish.
  std::vector<OpTime> times();

  DeviceKind device() const override { return inner_.device(); }
  BackendDTypes dtypes() const override { return inner_.dtypes(); }
  std::string description() const override { return inner_.description(); }

  Buffer allocate(std::size_t bytes) override;
  void fill(Tensor t, double value) override;
  void copy(Tensor dst, Tensor src) override;
  void convert(Tensor dst, Tensor src) override;
  void copy_from_host(Tensor dst, const void* src) override;
  void copy_to_host(void* dst, Tensor src) override;
  void synchronize() override { inner_.synchronize(); }
  // Staging and fences pass straight through (the profiled step is eager, never recorded).
  Buffer allocate_host(std::size_t bytes) override { return inner_.allocate_host(bytes); }
  void copy_from_host_async(Tensor dst, const void* src) override { inner_.copy_from_host_async(dst, src); }
  void copy_to_host_async(void* dst, Tensor src) override { inner_.copy_to_host_async(dst, src); }
  std::unique_ptr<Fence> make_fence() override { return inner_.make_fence(); }
  std::unique_ptr<TimedFence> make_timed_fence() override { return inner_.make_timed_fence(); }

  void embedding_forward(Tensor out, Tensor tokens, Tensor wte) override;
  void embedding_backward(Tensor dwte, Tensor dout, Tensor tokens) override;
  void rmsnorm_forward(Tensor out, Tensor rstd, Tensor x, Tensor gain, double eps) override;
  void rmsnorm_backward(Tensor dx, Tensor dgain, Tensor dout, Tensor x, Tensor gain, Tensor rstd) override;
  void matmul(Tensor out, Tensor a, Tensor b, bool transpose_a, bool transpose_b, double alpha, double beta) override;
  void matmul_epilogue(Tensor out, Tensor a, Tensor b, bool transpose_a, bool transpose_b, MatmulEpilogue epilogue,
                       Tensor aux) override;
  void gelu_forward(Tensor out, Tensor x) override;
  void gelu_backward(Tensor dx, Tensor dout, Tensor x) override;
  void add(Tensor out, Tensor a, Tensor b) override;
  void clamp(Tensor x, double lowest, double highest) override;
  void fp8_cast(Tensor out, Tensor out_t, Tensor x, Tensor scale, Tensor amax, Fp8Prologue prologue,
                Tensor pre) override;
  void fp8_update_scales(Tensor amax, Tensor history, Tensor scale, Tensor scale_inv, DType format,
                         int margin) override;
  void fp8_matmul(Tensor out, Tensor a, Tensor a_scale_inv, Tensor b, Tensor b_scale_inv, double beta,
                  bool fast_accumulation, Tensor addend) override;
  bool has_fp8_tensor_cores() const override { return inner_.has_fp8_tensor_cores(); }
  void attention_forward(const AttentionForward& args) override;
  void attention_backward(const AttentionBackward& args) override;
  std::int64_t attention_encoded_numel(const AttentionShape& shape, const PositionEncoding& encoding) const override {
    return inner_.attention_encoded_numel(shape, encoding);
  }
  void cross_entropy(Tensor losses, Tensor logits, Tensor targets, int vocab_size, bool compute_grad,
                     double grad_scale) override;
  void greedy_tokens(Tensor ids, Tensor log_probs, Tensor logits, int vocab_size, Tensor past, int advance) override;
  double sum_of_squares(Tensor x) override;
  void sum_of_squares_into(Tensor result, Tensor x) override;
  void accumulate_sum(Tensor total, Tensor values) override;
  void adamw_guarded(Tensor params, Tensor grads, Tensor m, Tensor v, std::span<const ParamSegment> segments,
                     const AdamWHyper& hyper, Tensor schedule, Tensor stats, Tensor compute_copy) override;
  void adamw(Tensor params, Tensor grads, Tensor m, Tensor v, std::span<const ParamSegment> segments,
             const AdamWStep& step, Tensor compute_copy) override;

 private:
  // Runs `call`; while enabled, records a timed fence before and after it and keeps the pair
  // for the entry (op, detail) with its work. `detail` is only evaluated while enabled.
  struct Work {
    double flops = 0.0, bytes = 0.0;
  };
  template <class Call>
  auto timed(const char* op, const std::function<std::string()>& detail, Work work, Call&& call);
  template <class Call>
  auto timed(const char* op, Call&& call) {
    return timed(op, nullptr, Work{}, call);
  }

  // An op whose fences may not have been reached yet.
  struct PendingOp {
    std::string op, detail;
    Work work;
    std::unique_ptr<TimedFence> start, end;
  };

  Backend& inner_;
  bool enabled_ = false;
  std::vector<PendingOp> pending_;
  std::map<std::pair<std::string, std::string>, OpTime> times_;
};

}  // namespace pope
