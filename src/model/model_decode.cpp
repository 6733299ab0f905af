// Incremental decoding (Model::make_kv_cache, Model::decode, Model::queue_greedy): the layers of
// the full forward over the new rows only, their attention reading the keys and values of the
// earlier rows from the cache (Backend::attention_decode).
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "model/forward_logits.hpp"
#include "model/layer_tensors.hpp"
#include "pope/model.hpp"

namespace pope {

// A greedy call's host slot, and the fence of the copy into it.
struct KvCache::GreedySlot {
  Buffer host;  // page-locked copy of Buffers::feed's head: log-probabilities, next cached length, ids
  std::unique_ptr<Fence> copied;
};

// A decode call's activations for up to `rows` = batch × new rows: one set shared by every layer
// (nothing is kept for a backward), the residual stream in two buffers (a layer writes its output
// over its input), and the recording of a one-token step.
struct KvCache::Buffers {
  std::int64_t rows = 0;
  // i32 words: the last greedy choice's log-probabilities (`choice_words` words of the statistic
  // dtype), then the cached length p0, then the new tokens, so that one copy returns a choice.
  OwnedTensor feed;
  std::int64_t choice_words = 0;
  Tensor log_probs;  // [batch] at the start of feed
  Tensor inputs;     // i32 [1 + rows] after it: p0, then the new tokens
  OwnedTensor residual, residual_mid, norm1, norm2, rstd1, rstd2, qkv, attn, fc_pre, fc_act, final_norm, final_rstd,
      logits;
  Buffer host_logits;  // page-locked copy of `logits`
  std::unique_ptr<Fence> logits_copied;
  std::array<GreedySlot, 2> greedy;  // host slots of the greedy calls queued, used in turn
  long greedy_queued = 0, greedy_read = 0;
  std::unique_ptr<GraphCapture> step;  // a one-token step of every sequence, replayed at each position
  std::uint64_t step_scratch = 0;      // Backend::scratch_generation() it holds
  bool warm = false;                   // an eager one-token step ran with...
  std::uint64_t warm_scratch = 0;      // ...this scratch
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

void Model::reserve_decode(KvCache& cache, std::int64_t rows) {
  if (cache.buffers_ && cache.buffers_->rows >= rows) return;
  cache.buffers_.reset();  // with any recording, which holds the old addresses
  auto b = std::make_unique<KvCache::Buffers>();
  const DType act = backend_.dtypes().activation, stat = backend_.dtypes().statistic;
  const std::int64_t C = config_.n_embd;
  auto alloc = [&](Shape s, DType t) { return allocate_tensor(backend_, std::move(s), t); };
  b->rows = rows;
  const int B = cache.batch();
  b->choice_words = std::int64_t(B) * std::int64_t(dtype_size(stat) / dtype_size(DType::i32));
  b->feed = alloc({b->choice_words + 1 + rows}, DType::i32);
  b->log_probs = b->feed.tensor;
  b->log_probs.dtype = stat;
  b->log_probs.shape = {B};
  b->inputs = b->feed.tensor.rows(b->choice_words, b->choice_words + 1 + rows);
  for (OwnedTensor* t : {&b->residual, &b->residual_mid, &b->norm1, &b->norm2, &b->attn, &b->final_norm})
    *t = alloc({rows, C}, act);
  for (OwnedTensor* t : {&b->rstd1, &b->rstd2, &b->final_rstd}) *t = alloc({rows}, stat);
  b->qkv = alloc({rows, 3 * C}, act);
  b->fc_pre = alloc({rows, 4 * C}, act);
  b->fc_act = alloc({rows, 4 * C}, act);
  b->logits_copied = backend_.make_fence();
  cache.buffers_ = std::move(b);
}

// Logits for `rows` rows: a sequence's last row each, or every new row (all_rows), not the
// prompt's B·P rows × vocabulary that a prefill would otherwise hold.
void Model::reserve_decode_logits(KvCache& cache, std::int64_t rows) {
  KvCache::Buffers& b = *cache.buffers_;
  if (!b.logits.tensor.empty() && b.logits.tensor.shape[0] >= rows) return;
  b.step.reset();  // it holds the old address
  b.warm = false;
  b.logits = allocate_tensor(backend_, {rows, config_.padded_vocab_size},
                             forward_only_logits_dtype(backend_.dtypes().activation));
  b.host_logits = backend_.allocate_host(std::size_t(b.logits.tensor.nbytes()));
}

// Queues a decode call of n new rows per sequence at the cache's current length: the layers over
// the new rows, then the logits of `out_rows` rows (every new row, or each sequence's last).
void Model::queue_decode(KvCache& cache, int n, bool all_rows) {
  KvCache::Buffers& b = *cache.buffers_;
  const int B = cache.batch();
  const std::int64_t N = std::int64_t(B) * n;
  auto rows = [&](const OwnedTensor& t) { return t.tensor.rows(0, N); };
  Backend& be = backend_;
  const AttentionShape shape{B, n, config_.n_head, config_.head_dim()};
  const PositionContext pctx{n, config_.context_length, config_.n_head, config_.head_dim(), cache.length()};
  const Tensor past = b.inputs.rows(0, 1), tokens = b.inputs.rows(1, 1 + N);

  be.embedding_forward(rows(b.residual), tokens, weight(wte_));
  for (int l = 0; l < config_.n_layer; ++l) {
    const LayerTensors t{rows(b.residual), rows(b.norm1),  rows(b.rstd1),  rows(b.qkv),
                         rows(b.attn),     rows(b.residual_mid), rows(b.norm2), rows(b.rstd2),
                         rows(b.fc_pre),   rows(b.fc_act), rows(b.residual)};
    const KvCacheLayer layer{cache.keys_[std::size_t(l)].tensor, cache.values_[std::size_t(l)].tensor,
                             cache.raw_keys_.empty() ? Tensor{} : cache.raw_keys_[std::size_t(l)].tensor};
    layer_forward(l, t, /*recompute=*/false, [&](const LayerTensors& layer_tensors, std::span<const Tensor> pparams) {
      be.attention_decode(AttentionDecode{shape, position_.get(), pctx, past, layer_tensors.qkv, layer_tensors.attn,
                                          pparams, layer});
    });
  }
  be.rmsnorm_forward(rows(b.final_norm), rows(b.final_rstd), rows(b.residual), weight(final_norm_), config_.norm_eps);
  if (all_rows || n == 1) {
    // Not rmsnorm_matmul: its fused norm is formed again by every block, and the LM head's
    // 50,304 columns make several waves of blocks.
    be.matmul(b.logits.tensor.rows(0, N), rows(b.final_norm), weight(wte_), false, true);
  } else {
    for (int s = 0; s < B; ++s) {
      const std::int64_t last = std::int64_t(s) * n + n - 1;
      be.matmul(b.logits.tensor.rows(s, s + 1), b.final_norm.tensor.rows(last, last + 1), weight(wte_), false, true);
    }
  }
}

void Model::check_decode(const KvCache& cache, std::size_t tokens, int n) const {
  const int B = cache.batch();
  if (n <= 0 || tokens != std::size_t(B) * std::size_t(n))
    throw std::invalid_argument(fmt::format("decode: {} tokens for {} sequences × {} new rows (expected {} > 0)",
                                            tokens, B, n, std::int64_t(B) * n));
  if (cache.length() + n > cache.capacity())
    throw std::invalid_argument(fmt::format("decode: {} cached + {} new positions exceed the cache's {}",
                                            cache.length(), n, cache.capacity()));
  if (cache.keys_.size() != std::size_t(config_.n_layer))
    throw std::invalid_argument("decode: the cache was made for another model");
  if (cache.buffers_ && cache.buffers_->greedy_queued != cache.buffers_->greedy_read)
    throw std::invalid_argument("decode: greedy choices are queued unread; read them first (Model::read_greedy)");
}

// b.inputs = the cached length, then `tokens`.
void Model::upload_decode_inputs(KvCache& cache, std::span<const std::int32_t> tokens) {
  std::vector<std::int32_t> inputs(1 + tokens.size());
  inputs[0] = cache.length();
  std::copy(tokens.begin(), tokens.end(), inputs.begin() + 1);
  backend_.copy_from_host(cache.buffers_->inputs.rows(0, std::int64_t(inputs.size())), inputs.data());
}

// Queues the decode call of n rows per sequence whose inputs (the cached length, then the
// tokens) are in b.inputs: a one-token step runs eagerly once (it reserves the scratch it
// needs), is then recorded and replayed at every later position while the backend's scratch
// stays as recorded. A cache that encodes its keys again at every length (raw keys: dynamic
// NTK) queues every step eagerly: its frequencies change with the length, which a replay cannot.
void Model::run_decode(KvCache& cache, int n, bool all_rows) {
  KvCache::Buffers& b = *cache.buffers_;
  Backend& be = backend_;
  const bool step =
      n == 1 && !all_rows && cache.record_steps_ && cache.raw_keys_.empty() && be.supports_graphs();
  const std::uint64_t scratch = be.scratch_generation();
  if (step && b.step && b.step_scratch == scratch) {
    b.step->replay();
  } else if (step && b.warm && b.warm_scratch == scratch) {
    b.step = be.make_graph_capture();
    b.step->begin();
    queue_decode(cache, n, all_rows);  // on an exception, the capture's destructor ends the recording
    b.step->end();
    b.step_scratch = be.scratch_generation();
    b.step->replay();
  } else {
    b.step.reset();
    queue_decode(cache, n, all_rows);
    b.warm = step;
    b.warm_scratch = be.scratch_generation();
  }
  cache.length_ += n;
}

std::vector<float> Model::decode(KvCache& cache, std::span<const std::int32_t> tokens, int n, bool all_rows) {
  check_decode(cache, tokens.size(), n);
  check_tokens(tokens, {}, config_.vocab_size);
  const int B = cache.batch();
  const std::int64_t N = std::int64_t(B) * n;
  const std::int64_t out_rows = all_rows ? N : B;
  reserve_decode(cache, N);
  reserve_decode_logits(cache, out_rows);
  KvCache::Buffers& b = *cache.buffers_;
  Backend& be = backend_;
  upload_decode_inputs(cache, tokens);
  run_decode(cache, n, all_rows);
  cache.greedy_fed_ = false;

  // Logits of every new row, or of each sequence's last one (row b·n + n − 1).
  const Tensor logits = b.logits.tensor.rows(0, out_rows);
  const std::size_t V = std::size_t(config_.vocab_size), Vp = std::size_t(config_.padded_vocab_size);
  std::vector<float> out(std::size_t(out_rows) * V);
  auto trim = [&](const float* padded) {
    for (std::int64_t r = 0; r < out_rows; ++r)
      std::copy_n(padded + std::size_t(r) * Vp, V, out.begin() + std::ptrdiff_t(std::size_t(r) * V));
  };
  if (logits.dtype == DType::f32) {
    be.copy_to_host_async(b.host_logits.get(), logits);
    b.logits_copied->record();
    b.logits_copied->wait();
    trim(static_cast<const float*>(b.host_logits.get()));
  } else {
    trim(tensor_to_host_f32(be, logits).data());
  }
  return out;
}

// Chooses each sequence's next token from the call's logits into b.inputs (the next step's
// tokens) and queues their copy to the next host slot.
void Model::queue_choice(KvCache& cache, int n) {
  KvCache::Buffers& b = *cache.buffers_;
  Backend& be = backend_;
  const int B = cache.batch();
  be.greedy_tokens(b.inputs.rows(1, 1 + B), b.log_probs, b.logits.tensor.rows(0, B), config_.vocab_size,
                   b.inputs.rows(0, 1), n);
  KvCache::GreedySlot& slot = b.greedy[std::size_t(b.greedy_queued % 2)];
  be.copy_to_host_async(slot.host.get(), b.feed.tensor.rows(0, b.choice_words + 1 + B));
  slot.copied->record();
  ++b.greedy_queued;
  cache.greedy_fed_ = true;
}

void Model::queue_greedy(KvCache& cache, std::span<const std::int32_t> tokens, int n) {
  check_decode(cache, tokens.size(), n);
  check_tokens(tokens, {}, config_.vocab_size);
  const int B = cache.batch();
  const std::int64_t N = std::int64_t(B) * n;
  reserve_decode(cache, N);
  reserve_decode_logits(cache, B);
  KvCache::Buffers& b = *cache.buffers_;
  if (!b.greedy[0].host)
    for (KvCache::GreedySlot& slot : b.greedy) {
      slot.host = backend_.allocate_host(sizeof(std::int32_t) * std::size_t(b.choice_words + 1 + B));
      slot.copied = backend_.make_fence();
    }
  upload_decode_inputs(cache, tokens);
  run_decode(cache, n, false);
  queue_choice(cache, n);
}

void Model::queue_greedy(KvCache& cache) {
  if (!cache.greedy_fed_)
    throw std::invalid_argument("queue_greedy: no greedy call chose this cache's next tokens; start with the prompt");
  KvCache::Buffers& b = *cache.buffers_;
  if (b.greedy_queued - b.greedy_read >= 2)
    throw std::invalid_argument("queue_greedy: two greedy calls are queued unread; read one first");
  if (cache.length() + 1 > cache.capacity())
    throw std::invalid_argument(fmt::format("decode: {} cached + 1 new position exceed the cache's {}",
                                            cache.length(), cache.capacity()));
  run_decode(cache, 1, false);  // its cached length and tokens are where the last choice left them
  queue_choice(cache, 1);
}

Model::GreedyChoice Model::read_greedy(KvCache& cache) {
  if (!cache.buffers_ || cache.buffers_->greedy_read == cache.buffers_->greedy_queued)
    throw std::invalid_argument("read_greedy: no greedy call is queued");
  KvCache::Buffers& b = *cache.buffers_;
  KvCache::GreedySlot& slot = b.greedy[std::size_t(b.greedy_read % 2)];
  slot.copied->wait();
  ++b.greedy_read;
  const std::size_t B = std::size_t(cache.batch());
  const auto* host = static_cast<const std::byte*>(slot.host.get());
  GreedyChoice choice;
  choice.ids.resize(B);
  std::memcpy(choice.ids.data(), host + sizeof(std::int32_t) * std::size_t(b.choice_words + 1), B * sizeof(std::int32_t));
  choice.log_probs.resize(B);
  for (std::size_t s = 0; s < B; ++s) {
    if (b.log_probs.dtype == DType::f64) {
      std::memcpy(&choice.log_probs[s], host + s * sizeof(double), sizeof(double));
    } else {
      float value;
      std::memcpy(&value, host + s * sizeof(float), sizeof(float));
      choice.log_probs[s] = value;
    }
    if (!std::isfinite(choice.log_probs[s]))
      throw std::runtime_error(fmt::format("greedy decoding: sequence {} has a non-finite logit", s));
  }
  return choice;
}

}  // namespace pope
