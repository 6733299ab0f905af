// The blocks' four linear layers in FP8 (train.precision = "fp8"; docs/design.md, "FP8 GEMMs"):
// per layer and linear, the scaled e4m3 forms of the weight (and its transpose, cast in every
// forward) and of the input (its transpose kept for the weight gradient), the e5m2 forms of the
// output's gradient, and every tensor's delayed-scaling state. A tensor's first cast measures its
// amax before casting (current scaling) so that no first step runs at a blind scale; later casts
// use the scale of the amax history and update it after each backward.
#pragma once

#include <cstdint>
#include <vector>

#include "pope/backend.hpp"

namespace pope {

class Fp8Linears {
 public:
  enum Linear : int { qkv = 0, attn_proj = 1, mlp_fc = 2, mlp_proj = 3 };
  static constexpr int kLinears = 4;

  // history: the amax history's length (≥ 1). A Linear's features follow from n_embd (qkv C → 3C,
  // attn_proj C → C, mlp_fc C → 4C, mlp_proj 4C → C).
  Fp8Linears(Backend& backend, int n_layer, std::int64_t n_embd, int history);

  // Buffers for micro-batches of exactly `rows` rows (B·T); allocates again only when rows changes.
  void reserve(std::int64_t rows);

  using Prologue = Backend::Fp8Prologue;
  // out [rows, N] (activation dtype) = x [rows, K] · wᵀ (+ addend, out's shape, when given: the
  // residual add in the product), w [N, K], through FP8; with the gelu prologue, gelu(x) takes x's
  // place (x the GELU's input), fused into x's cast.
  void forward(int layer, Linear which, Tensor out, Tensor x, Tensor w, Prologue prologue = Prologue::none,
               Tensor addend = {});
  // dx [rows, K] = dy · w (skipped when empty) and dw [N, K] (f32) += dyᵀ · x, with the x of the
  // last forward of this layer and linear; dy [rows, N]. With the gelu_backward prologue,
  // dy · gelu'(pre) takes dy's place (dy the gradient of GELU's output, pre its input).
  void backward(int layer, Linear which, Tensor dx, Tensor dw, Tensor dy, Prologue prologue = Prologue::none,
                Tensor pre = {});
  // The delayed-scaling update of every tensor: after each backward.
  void update_scales();

 private:
  struct Group {  // the scaling state of one format's tensors
    OwnedTensor amax, history, scale, scale_inv;
  };
  struct Slot {  // one tensor's views into its group
    Tensor amax, history, scale, scale_inv;
  };
  Slot slot(Group& group, std::int64_t index);
  std::int64_t index(int layer, Linear which) const { return std::int64_t(layer) * kLinears + which; }
  std::int64_t in_features(Linear which) const;
  std::int64_t out_features(Linear which) const;
  // Casts x (through the prologue) into out/out_t with the slot's scale; the first time, measures
  // the amax first.
  void cast(Slot s, Tensor out, Tensor out_t, Tensor x, std::int64_t id, DType format, Prologue prologue, Tensor pre);

  Backend& backend_;
  int n_layer_;
  std::int64_t n_embd_;
  std::int64_t rows_ = 0;
  Group e4m3_, e5m2_;  // e4m3: inputs [0, L·4), weights [L·4, L·8); e5m2: output gradients [0, L·4)
  std::vector<bool> calibrated_;  // per e4m3 tensor, then per e5m2 tensor
  std::vector<OwnedTensor> x_t_, w_, w_t_;  // per layer and linear
  OwnedTensor x8_, dy8_, dy8_t_;  // scratch of the widest linear
};

}  // namespace pope
