#include "pope/model.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

#include "model/forward_logits.hpp"
#include "model/fp8_linears.hpp"
#include "model/layer_tensors.hpp"
#include "model/parameter_init.hpp"
#include "pope/rng.hpp"

namespace pope {

namespace {

// Rows of the classifier processed at once: bounds the logits buffer to rows × padded vocab
// (the full B·T × V matrix is never stored; 4,096 × 50,304 is 0.8 GB in fp32 for evaluation,
// 0.4 GB in bf16 for training). Fewer, larger chunks keep the three classifier GEMMs efficient:
// at 1,024 rows the weight gradient's K was 1,024.
constexpr int kClassifierRows = 4096;

std::string layer_name(int layer, const char* what) { return fmt::format("layers.{}.{}", layer, what); }

}  // namespace

void check_tokens(std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets, int vocab_size) {
  for (std::size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] < 0 || tokens[i] >= vocab_size)
      throw std::invalid_argument(
          fmt::format("token {} at index {} outside the vocabulary [0, {})", tokens[i], i, vocab_size));
  for (std::size_t i = 0; i < targets.size(); ++i)
    if (targets[i] >= vocab_size)
      throw std::invalid_argument(fmt::format("target {} at index {} is not below the vocabulary size {} (negative "
                                              "targets mean masked)",
                                              targets[i], i, vocab_size));
}

ParameterLayout build_parameter_layout(const ModelConfig& c, const PositionEncoding& position) {
  const std::int64_t C = c.n_embd;
  const double std = c.init_std;
  const double residual_std = c.init_std / std::sqrt(2.0 * c.n_layer);
  ParameterLayout layout;
  layout.add({"wte.weight", {c.padded_vocab_size, C}, true, InitKind::normal, std});
  for (int l = 0; l < c.n_layer; ++l) {
    layout.add({layer_name(l, "attn_norm.weight"), {C}, false, InitKind::ones});
    layout.add({layer_name(l, "attn.qkv.weight"), {3 * C, C}, true, InitKind::normal, std});
    layout.add({layer_name(l, "attn.proj.weight"), {C, C}, true, InitKind::normal, residual_std});
    for (ParamSpec spec : position.layer_parameters(c.n_head, c.head_dim())) {
      spec.name = layer_name(l, ("position." + spec.name).c_str());
      spec.weight_decay = false;  // positional parameters are never decayed
      layout.add(std::move(spec));
    }
    layout.add({layer_name(l, "mlp_norm.weight"), {C}, false, InitKind::ones});
    layout.add({layer_name(l, "mlp.fc.weight"), {4 * C, C}, true, InitKind::normal, std});
    layout.add({layer_name(l, "mlp.proj.weight"), {C, 4 * C}, true, InitKind::normal, residual_std});
  }
  layout.add({"final_norm.weight", {C}, false, InitKind::ones});
  return layout;
}

namespace {
std::int64_t count_without_padding(const ModelConfig& config, const ParameterLayout& layout, bool matrices_only) {
  std::int64_t n = 0;
  for (const auto& spec : layout.specs())
    if (!matrices_only || (spec.shape.size() == 2 && spec.weight_decay)) n += shape_numel(spec.shape);
  return n - std::int64_t(config.padded_vocab_size - config.vocab_size) * config.n_embd;
}
}  // namespace

std::int64_t count_parameters(const ModelConfig& config, const ParameterLayout& layout) {
  return count_without_padding(config, layout, false);
}

std::int64_t count_matrix_parameters(const ModelConfig& config, const ParameterLayout& layout) {
  return count_without_padding(config, layout, true);
}

// Everything the backward pass needs from the forward, per layer, for one B × T.
struct Model::Activations {
  int B = 0, T = 0;
  OwnedTensor tokens, targets;                 // i32 [N]
  std::vector<OwnedTensor> residual;           // n_layer + 1 of [N, C]: input of each layer, final output
  std::vector<OwnedTensor> residual_mid;       // after attention, before the MLP
  std::vector<OwnedTensor> norm1, norm2;       // RMSNorm outputs [N, C]; one shared when recomputed
  std::vector<OwnedTensor> rstd1, rstd2;       // [N]
  std::vector<OwnedTensor> qkv, attn, lse;     // [N, 3C], [N, C], [B, H, T]
  // What the backend keeps of each layer's attention forward for its backward (the CUDA
  // backend: q̃ and k̃); none without activation recompute's memory budget or on the CPU.
  std::vector<OwnedTensor> attention_encoded;
  std::vector<OwnedTensor> fc_pre, fc_act;     // [N, 4C]; fc_act one shared when recomputed
  OwnedTensor final_norm, final_rstd;          // [N, C], [N]
  // The classifier chunk's logits [rows, Vp]: one buffer in the forward-only dtype, which
  // train_logits sees in the (never wider) activation dtype, so that a trainer's validation
  // needs no second buffer and no reallocation (it would make a recorded step record again).
  OwnedTensor eval_logits;
  Tensor train_logits;
  OwnedTensor losses;                          // [N]
  // Backward scratch.
  OwnedTensor d_residual, d_norm, d_attn, d_qkv, d_fc;

  // Layer l's tensor of a per-layer list, or the one shared tensor of a recomputed list.
  static Tensor of_layer(const std::vector<OwnedTensor>& list, int l) {
    return list[list.size() == 1 ? 0 : std::size_t(l)].tensor;
  }
  Tensor norm1_of(int l) const { return of_layer(norm1, l); }
  Tensor norm2_of(int l) const { return of_layer(norm2, l); }
  Tensor fc_act_of(int l) const { return of_layer(fc_act, l); }
  Tensor attention_encoded_of(int l) const {
    return attention_encoded.empty() ? Tensor{} : attention_encoded[std::size_t(l)].tensor;
  }
};

Model::Model(const ModelConfig& config, Backend& backend, int arena_multiple)
    : config_(config), backend_(backend), position_(make_position_encoding(config)) {
  if (arena_multiple < 1)
    throw std::invalid_argument(fmt::format("Model: arena multiple {}, expected >= 1", arena_multiple));
  layout_ = build_parameter_layout(config_, *position_);
  const BackendDTypes dt = backend_.dtypes();
  const std::int64_t numel = layout_.total_numel();
  padded_numel_ = (numel + arena_multiple - 1) / arena_multiple * arena_multiple;
  // Allocated padded, viewed without the padding (allocate() zero-fills it).
  params_ = allocate_tensor(backend_, {padded_numel_}, dt.parameter);
  grads_ = allocate_tensor(backend_, {padded_numel_}, dt.parameter);
  params_.tensor.shape = {numel};
  grads_.tensor.shape = {numel};
  separate_compute_ = dt.activation != dt.parameter;
  if (separate_compute_) {
    compute_ = allocate_tensor(backend_, {padded_numel_}, dt.activation);
    compute_.tensor.shape = {numel};
  }

  wte_ = layout_.index_of("wte.weight");
  final_norm_ = layout_.index_of("final_norm.weight");
  const auto position_specs = position_->layer_parameters(config_.n_head, config_.head_dim());
  for (int l = 0; l < config_.n_layer; ++l) {
    LayerIndex li{};
    li.attn_norm = layout_.index_of(layer_name(l, "attn_norm.weight"));
    li.qkv = layout_.index_of(layer_name(l, "attn.qkv.weight"));
    li.attn_proj = layout_.index_of(layer_name(l, "attn.proj.weight"));
    li.mlp_norm = layout_.index_of(layer_name(l, "mlp_norm.weight"));
    li.fc = layout_.index_of(layer_name(l, "mlp.fc.weight"));
    li.mlp_proj = layout_.index_of(layer_name(l, "mlp.proj.weight"));
    for (const auto& spec : position_specs) li.position.push_back(layout_.index_of(layer_name(l, ("position." + spec.name).c_str())));
    layers_.push_back(std::move(li));
  }
  // The overlapped gradient reduction relies on each layer owning one contiguous run of the
  // arena that the backward pass finishes at once.
  for (int l = 0; l < config_.n_layer; ++l) layer_begin_.push_back(layout_.offset(layers_[std::size_t(l)].attn_norm));
  layer_begin_.push_back(layout_.offset(final_norm_));
  for (int l = 0; l < config_.n_layer; ++l) {
    const LayerIndex& li = layers_[std::size_t(l)];
    std::vector<std::size_t> owned{li.attn_norm, li.qkv, li.attn_proj, li.mlp_norm, li.fc, li.mlp_proj};
    owned.insert(owned.end(), li.position.begin(), li.position.end());
    for (std::size_t index : owned)
      if (layout_.offset(index) < layer_begin_[std::size_t(l)] || layout_.offset(index) >= layer_begin_[std::size_t(l) + 1])
        throw std::logic_error(fmt::format("Model: {} lies outside layer {}'s run of the parameter arena",
                                           layout_.specs()[index].name, l));
  }
  if (layout_.offset(wte_) != 0 || layer_begin_.front() < shape_numel(layout_.specs()[wte_].shape))
    throw std::logic_error("Model: the embedding must come first in the parameter arena");
}

Tensor Model::padded(const Tensor& arena) const {
  Tensor t = arena;
  t.shape = {padded_numel_};
  return t;
}

void Model::gradients_final(std::int64_t begin, std::int64_t end) const {
  if (gradients_ready_) gradients_ready_(begin, end);
}

Model::~Model() = default;

Tensor Model::compute_weights() const { return separate_compute_ ? compute_.tensor : params_.tensor; }
Tensor Model::padded_compute_weights() const { return padded(compute_weights()); }

std::vector<std::pair<std::int64_t, std::int64_t>> Model::master_read_ranges() const {
  std::vector<std::pair<std::int64_t, std::int64_t>> tensors, ranges;
  for (const LayerIndex& li : layers_)
    for (std::size_t index : li.position)  // with its alignment padding: a layer's run is one range
      tensors.emplace_back(layout_.offset(index), index + 1 < layout_.specs().size() ? layout_.offset(index + 1)
                                                                                      : layout_.total_numel());
  std::sort(tensors.begin(), tensors.end());
  for (const auto& [begin, end] : tensors) {
    if (!ranges.empty() && ranges.back().second == begin)
      ranges.back().second = end;
    else
      ranges.emplace_back(begin, end);
  }
  return ranges;
}

void Model::refresh_compute_weights() {
  if (separate_compute_) backend_.convert(compute_.tensor, params_.tensor);
}

Tensor Model::weight(std::size_t index) const { return layout_.view(compute_weights(), index); }
Tensor Model::grad(std::size_t index) const { return layout_.view(grads_.tensor, index); }

std::vector<ParamSegment> Model::segments() const {
  std::vector<ParamSegment> segments;
  for (std::size_t i = 0; i < layout_.specs().size(); ++i) {
    const auto& spec = layout_.specs()[i];
    segments.push_back({layout_.offset(i), shape_numel(spec.shape), spec.weight_decay, spec.bounds});
  }
  return segments;
}

void Model::initialize(std::uint64_t seed) {
  Rng rng(seed);
  std::vector<double> values(static_cast<std::size_t>(layout_.total_numel()), 0.0);
  const int d = config_.head_dim();
  for (std::size_t i = 0; i < layout_.specs().size(); ++i) {
    const ParamSpec& spec = layout_.specs()[i];
    double* p = values.data() + layout_.offset(i);
    // Padded vocabulary rows of the embedding stay zero: never looked up, never in the loss.
    const std::int64_t n = i == wte_ ? std::int64_t(config_.vocab_size) * config_.n_embd : shape_numel(spec.shape);
    initialize_parameter(spec, rng, std::span<double>(p, std::size_t(n)), [&](std::span<double> out) {
      // Only positional parameters use custom initialisers; find which entry this is.
      const auto specs = position_->layer_parameters(config_.n_head, d);
      const std::string suffix = spec.name.substr(spec.name.find(".position.") + 10);
      const auto it = std::find_if(specs.begin(), specs.end(), [&](const ParamSpec& s) { return s.name == suffix; });
      position_->initialize_custom(static_cast<std::size_t>(it - specs.begin()), out, config_.n_head, d);
    });
  }
  if (params_.tensor.dtype == DType::f64) {
    backend_.copy_from_host(params_.tensor, values.data());
    refresh_compute_weights();
  } else {
    parameters_from_host(std::vector<float>(values.begin(), values.end()));
  }
}

std::vector<float> Model::parameters_to_host() const { return tensor_to_host_f32(backend_, params_.tensor); }

void Model::parameters_from_host(std::span<const float> values) {
  tensor_from_host_f32(backend_, params_.tensor, values);
  refresh_compute_weights();
}

void Model::zero_gradients() { backend_.fill(padded_gradients(), 0.0); }

void Model::set_fp8(int amax_history) {
  if (amax_history < 0) throw std::invalid_argument("set_fp8: the amax history is 0 (off) or positive");
  fp8_ = amax_history > 0 ? std::make_unique<Fp8Linears>(backend_, config_.n_layer, config_.n_embd, amax_history)
                          : nullptr;
  acts_.reset();  // the next reserve() sizes the FP8 buffers too
}

void Model::set_activation_recompute(bool recompute) {
  if (recompute == recompute_) return;
  recompute_ = recompute;
  acts_.reset();  // the next reserve() allocates the other arrangement
}

void Model::reserve(int B, int T) {
  if (acts_ && acts_->B == B && acts_->T == T) return;
  acts_.reset();  // free the old set before allocating the new one
  auto a = std::make_unique<Activations>();
  a->B = B;
  a->T = T;
  const std::int64_t N = std::int64_t(B) * T, C = config_.n_embd, H = config_.n_head;
  const DType act = backend_.dtypes().activation, stat = backend_.dtypes().statistic;
  auto alloc = [&](Shape s, DType t) { return allocate_tensor(backend_, std::move(s), t); };
  a->tokens = alloc({N}, DType::i32);
  a->targets = alloc({N}, DType::i32);
  for (int l = 0; l <= config_.n_layer; ++l) a->residual.push_back(alloc({N, C}, act));
  // Of the norm and GELU outputs: one shared buffer when recomputed, or under FP8, whose backward
  // reads the inputs' FP8 transposes instead.
  const int stored_layers = recompute_ || fp8_ ? 1 : config_.n_layer;
  const std::int64_t attention_encoded =
      recompute_ ? 0 : backend_.attention_encoded_numel({B, T, config_.n_head, config_.head_dim()}, *position_);
  for (int l = 0; l < config_.n_layer; ++l) {
    a->residual_mid.push_back(alloc({N, C}, act));
    if (l < stored_layers) {
      a->norm1.push_back(alloc({N, C}, act));
      a->norm2.push_back(alloc({N, C}, act));
      a->fc_act.push_back(alloc({N, 4 * C}, act));
    }
    a->rstd1.push_back(alloc({N}, stat));
    a->rstd2.push_back(alloc({N}, stat));
    a->qkv.push_back(alloc({N, 3 * C}, act));
    a->attn.push_back(alloc({N, C}, act));
    a->lse.push_back(alloc({B, H, T}, stat));
    if (attention_encoded > 0) a->attention_encoded.push_back(alloc({attention_encoded}, act));
    a->fc_pre.push_back(alloc({N, 4 * C}, act));
  }
  a->final_norm = alloc({N, C}, act);
  a->final_rstd = alloc({N}, stat);
  const Shape logits_shape{std::min<std::int64_t>(N, kClassifierRows), config_.padded_vocab_size};
  a->eval_logits = alloc(logits_shape, forward_only_logits_dtype(act));
  a->train_logits = Tensor{a->eval_logits.tensor.data, act, backend_.device(), logits_shape};
  a->losses = alloc({N}, stat);
  a->d_residual = alloc({N, C}, act);
  a->d_norm = alloc({N, C}, act);
  a->d_attn = alloc({N, C}, act);
  a->d_qkv = alloc({N, 3 * C}, act);
  a->d_fc = alloc({N, 4 * C}, act);
  acts_ = std::move(a);
  if (fp8_) fp8_->reserve(N);
  ++activation_generation_;
}

LossSum Model::forward_backward(const std::int32_t* tokens, const std::int32_t* targets, int B, int T,
                                double grad_scale, float* token_losses) {
  if (targets == nullptr) throw std::invalid_argument("forward_backward needs targets");
  return run(tokens, targets, B, T, true, grad_scale, token_losses);
}

LossSum Model::forward(const std::int32_t* tokens, const std::int32_t* targets, int B, int T, float* token_losses) {
  return run(tokens, targets, B, T, false, 0.0, token_losses);
}

void Model::forward_backward(Tensor tokens, Tensor targets, int B, int T, double grad_scale, Tensor loss_sum) {
  if (B <= 0 || T <= 0) throw std::invalid_argument(fmt::format("batch {} × length {} must be positive", B, T));
  const std::int64_t N = std::int64_t(B) * T;
  if (tokens.numel() != N || targets.numel() != N)
    throw std::invalid_argument(fmt::format("forward_backward: tokens hold {} and targets {} elements, expected "
                                            "B·T = {}",
                                            tokens.numel(), targets.numel(), N));
  reserve(B, T);
  forward_pass(tokens, B, T);
  classifier(targets.reshaped({N}), N, true, grad_scale);  // the classifier takes rows of a flat vector
  backend_.accumulate_sum(loss_sum, acts_->losses.tensor);
  backward_pass(tokens, B, T);
}

LossSum Model::run(const std::int32_t* tokens, const std::int32_t* targets, int B, int T, bool backward,
                   double grad_scale, float* token_losses) {
  if (B <= 0 || T <= 0) throw std::invalid_argument(fmt::format("batch {} × length {} must be positive", B, T));
  const std::int64_t N = std::int64_t(B) * T;
  check_tokens({tokens, std::size_t(N)}, {targets, targets ? std::size_t(N) : 0}, config_.vocab_size);
  reserve(B, T);
  Activations& a = *acts_;
  backend_.copy_from_host(a.tokens.tensor, tokens);
  forward_pass(a.tokens.tensor, B, T);

  LossSum result;
  if (targets == nullptr) return result;
  backend_.copy_from_host(a.targets.tensor, targets);
  classifier(a.targets.tensor, N, backward, grad_scale);

  const std::vector<double> losses = tensor_to_host_f64(backend_, a.losses.tensor);
  for (std::int64_t i = 0; i < N; ++i) {
    if (targets[i] >= 0) {
      result.sum += losses[std::size_t(i)];
      ++result.count;
    }
    if (token_losses) token_losses[i] = targets[i] >= 0 ? float(losses[std::size_t(i)]) : 0.0f;
  }
  if (backward) backward_pass(a.tokens.tensor, B, T);
  return result;
}

std::vector<float> Model::logits_at(const std::int32_t* tokens, int B, int T, std::span<const std::int64_t> rows) {
  if (B <= 0 || T <= 0) throw std::invalid_argument(fmt::format("batch {} × length {} must be positive", B, T));
  const std::int64_t N = std::int64_t(B) * T;
  for (std::int64_t row : rows)
    if (row < 0 || row >= N)
      throw std::invalid_argument(fmt::format("logits_at: row {} outside the B·T = {} positions", row, N));
  check_tokens({tokens, std::size_t(N)}, {}, config_.vocab_size);
  reserve(B, T);
  Activations& a = *acts_;
  backend_.copy_from_host(a.tokens.tensor, tokens);
  forward_pass(a.tokens.tensor, B, T);

  const std::size_t V = std::size_t(config_.vocab_size), padded = std::size_t(config_.padded_vocab_size);
  std::vector<float> out(rows.size() * V);
  for (std::int64_t r0 = 0; r0 < N; r0 += kClassifierRows) {
    const std::int64_t r1 = std::min<std::int64_t>(N, r0 + kClassifierRows);
    if (std::none_of(rows.begin(), rows.end(), [&](std::int64_t row) { return row >= r0 && row < r1; })) continue;
    const Tensor logits = a.eval_logits.tensor.rows(0, r1 - r0);
    backend_.matmul(logits, a.final_norm.tensor.rows(r0, r1), weight(wte_), false, true);
    const std::vector<float> chunk = tensor_to_host_f32(backend_, logits);
    for (std::size_t i = 0; i < rows.size(); ++i) {
      if (rows[i] < r0 || rows[i] >= r1) continue;
      const float* logit_row = chunk.data() + std::size_t(rows[i] - r0) * padded;
      std::copy(logit_row, logit_row + V, out.begin() + std::ptrdiff_t(i * V));
    }
  }
  return out;
}

void Model::layer_forward(int l, const LayerTensors& t, bool recompute, const LayerAttention& attention) {
  Backend& be = backend_;
  const LayerIndex& li = layers_[std::size_t(l)];
  std::vector<Tensor> pparams;  // read from the master weights: the encodings work in fp32
  for (auto idx : li.position) pparams.push_back(layout_.view(params_.tensor, idx));
  if (fp8_ && t.fp8) {
    // The four products in FP8, the residual adds in the products, the GELU in the cast of the MLP
    // output layer's input (t.fc_act is not written).
    be.rmsnorm_forward(t.norm1, t.rstd1, t.residual, weight(li.attn_norm), config_.norm_eps);
    fp8_->forward(l, Fp8Linears::qkv, t.qkv, t.norm1, weight(li.qkv));
    attention(t, pparams);
    fp8_->forward(l, Fp8Linears::attn_proj, t.residual_mid, t.attn, weight(li.attn_proj), Fp8Linears::Prologue::none,
                  t.residual);
    be.rmsnorm_forward(t.norm2, t.rstd2, t.residual_mid, weight(li.mlp_norm), config_.norm_eps);
    fp8_->forward(l, Fp8Linears::mlp_fc, t.fc_pre, t.norm2, weight(li.fc));
    fp8_->forward(l, Fp8Linears::mlp_proj, t.residual_out, t.fc_pre, weight(li.mlp_proj), Fp8Linears::Prologue::gelu,
                  t.residual_mid);
    return;
  }
  be.rmsnorm_matmul(t.qkv, t.norm1, t.rstd1, t.residual, weight(li.attn_norm), config_.norm_eps, weight(li.qkv));
  attention(t, pparams);
  // residual_mid = residual + attn · W_projᵀ, the residual added in the GEMM's epilogue
  be.matmul_epilogue(t.residual_mid, t.attn, weight(li.attn_proj), false, true, Backend::MatmulEpilogue::add,
                     t.residual);
  const Tensor mlp_gain = weight(li.mlp_norm), fc = weight(li.fc);
  if (recompute) {
    // GELU from the stored bf16 pre-activation, exactly as the backward will recompute it
    // (the fused epilogue works from the f32 product, which is not kept).
    be.rmsnorm_matmul(t.fc_pre, t.norm2, t.rstd2, t.residual_mid, mlp_gain, config_.norm_eps, fc);
    be.gelu_forward(t.fc_act, t.fc_pre);
  } else {
    be.rmsnorm_matmul(t.fc_act, t.norm2, t.rstd2, t.residual_mid, mlp_gain, config_.norm_eps, fc,
                      Backend::MatmulEpilogue::gelu, t.fc_pre);
  }
  be.matmul_epilogue(t.residual_out, t.fc_act, weight(li.mlp_proj), false, true, Backend::MatmulEpilogue::add,
                     t.residual_mid);
}

// Embedding, the layers and the final norm, into the activations reserved for B × T.
void Model::forward_pass(Tensor tokens, int B, int T) {
  Activations& a = *acts_;
  Backend& be = backend_;
  const AttentionShape shape{B, T, config_.n_head, config_.head_dim()};
  const PositionContext pctx{T, config_.context_length, config_.n_head, config_.head_dim(), 0};

  be.embedding_forward(a.residual[0].tensor, tokens, weight(wte_));
  for (int l = 0; l < config_.n_layer; ++l) {
    const LayerTensors t{a.residual[l].tensor, a.norm1_of(l),          a.rstd1[l].tensor,    a.qkv[l].tensor,
                         a.attn[l].tensor,     a.residual_mid[l].tensor, a.norm2_of(l),      a.rstd2[l].tensor,
                         a.fc_pre[l].tensor,   a.fc_act_of(l),          a.residual[l + 1].tensor, /*fp8=*/true};
    layer_forward(l, t, recompute_, [&](const LayerTensors& layer, std::span<const Tensor> pparams) {
      be.attention_forward(AttentionForward{shape, position_.get(), pctx, layer.qkv, layer.attn, a.lse[l].tensor,
                                            pparams, a.attention_encoded_of(l), attention_impl_});
    });
  }
  be.rmsnorm_forward(a.final_norm.tensor, a.final_rstd.tensor, a.residual[config_.n_layer].tensor,
                     weight(final_norm_), config_.norm_eps);
}

// Tied LM head, chunked by rows: logits → per-token losses (→ dlogits in place) → dx and dW.
void Model::classifier(Tensor targets, std::int64_t N, bool backward, double grad_scale) {
  Activations& a = *acts_;
  Backend& be = backend_;
  const Tensor wte = weight(wte_);
  const Tensor chunk_logits = backward ? a.train_logits : a.eval_logits.tensor;
  for (std::int64_t r0 = 0; r0 < N; r0 += kClassifierRows) {
    const std::int64_t r1 = std::min<std::int64_t>(N, r0 + kClassifierRows);
    const Tensor x = a.final_norm.tensor.rows(r0, r1);
    const Tensor logits = chunk_logits.rows(0, r1 - r0);
    be.matmul(logits, x, wte, false, true);
    be.cross_entropy(a.losses.tensor.rows(r0, r1), logits, targets.rows(r0, r1), config_.vocab_size, backward,
                     grad_scale);
    if (backward) {
      be.matmul(a.d_norm.tensor.rows(r0, r1), logits, wte, false, false);
      be.matmul(grad(wte_), logits, x, true, false, 1.0, 1.0);
    }
  }
}

void Model::backward_pass(Tensor tokens, int B, int T) {
  Activations& a = *acts_;
  Backend& be = backend_;
  const AttentionShape shape{B, T, config_.n_head, config_.head_dim()};
  const PositionContext pctx{T, config_.context_length, config_.n_head, config_.head_dim(), 0};

  // d_norm holds dL/d(final norm output); d_residual accumulates dL/d(residual stream).
  be.fill(a.d_residual.tensor, 0.0);
  be.rmsnorm_backward(a.d_residual.tensor, grad(final_norm_), a.d_norm.tensor, a.residual[config_.n_layer].tensor,
                      weight(final_norm_), a.final_rstd.tensor);
  gradients_final(layer_begin_.back(), layout_.total_numel());

  for (int l = config_.n_layer - 1; l >= 0; --l) {
    const LayerIndex& li = layers_[std::size_t(l)];
    if (recompute_ && !fp8_) {  // this layer's norm outputs and GELU output, as the forward wrote them
      be.rmsnorm_forward(a.norm1_of(l), a.rstd1[l].tensor, a.residual[l].tensor, weight(li.attn_norm),
                         config_.norm_eps);
      be.rmsnorm_forward(a.norm2_of(l), a.rstd2[l].tensor, a.residual_mid[l].tensor, weight(li.mlp_norm),
                         config_.norm_eps);
      be.gelu_forward(a.fc_act_of(l), a.fc_pre[l].tensor);
    }
    // MLP branch: residual[l+1] = residual_mid + fc_act · W_projᵀ.
    if (fp8_) {
      fp8_->backward(l, Fp8Linears::mlp_proj, a.d_fc.tensor, grad(li.mlp_proj), a.d_residual.tensor);
      fp8_->backward(l, Fp8Linears::mlp_fc, a.d_norm.tensor, grad(li.fc), a.d_fc.tensor,
                     Fp8Linears::Prologue::gelu_backward, a.fc_pre[l].tensor);
    } else {
      be.matmul(grad(li.mlp_proj), a.d_residual.tensor, a.fc_act_of(l), true, false, 1.0, 1.0);
      be.matmul_epilogue(a.d_fc.tensor, a.d_residual.tensor, weight(li.mlp_proj), false, false,
                         Backend::MatmulEpilogue::gelu_backward, a.fc_pre[l].tensor);
      be.matmul(a.d_norm.tensor, a.d_fc.tensor, weight(li.fc), false, false);
      be.matmul(grad(li.fc), a.d_fc.tensor, a.norm2_of(l), true, false, 1.0, 1.0);
    }
    be.rmsnorm_backward(a.d_residual.tensor, grad(li.mlp_norm), a.d_norm.tensor, a.residual_mid[l].tensor,
                        weight(li.mlp_norm), a.rstd2[l].tensor);

    // Attention branch: residual_mid = residual[l] + attn · W_projᵀ.
    if (fp8_) {
      fp8_->backward(l, Fp8Linears::attn_proj, a.d_attn.tensor, grad(li.attn_proj), a.d_residual.tensor);
    } else {
      be.matmul(a.d_attn.tensor, a.d_residual.tensor, weight(li.attn_proj), false, false);
      be.matmul(grad(li.attn_proj), a.d_residual.tensor, a.attn[l].tensor, true, false, 1.0, 1.0);
    }
    std::vector<Tensor> pparams, pgrads;
    for (auto idx : li.position) {
      pparams.push_back(layout_.view(params_.tensor, idx));
      pgrads.push_back(grad(idx));
    }
    AttentionBackward ab{shape, position_.get(), pctx, a.qkv[l].tensor, a.attn[l].tensor, a.lse[l].tensor,
                         a.d_attn.tensor, a.d_qkv.tensor, pparams, pgrads, deterministic_, a.attention_encoded_of(l),
                         attention_impl_};
    be.attention_backward(ab);
    if (fp8_) {
      fp8_->backward(l, Fp8Linears::qkv, a.d_norm.tensor, grad(li.qkv), a.d_qkv.tensor);
    } else {
      be.matmul(a.d_norm.tensor, a.d_qkv.tensor, weight(li.qkv), false, false);
      be.matmul(grad(li.qkv), a.d_qkv.tensor, a.norm1_of(l), true, false, 1.0, 1.0);
    }
    be.rmsnorm_backward(a.d_residual.tensor, grad(li.attn_norm), a.d_norm.tensor, a.residual[l].tensor,
                        weight(li.attn_norm), a.rstd1[l].tensor);
    gradients_final(layer_begin_[std::size_t(l)], layer_begin_[std::size_t(l) + 1]);
  }
  be.embedding_backward(grad(wte_), a.d_residual.tensor, tokens);
  gradients_final(0, layer_begin_.front());
  if (fp8_) fp8_->update_scales();
}

}  // namespace pope
