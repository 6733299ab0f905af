#include "runtime/bench/bench_profiling_backend.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <type_traits>

namespace pope {

namespace {

// "out [M, N] = a [M, K] · bᵀ [N, K]" (+ "+ β·out" when accumulating): names the matmul's
// place in the model well enough (qkv, classifier, weight gradient, …) to read a profile.
std::string matmul_detail(const Tensor& out, const Tensor& a, const Tensor& b, bool ta, bool tb, double beta) {
  return fmt::format("out {} = a{} {} · b{} {}{}", shape_string(out.shape), ta ? "ᵀ" : "", shape_string(a.shape),
                     tb ? "ᵀ" : "", shape_string(b.shape), beta != 0.0 ? " + β·out" : "");
}

// out is [M, N]; the shared dimension K is a's second dimension, or its first when transposed.
double matmul_flops(const Tensor& out, const Tensor& a, bool transpose_a) {
  return out.shape.size() == 2 && a.shape.size() == 2
             ? 2.0 * double(out.shape[0]) * double(out.shape[1]) * double(a.shape[transpose_a ? 0 : 1])
             : 0.0;
}

const char* epilogue_name(Backend::MatmulEpilogue epilogue) {
  switch (epilogue) {
    case Backend::MatmulEpilogue::add:
      return " + aux";
    case Backend::MatmulEpilogue::gelu:
      return ", gelu";
    case Backend::MatmulEpilogue::gelu_backward:
      return ", · gelu'(aux)";
  }
  return "";
}

const char* prologue_name(Backend::Fp8Prologue prologue) {
  switch (prologue) {
    case Backend::Fp8Prologue::none:
      return "";
    case Backend::Fp8Prologue::gelu:
      return " of gelu(x)";
    case Backend::Fp8Prologue::gelu_backward:
      return " of x · gelu'(pre)";
  }
  return "";
}

// "x [R, C] → e4m3 rows + ᵀ" names the cast by its shape, its outputs and its prologue.
std::string cast_detail(const Tensor& out, const Tensor& out_t, const Tensor& x, Backend::Fp8Prologue prologue) {
  const Tensor& format = out.empty() ? out_t : out;
  const char* outputs = out.empty() ? "ᵀ" : out_t.empty() ? "rows" : "rows + ᵀ";
  return fmt::format("x {} → {} {}{}", shape_string(x.shape), dtype_name(format.dtype), outputs,
                     prologue_name(prologue));
}

// What the cast cannot avoid moving: x (and pre) read once, each output written once.
double cast_bytes(const Tensor& out, const Tensor& out_t, const Tensor& x, const Tensor& pre) {
  double bytes = 0.0;
  for (const Tensor* t : {&out, &out_t, &x, &pre})
    if (!t->empty()) bytes += double(t->nbytes());
  return bytes;
}

}  // namespace

template <class Call>
auto ProfilingBackend::timed(const char* op, const std::function<std::string()>& detail, Work work, Call&& call) {
  if (!enabled_) return call();
  PendingOp pending{op, detail ? detail() : std::string(), work, inner_.make_timed_fence(), nullptr};
  pending.start->record();
  // Keeps this call's fence pair once the call is queued.
  auto record = [&] {
    pending.end = inner_.make_timed_fence();
    pending.end->record();
    pending_.push_back(std::move(pending));
  };
  if constexpr (std::is_void_v<decltype(call())>) {
    call();
    record();
  } else {
    auto result = call();
    record();
    return result;
  }
}

std::vector<OpTime> ProfilingBackend::times() {
  for (PendingOp& pending : pending_) {
    pending.end->wait();
    OpTime& entry = times_[{pending.op, pending.detail}];
    entry.op = pending.op;
    entry.detail = pending.detail;
    entry.calls += 1;
    entry.seconds += pending.end->seconds_since(*pending.start);
    entry.flops += pending.work.flops;
    entry.bytes += pending.work.bytes;
  }
  pending_.clear();
  std::vector<OpTime> out;
  for (const auto& [key, entry] : times_) out.push_back(entry);
  std::sort(out.begin(), out.end(), [](const OpTime& a, const OpTime& b) { return a.seconds > b.seconds; });
  return out;
}

Buffer ProfilingBackend::allocate(std::size_t bytes) {
  return timed("allocate", [&] { return inner_.allocate(bytes); });
}
void ProfilingBackend::fill(Tensor t, double value) {
  timed("fill", [&] { inner_.fill(t, value); });
}
void ProfilingBackend::copy(Tensor dst, Tensor src) {
  timed("copy", [&] { inner_.copy(dst, src); });
}
void ProfilingBackend::convert(Tensor dst, Tensor src) {
  timed("convert", [&] { inner_.convert(dst, src); });
}
void ProfilingBackend::copy_from_host(Tensor dst, const void* src) {
  timed("copy_from_host", [&] { inner_.copy_from_host(dst, src); });
}
void ProfilingBackend::copy_to_host(void* dst, Tensor src) {
  timed("copy_to_host", [&] { inner_.copy_to_host(dst, src); });
}

void ProfilingBackend::embedding_forward(Tensor out, Tensor tokens, Tensor wte) {
  timed("embedding_forward", [&] { inner_.embedding_forward(out, tokens, wte); });
}
void ProfilingBackend::embedding_backward(Tensor dwte, Tensor dout, Tensor tokens) {
  timed("embedding_backward", [&] { inner_.embedding_backward(dwte, dout, tokens); });
}
void ProfilingBackend::rmsnorm_forward(Tensor out, Tensor rstd, Tensor x, Tensor gain, double eps) {
  timed("rmsnorm_forward", [&] { inner_.rmsnorm_forward(out, rstd, x, gain, eps); });
}
void ProfilingBackend::rmsnorm_backward(Tensor dx, Tensor dgain, Tensor dout, Tensor x, Tensor gain, Tensor rstd) {
  timed("rmsnorm_backward", [&] { inner_.rmsnorm_backward(dx, dgain, dout, x, gain, rstd); });
}

void ProfilingBackend::matmul(Tensor out, Tensor a, Tensor b, bool transpose_a, bool transpose_b, double alpha,
                              double beta) {
  timed(
      "matmul", [&] { return matmul_detail(out, a, b, transpose_a, transpose_b, beta); },
      Work{matmul_flops(out, a, transpose_a)},
      [&] { inner_.matmul(out, a, b, transpose_a, transpose_b, alpha, beta); });
}

void ProfilingBackend::matmul_epilogue(Tensor out, Tensor a, Tensor b, bool transpose_a, bool transpose_b,
                                       MatmulEpilogue epilogue, Tensor aux) {
  timed(
      "matmul", [&] { return matmul_detail(out, a, b, transpose_a, transpose_b, 0.0) + epilogue_name(epilogue); },
      Work{matmul_flops(out, a, transpose_a)},
      [&] { inner_.matmul_epilogue(out, a, b, transpose_a, transpose_b, epilogue, aux); });
}

void ProfilingBackend::gelu_forward(Tensor out, Tensor x) {
  timed("gelu_forward", [&] { inner_.gelu_forward(out, x); });
}
void ProfilingBackend::gelu_backward(Tensor dx, Tensor dout, Tensor x) {
  timed("gelu_backward", [&] { inner_.gelu_backward(dx, dout, x); });
}
void ProfilingBackend::add(Tensor out, Tensor a, Tensor b) {
  timed("add", [&] { inner_.add(out, a, b); });
}
void ProfilingBackend::clamp(Tensor x, double lowest, double highest) {
  timed("clamp", [&] { inner_.clamp(x, lowest, highest); });
}
void ProfilingBackend::fp8_cast(Tensor out, Tensor out_t, Tensor x, Tensor scale, Tensor amax, Fp8Prologue prologue,
                                Tensor pre) {
  timed(
      "fp8_cast", [&] { return cast_detail(out, out_t, x, prologue); }, Work{0.0, cast_bytes(out, out_t, x, pre)},
      [&] { inner_.fp8_cast(out, out_t, x, scale, amax, prologue, pre); });
}
void ProfilingBackend::fp8_update_scales(Tensor amax, Tensor history, Tensor scale, Tensor scale_inv, DType format,
                                         int margin) {
  timed("fp8_update_scales", [&] { inner_.fp8_update_scales(amax, history, scale, scale_inv, format, margin); });
}
void ProfilingBackend::fp8_matmul(Tensor out, Tensor a, Tensor a_scale_inv, Tensor b, Tensor b_scale_inv,
                                  double beta, bool fast_accumulation, Tensor addend) {
  timed(
      "fp8_matmul",
      [&] {
        return matmul_detail(out, a, b, false, true, addend.empty() ? beta : 0.0) + (addend.empty() ? "" : " + addend");
      },
      Work{matmul_flops(out, a, false)},
      [&] { inner_.fp8_matmul(out, a, a_scale_inv, b, b_scale_inv, beta, fast_accumulation, addend); });
}
void ProfilingBackend::attention_forward(const AttentionForward& args) {
  timed("attention_forward", [&] { inner_.attention_forward(args); });
}
void ProfilingBackend::attention_backward(const AttentionBackward& args) {
  timed("attention_backward", [&] { inner_.attention_backward(args); });
}
void ProfilingBackend::cross_entropy(Tensor losses, Tensor logits, Tensor targets, int vocab_size, bool compute_grad,
                                     double grad_scale) {
  timed("cross_entropy", [&] { inner_.cross_entropy(losses, logits, targets, vocab_size, compute_grad, grad_scale); });
}
void ProfilingBackend::greedy_tokens(Tensor ids, Tensor log_probs, Tensor logits, int vocab_size, Tensor past,
                                     int advance) {
  timed("greedy_tokens", [&] { inner_.greedy_tokens(ids, log_probs, logits, vocab_size, past, advance); });
}
double ProfilingBackend::sum_of_squares(Tensor x) {
  return timed("sum_of_squares", [&] { return inner_.sum_of_squares(x); });
}
void ProfilingBackend::sum_of_squares_into(Tensor result, Tensor x) {
  timed("sum_of_squares", [&] { inner_.sum_of_squares_into(result, x); });
}
void ProfilingBackend::accumulate_sum(Tensor total, Tensor values) {
  timed("accumulate_sum", [&] { inner_.accumulate_sum(total, values); });
}
void ProfilingBackend::adamw_guarded(Tensor params, Tensor grads, Tensor m, Tensor v,
                                     std::span<const ParamSegment> segments, const AdamWHyper& hyper, Tensor schedule,
                                     Tensor stats, Tensor compute_copy) {
  timed("adamw", [&] { inner_.adamw_guarded(params, grads, m, v, segments, hyper, schedule, stats, compute_copy); });
}
void ProfilingBackend::adamw(Tensor params, Tensor grads, Tensor m, Tensor v, std::span<const ParamSegment> segments,
                             const AdamWStep& step, Tensor compute_copy) {
  timed("adamw", [&] { inner_.adamw(params, grads, m, v, segments, step, compute_copy); });
}

}  // namespace pope
