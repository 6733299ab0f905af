// Incremental decoding (Model::make_kv_cache, Model::decode): the layers of the full forward over
// the new rows only, their attention reading the keys and values of the earlier rows from the
// cache (Backend::attention_decode).
#include <fmt/format.h>

#include <stdexcept>

#include "model/forward_logits.hpp"
#include "model/layer_tensors.hpp"
#include "pope/model.hpp"

namespace pope {

// A decode call's activations for up to `rows` = batch × new rows: one set shared by every layer
// (nothing is kept for a backward), the residual stream in two buffers (a layer writes its output
// over its input).
struct KvCache::Buffers {
  std::int64_t rows = 0;
  OwnedTensor tokens, residual, residual_mid, norm1, norm2, rstd1, rstd2, qkv, attn, fc_pre, fc_act, final_norm,
      final_rstd, logits;
};

KvCache::KvCache(int batch, int capacity) : batch_(batch), capacity_(capacity) {}
KvCache::~KvCache() = default;

std::unique_ptr<KvCache> Model::make_kv_cache(int batch, int capacity) {
  if (batch <= 0 || capacity <= 0)
    throw std::invalid_argument(fmt::format("a key/value cache of {} sequences × {} positions: both must be positive",
                                            batch, capacity));
  if (!position_->extrapolates() && capacity > config_.context_length)
    throw std::invalid_argument(fmt::format(
        "model.position.kind {} is defined up to the training length {} (model.context_length), and {} positions "
        "were asked for; shorten the prompt or the new tokens, or evaluate with a RoPE scaling",
        position_->kind(), config_.context_length, capacity));
  std::unique_ptr<KvCache> cache(new KvCache(batch, capacity));
  const int H = config_.n_head, d = config_.head_dim();
  const int W = position_->transforms_qk() ? position_->qk_width(d) : d;
  const DType act = backend_.dtypes().activation;
  const bool raw = position_->transforms_qk() && position_->transform_varies_with_length();
  for (int l = 0; l < config_.n_layer; ++l) {
    cache->keys_.push_back(allocate_tensor(backend_, {batch, H, capacity, W}, act));
    cache->values_.push_back(allocate_tensor(backend_, {batch, H, capacity, d}, act));
    if (raw) cache->raw_keys_.push_back(allocate_tensor(backend_, {batch, H, capacity, d}, act));
  }
  return cache;
}

std::vector<float> Model::decode(KvCache& cache, std::span<const std::int32_t> tokens, int n, bool all_rows) {
  const int B = cache.batch();
  if (n <= 0 || tokens.size() != std::size_t(B) * std::size_t(n))
    throw std::invalid_argument(fmt::format("decode: {} tokens for {} sequences × {} new rows (expected {} > 0)",
                                            tokens.size(), B, n, std::int64_t(B) * n));
  if (cache.length() + n > cache.capacity())
    throw std::invalid_argument(fmt::format("decode: {} cached + {} new positions exceed the cache's {}",
                                            cache.length(), n, cache.capacity()));
  if (cache.keys_.size() != std::size_t(config_.n_layer))
    throw std::invalid_argument("decode: the cache was made for another model");
  check_tokens(tokens, {}, config_.vocab_size);

  const std::int64_t N = std::int64_t(B) * n, C = config_.n_embd;
  if (!cache.buffers_ || cache.buffers_->rows < N) {
    cache.buffers_.reset();
    auto b = std::make_unique<KvCache::Buffers>();
    const DType act = backend_.dtypes().activation, stat = backend_.dtypes().statistic;
    auto alloc = [&](Shape s, DType t) { return allocate_tensor(backend_, std::move(s), t); };
    b->rows = N;
    b->tokens = alloc({N}, DType::i32);
    for (OwnedTensor* t : {&b->residual, &b->residual_mid, &b->norm1, &b->norm2, &b->attn, &b->final_norm})
      *t = alloc({N, C}, act);
    for (OwnedTensor* t : {&b->rstd1, &b->rstd2, &b->final_rstd}) *t = alloc({N}, stat);
    b->qkv = alloc({N, 3 * C}, act);
    b->fc_pre = alloc({N, 4 * C}, act);
    b->fc_act = alloc({N, 4 * C}, act);
    b->logits = alloc({all_rows ? N : B, config_.padded_vocab_size}, forward_only_logits_dtype(act));
    cache.buffers_ = std::move(b);
  }
  KvCache::Buffers& b = *cache.buffers_;
  auto rows = [&](const OwnedTensor& t) { return t.tensor.rows(0, N); };
  Backend& be = backend_;
  const AttentionShape shape{B, n, config_.n_head, config_.head_dim()};
  const PositionContext pctx{n, config_.context_length, config_.n_head, config_.head_dim(), cache.length()};

  be.copy_from_host(rows(b.tokens), tokens.data());
  be.embedding_forward(rows(b.residual), rows(b.tokens), weight(wte_));
  for (int l = 0; l < config_.n_layer; ++l) {
    const LayerTensors t{rows(b.residual), rows(b.norm1),  rows(b.rstd1),  rows(b.qkv),
                         rows(b.attn),     rows(b.residual_mid), rows(b.norm2), rows(b.rstd2),
                         rows(b.fc_pre),   rows(b.fc_act), rows(b.residual)};
    const KvCacheLayer layer{cache.keys_[std::size_t(l)].tensor, cache.values_[std::size_t(l)].tensor,
                             cache.raw_keys_.empty() ? Tensor{} : cache.raw_keys_[std::size_t(l)].tensor};
    layer_forward(l, t, /*recompute=*/false, [&](const LayerTensors& layer_tensors, std::span<const Tensor> pparams) {
      be.attention_decode(
          AttentionDecode{shape, position_.get(), pctx, layer_tensors.qkv, layer_tensors.attn, pparams, layer});
    });
  }
  be.rmsnorm_forward(rows(b.final_norm), rows(b.final_rstd), rows(b.residual), weight(final_norm_), config_.norm_eps);
  cache.length_ += n;

  // Logits of every new row, or of each sequence's last one (row b·n + n − 1).
  const std::int64_t out_rows = all_rows ? N : B;
  if (b.logits.tensor.shape[0] < out_rows) b.logits = allocate_tensor(be, {out_rows, config_.padded_vocab_size},
                                                                      forward_only_logits_dtype(be.dtypes().activation));
  const Tensor logits = b.logits.tensor.rows(0, out_rows);
  if (all_rows || n == 1) {
    be.matmul(logits, rows(b.final_norm), weight(wte_), false, true);
  } else {
    for (int s = 0; s < B; ++s) {
      const std::int64_t last = std::int64_t(s) * n + n - 1;
      be.matmul(logits.rows(s, s + 1), b.final_norm.tensor.rows(last, last + 1), weight(wte_), false, true);
    }
  }
  const std::vector<float> padded = tensor_to_host_f32(be, logits);
  const std::size_t V = std::size_t(config_.vocab_size), Vp = std::size_t(config_.padded_vocab_size);
  std::vector<float> out(std::size_t(out_rows) * V);
  for (std::int64_t r = 0; r < out_rows; ++r)
    std::copy_n(padded.begin() + std::ptrdiff_t(std::size_t(r) * Vp), V, out.begin() + std::ptrdiff_t(std::size_t(r) * V));
  return out;
}

}  // namespace pope
