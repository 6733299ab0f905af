// The GPT of the PoPE paper's setups, written once over the Backend op set:
//   token embedding → n_layer × [x += Attn(RMSNorm(x)); x += MLP(RMSNorm(x))] → RMSNorm → tied LM head.
// Attention carries the configured positional encoding; the MLP is d → 4d → d with GELU (tanh);
// no biases; the vocabulary is padded and padded logits are excluded from the loss.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "pope/backend.hpp"
#include "pope/config.hpp"
#include "pope/kv_cache.hpp"
#include "pope/position.hpp"
#include "pope/tensor.hpp"

namespace pope {

class Fp8Linears;

// Parameter names and shapes of a model (also used without allocating, e.g. to count).
ParameterLayout build_parameter_layout(const ModelConfig& config, const PositionEncoding& position);
// Trainable parameters: every layout entry, without the padded vocabulary rows of the tied
// embedding. count_matrix_parameters counts the 2-D weight matrices only (no norm gains or
// positional parameters): the paper's 123.5M / 252.8M / 772.1M are these counts.
std::int64_t count_parameters(const ModelConfig& config, const ParameterLayout& layout);
std::int64_t count_matrix_parameters(const ModelConfig& config, const ParameterLayout& layout);

// Throws std::invalid_argument naming the first token id outside [0, vocab_size) or target
// not below vocab_size (negative targets mean masked); targets may be empty.
void check_tokens(std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets, int vocab_size);

struct LossSum {
  double sum = 0.0;    // Σ per-token NLL over unmasked targets
  long count = 0;      // number of unmasked targets
  double mean() const { return count > 0 ? sum / double(count) : 0.0; }
};

class Model {
 public:
  // arena_multiple > 1 pads the master-weight and gradient arenas with zeros to a multiple
  // of it (ZeRO-1 splits them into that many equal shards); see padded_parameters().
  Model(const ModelConfig& config, Backend& backend, int arena_multiple = 1);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelConfig& config() const { return config_; }
  const ParameterLayout& layout() const { return layout_; }
  const PositionEncoding& position() const { return *position_; }
  Backend& backend() { return backend_; }
  std::int64_t parameter_count() const { return count_parameters(config_, layout_); }

  // Master weights and their gradients (parameter dtype, arena order).
  Tensor parameters() const { return params_.tensor; }
  Tensor gradients() const { return grads_.tensor; }
  // The same arenas followed by the zero padding up to the constructor's arena_multiple (the
  // padding is never written by the model nor touched by the optimizer's segments).
  Tensor padded_parameters() const { return padded(params_.tensor); }
  Tensor padded_gradients() const { return padded(grads_.tensor); }
  // Weights in the activation dtype used by forward/backward; the master tensor itself when
  // the dtypes agree. Call refresh_compute_weights() after writing parameters() directly.
  Tensor compute_weights() const;
  // The compute copy followed by zero padding as padded_parameters() (ZeRO-1 updates and
  // gathers it by shards); the master arena when the dtypes agree.
  Tensor padded_compute_weights() const;
  void refresh_compute_weights();
  // Arena ranges [begin, end) that the forward and backward read from the master weights
  // rather than the compute copy (the encodings' positional parameters, used in fp32), each
  // with the alignment padding that follows it (zeros), adjacent ones merged, in arena order.
  std::vector<std::pair<std::int64_t, std::int64_t>> master_read_ranges() const;
  std::vector<ParamSegment> segments() const;

  // N(0, init_std) weights, N(0, init_std/√(2·n_layer)) residual projections, unit norm
  // gains, zero padded vocabulary rows, the encoding's own initialisers. Deterministic.
  void initialize(std::uint64_t seed);
  // Host fp32 copies in arena order (see ParameterLayout), e.g. for checkpoints.
  std::vector<float> parameters_to_host() const;
  void parameters_from_host(std::span<const float> values);

  void zero_gradients();

  // Called by every backward pass as soon as the gradients of arena elements [begin, end)
  // are final for it (no later op of that pass writes them), so that their reduction can
  // start while the rest of the backward runs: the final norm first, then each layer from
  // the last to the first, the embedding last (tied to the classifier, it is written both
  // first and last). The ranges are contiguous, each ends where the previous one began, and
  // together they cover gradients(). An empty function: no calls.
  using GradientsReady = std::function<void(std::int64_t begin, std::int64_t end)>;
  void set_gradients_ready(GradientsReady callback) { gradients_ready_ = std::move(callback); }

  // FP8 products of the blocks' linear layers (train.precision = "fp8"; docs/design.md, "FP8
  // GEMMs") with an amax history of that many steps; 0 turns them off. Training and validation
  // use them, decoding does not. The backend must implement the FP8 ops (the CPU's are exact).
  void set_fp8(int amax_history);

  // Keep one shared buffer for every layer's RMSNorm and GELU outputs and recompute them in
  // the backward (the same kernels on the same inputs: bitwise the same gradients). Frees
  // the activations reserved so far.
  void set_activation_recompute(bool recompute);

  // false lets the attention backward trade bitwise repeatability for speed
  // (AttentionBackward::deterministic; train.deterministic). Default true.
  void set_deterministic(bool deterministic) { deterministic_ = deterministic; }
  // Who computes the attention of the encoded q̃, k̃ (AttentionForward::impl; attention.impl).
  // Default fused.
  void set_attention_impl(AttentionImpl impl) { attention_impl_ = impl; }

  // Forward (and with `backward`, backward) of B sequences of T tokens. tokens/targets are
  // host int32 [B·T]; targets < 0 are masked. Gradients ACCUMULATE, scaled so that the
  // gradient equals grad_scale · d(Σ token losses). token_losses, if given, receives the
  // per-token NLL [B·T] (0 where masked). Without a backward the logits are at least fp32
  // (on a bf16 backend the classifier GEMM writes fp32; training keeps bf16 logits).
  LossSum forward_backward(const std::int32_t* tokens, const std::int32_t* targets, int B, int T, double grad_scale,
                           float* token_losses = nullptr);
  LossSum forward(const std::int32_t* tokens, const std::int32_t* targets, int B, int T,
                  float* token_losses = nullptr);
  // Forward of B sequences of T tokens, returning the logits over the real vocabulary of the
  // flat positions `rows` (b·T + t), row after row: [rows.size() × vocab_size]. For tasks
  // scored by the argmax at a few positions (indirect indexing); only the classifier chunks
  // that hold a wanted row are computed, with forward()'s at-least-fp32 logits.
  std::vector<float> logits_at(const std::int32_t* tokens, int B, int T, std::span<const std::int64_t> rows);
  // The same forward and backward over tokens and targets already in backend memory (i32
  // [B·T]), reading nothing back and never synchronising, so that a training step can be
  // recorded and replayed: the sum of the token losses is ADDED to `loss_sum` (one f64
  // element). Token ids the GPU finds out of range are reported by the next synchronize().
  void forward_backward(Tensor tokens, Tensor targets, int B, int T, double grad_scale, Tensor loss_sum);

  // Incremental decoding. make_kv_cache allocates the cache of `batch` sequences of up to
  // `capacity` positions; an encoding that is only defined up to the training length (RoPE
  // without scaling) refuses a capacity past it (std::invalid_argument saying so). decode runs
  // n new tokens per sequence (host int32 [batch · n], sequence after sequence) at the cache's
  // next positions, appends them to the cache, and returns fp32 logits over the real
  // vocabulary: of each sequence's last new row [batch × vocab_size], or with all_rows of every
  // new row [batch · n × vocab_size]. They equal logits_at's over the same tokens up to rounding.
  std::unique_ptr<KvCache> make_kv_cache(int batch, int capacity);
  std::vector<float> decode(KvCache& cache, std::span<const std::int32_t> tokens, int n, bool all_rows = false);

  // Greedy decoding with the chosen tokens kept in backend memory, so that the next step can be
  // queued before the host has read this one's. queue_greedy(cache, tokens, n) queues a decode
  // call as decode() does, then the choice of each sequence's most likely next token
  // (Backend::greedy_tokens); queue_greedy(cache) queues a one-token step over the tokens the
  // last greedy call chose. read_greedy waits for the oldest queued call and returns its
  // choice. At most two calls are queued unread; decode() and the form with tokens need none.
  struct GreedyChoice {
    std::vector<std::int32_t> ids;     // [batch]
    std::vector<double> log_probs;     // the model's log-probability of each (fp32 on the GPU)
  };
  void queue_greedy(KvCache& cache, std::span<const std::int32_t> tokens, int n);
  void queue_greedy(KvCache& cache);
  GreedyChoice read_greedy(KvCache& cache);

  // Changes whenever the activation buffers are reallocated (a call with another B or T), so
  // that recorded work which holds their addresses knows it must be recorded again.
  std::uint64_t activation_generation() const { return activation_generation_; }

 private:
  struct Activations;
  LossSum run(const std::int32_t* tokens, const std::int32_t* targets, int B, int T, bool backward,
              double grad_scale, float* token_losses);
  void reserve(int B, int T);
  Tensor weight(std::size_t index) const;
  Tensor grad(std::size_t index) const;
  void forward_pass(Tensor tokens, int B, int T);
  void reserve_decode(KvCache& cache, std::int64_t rows);
  void reserve_decode_logits(KvCache& cache, std::int64_t rows);
  void queue_decode(KvCache& cache, int n, bool all_rows);
  void check_decode(const KvCache& cache, std::size_t tokens, int n) const;
  void upload_decode_inputs(KvCache& cache, std::span<const std::int32_t> tokens);
  void run_decode(KvCache& cache, int n, bool all_rows);
  void queue_choice(KvCache& cache, int n);
  // One layer's forward over the tensors of `t`; `attention` computes t.attn from t.qkv given the
  // layer's position parameters (the full forward's or the decode's attention).
  struct LayerTensors;
  using LayerAttention = std::function<void(const LayerTensors& t, std::span<const Tensor> position_params)>;
  void layer_forward(int l, const LayerTensors& t, bool recompute, const LayerAttention& attention);
  void classifier(Tensor targets, std::int64_t N, bool backward, double grad_scale);
  void backward_pass(Tensor tokens, int B, int T);
  void gradients_final(std::int64_t begin, std::int64_t end) const;
  Tensor padded(const Tensor& arena) const;

  ModelConfig config_;
  Backend& backend_;
  std::unique_ptr<PositionEncoding> position_;
  ParameterLayout layout_;
  OwnedTensor params_, grads_, compute_;
  bool separate_compute_ = false;

  // Arena indices of each layer's tensors.
  struct LayerIndex {
    std::size_t attn_norm, qkv, attn_proj, mlp_norm, fc, mlp_proj;
    std::vector<std::size_t> position;
  };
  std::size_t wte_ = 0, final_norm_ = 0;
  std::vector<LayerIndex> layers_;
  // Arena offset where each layer's tensors begin (they are contiguous), then the final
  // norm's: layer l owns [layer_begin_[l], layer_begin_[l + 1]).
  std::vector<std::int64_t> layer_begin_;
  std::int64_t padded_numel_ = 0;
  GradientsReady gradients_ready_;
  std::unique_ptr<Activations> acts_;
  bool recompute_ = false;
  std::unique_ptr<Fp8Linears> fp8_;
  bool deterministic_ = true;
  AttentionImpl attention_impl_ = AttentionImpl::fused;
  std::uint64_t activation_generation_ = 0;
};

}  // namespace pope
