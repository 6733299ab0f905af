// The CPU reference ops, one family per source file, each a template over Real (float or
// double) explicitly instantiated for both. Semantics are those of the Backend methods of
// the same name (backend.hpp); every op validates its tensors first and runs on `threads`
// OpenMP threads with results independent of that number.
#pragma once

#include <cstdint>
#include <span>

#include "pope/backend.hpp"

namespace pope::cpu {

// cpu_convert.cpp: element conversion between f32, f64 and bf16 (model/bf16.hpp); f64 → bf16
// goes through f32.
void convert(int threads, Tensor dst, Tensor src);

// cpu_embedding.cpp
template <class Real> void embedding_forward(int threads, Tensor out, Tensor tokens, Tensor wte);
template <class Real> void embedding_backward(int threads, Tensor dwte, Tensor dout, Tensor tokens);

// cpu_rmsnorm.cpp
template <class Real> void rmsnorm_forward(int threads, Tensor out, Tensor rstd, Tensor x, Tensor gain, double eps);
template <class Real>
void rmsnorm_backward(int threads, Tensor dx, Tensor dgain, Tensor dout, Tensor x, Tensor gain, Tensor rstd);

// cpu_matmul.cpp (OpenBLAS)
template <class Real>
void matmul(int threads, Tensor out, Tensor a, Tensor b, bool transpose_a, bool transpose_b, double alpha, double beta);

// cpu_elementwise.cpp
template <class Real> void gelu_forward(int threads, Tensor out, Tensor x);
template <class Real> void gelu_backward(int threads, Tensor dx, Tensor dout, Tensor x);
template <class Real> void add(int threads, Tensor out, Tensor a, Tensor b);
template <class Real> void clamp(int threads, Tensor x, double lowest, double highest);

// cpu_attention.cpp
template <class Real> void attention_forward(int threads, const AttentionForward& args);
template <class Real> void attention_backward(int threads, const AttentionBackward& args);
// cpu_attention_decode.cpp
template <class Real> void attention_decode(int threads, const AttentionDecode& args);

// cpu_cross_entropy.cpp
template <class Real>
void cross_entropy(int threads, Tensor losses, Tensor logits, Tensor targets, int vocab_size, bool compute_grad,
                   double grad_scale);

// cpu_greedy_tokens.cpp
template <class Real>
void greedy_tokens(int threads, Tensor ids, Tensor log_probs, Tensor logits, int vocab_size, Tensor past, int advance);

// cpu_fp8.cpp
template <class Real>
void fp8_cast(int threads, Tensor out, Tensor out_t, Tensor x, Tensor scale, Tensor amax, Backend::Fp8Prologue prologue,
              Tensor pre);
void fp8_update_scales(Tensor amax, Tensor history, Tensor scale, Tensor scale_inv, DType format, int margin);
template <class Real>
void fp8_matmul(int threads, Tensor out, Tensor a, Tensor a_scale_inv, Tensor b, Tensor b_scale_inv, double beta,
                Tensor addend);

// cpu_optimizer.cpp
template <class Real> double sum_of_squares(int threads, Tensor x);
template <class Real> void sum_of_squares_into(int threads, Tensor result, Tensor x);
template <class Real> void accumulate_sum(Tensor total, Tensor values);
template <class Real>
void adamw(int threads, Tensor params, Tensor grads, Tensor m, Tensor v, std::span<const ParamSegment> segments,
           const AdamWStep& step, Tensor compute_copy);
template <class Real>
void adamw_guarded(int threads, Tensor params, Tensor grads, Tensor m, Tensor v, std::span<const ParamSegment> segments,
                   const AdamWHyper& hyper, Tensor schedule, Tensor stats, Tensor compute_copy);

}  // namespace pope::cpu
