// The gradient reduction overlapped with the backward pass: the model reports every
// gradient range once, final, in backward order, and TrainStep turns the last micro-batch's
// reports into bucketed all-reduces, or with ZeRO-1 into reductions to each shard's owner (a
// recording communicator shows the calls); thread ranks reach bitwise the weights of the
// single all-reduce (or reduce-scatter) after the backward.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <thread>
#include <utility>
#include <vector>

#include "model/gradient_buckets.hpp"
#include "pope/rng.hpp"
#include "pope/train_step.hpp"
#include "thread_communicator.hpp"
#include "model_shape.hpp"

using namespace pope;

namespace {

ModelConfig tiny_model() { return pope::testing::model_config({.n_layer = 3}, "pope"); }

using Range = std::pair<std::int64_t, std::int64_t>;

// Rank 0 of a pretend world of two that records its calls as element ranges of `base`'s
// arena (the gradients' or the parameters') and sums nothing.
class RecordingCommunicator final : public Communicator {
 public:
  explicit RecordingCommunicator(Tensor base) : base_(base) {}
  int rank() const override { return 0; }
  int size() const override { return 2; }
  void all_reduce_sum(Tensor data) override { record(data, whole); }
  void all_reduce_sum_async(Tensor data) override { record(data, overlapped); }
  void reduce_sum_async(Tensor data, int root) override {
    record(data, overlapped);
    roots.push_back(root);
  }
  void join() override { ++joins; }
  void reduce_scatter_sum(Tensor data) override { record(data, whole); }
  void all_gather(Tensor data) override { record(data, whole); }
  void broadcast(std::span<const BroadcastPiece> pieces) override {
    for (const BroadcastPiece& piece : pieces) record(piece.data, whole);
  }
  void broadcast_async(std::span<const BroadcastPiece> pieces) override {
    for (const BroadcastPiece& piece : pieces) {
      if (record(piece.data, overlapped)) broadcast_roots.push_back(piece.root);
    }
  }
  void wait(Fence& fence) override { fence.wait(); }
  void barrier() override {}
  void abort() noexcept override {}

  std::vector<Range> overlapped, whole;  // ranges of the gradient arena
  std::vector<int> roots;                 // of the reduce_sum_async calls, in order
  std::vector<int> broadcast_roots;       // of the broadcast_async pieces recorded, in order
  int joins = 0;

 private:
  bool record(const Tensor& data, std::vector<Range>& into) {
    const std::ptrdiff_t bytes = static_cast<const char*>(data.data) - static_cast<const char*>(base_.data);
    const auto size = std::ptrdiff_t(dtype_size(base_.dtype));
    if (bytes < 0 || bytes >= std::ptrdiff_t(base_.nbytes())) return false;  // the loss sum, the stop votes
    into.emplace_back(bytes / size, bytes / size + data.numel());
    return true;
  }
  Tensor base_;
};

std::vector<std::int32_t> random_tokens(std::size_t count, std::uint64_t seed) {
  Rng rng(seed);
  std::vector<std::int32_t> tokens(count);
  for (auto& t : tokens) t = std::int32_t(rng.below(64));
  return tokens;
}

// The ranges follow each other from the arena's end down to 0, each used once.
void expect_backward_cover(const std::vector<Range>& ranges, std::int64_t numel) {
  ASSERT_FALSE(ranges.empty());
  EXPECT_EQ(ranges.front().second, numel);
  for (std::size_t i = 1; i < ranges.size(); ++i) EXPECT_EQ(ranges[i].second, ranges[i - 1].first) << "range " << i;
  EXPECT_EQ(ranges.back().first, 0);
}

}  // namespace

// Every parameter is in exactly one reported range, the ranges come in backward order (final
// norm, last layer … first layer, embedding), and the gradients of a range do not change
// after it was reported (the CPU backend has finished the work when the callback runs).
TEST(GradientOverlap, TheBackwardReportsEveryParameterOnceFinalInBackwardOrder) {
  auto backend = make_backend(DeviceChoice::cpu, "double", 1);
  const ModelConfig config = tiny_model();
  Model model(config, *backend);
  model.initialize(3);
  const std::int64_t numel = model.gradients().numel();
  std::vector<Range> ranges;
  std::vector<std::vector<double>> at_report;
  model.set_gradients_ready([&](std::int64_t begin, std::int64_t end) {
    ranges.emplace_back(begin, end);
    const double* g = model.gradients().as<double>();
    at_report.emplace_back(g + begin, g + end);
  });
  const int B = 2, T = 8;
  const auto tokens = random_tokens(B * T, 1), targets = random_tokens(B * T, 2);
  model.zero_gradients();
  model.forward_backward(tokens.data(), targets.data(), B, T, 1.0 / (B * T));

  ASSERT_EQ(ranges.size(), std::size_t(config.n_layer + 2));
  expect_backward_cover(ranges, numel);
  const ParameterLayout& layout = model.layout();
  const auto range_of = [&](const std::string& name) {
    const std::int64_t offset = layout.offset(layout.index_of(name));
    for (std::size_t i = 0; i < ranges.size(); ++i)
      if (offset >= ranges[i].first && offset < ranges[i].second) return i;
    return ranges.size();
  };
  EXPECT_EQ(range_of("final_norm.weight"), 0u);
  for (int l = 0; l < config.n_layer; ++l)
    for (const char* part : {"attn_norm", "attn.qkv", "attn.proj", "mlp_norm", "mlp.fc", "mlp.proj"})
      EXPECT_EQ(range_of(fmt::format("layers.{}.{}.weight", l, part)), std::size_t(config.n_layer - l)) << part;
  EXPECT_EQ(range_of("wte.weight"), ranges.size() - 1);

  const double* final_grads = model.gradients().as<double>();
  for (std::size_t i = 0; i < ranges.size(); ++i) {
    const auto [begin, end] = ranges[i];
    EXPECT_EQ(0, std::memcmp(at_report[i].data(), final_grads + begin, std::size_t(end - begin) * sizeof(double)))
        << "gradients [" << begin << ", " << end << ") changed after they were reported final";
  }
}

TEST(GradientOverlap, OnlyTheLastMicroBatchStartsReductionsInBucketsOfTheConfiguredSize) {
  auto backend = make_backend(DeviceChoice::cpu, "float", 1);
  const ModelConfig config = tiny_model();
  Model model(config, *backend);
  model.initialize(3);
  AdamW adamw(model, OptimConfig{});
  const std::int64_t numel = model.gradients().numel();
  const int B = 2, T = 8, micro_batches = 3;
  const auto tokens = random_tokens(std::size_t(micro_batches) * B * T, 1);
  const auto targets = random_tokens(tokens.size(), 2);
  const TrainStepShape shape{micro_batches, B, T, 1.0 / (micro_batches * B * T)};

  {  // one byte: every reported range is its own bucket
    RecordingCommunicator communicator(model.gradients());
    TrainStep step(model, adamw, shape, true, &communicator, 1);
    step.enqueue(tokens, targets, 1, 1e-3);
    step.result(1);
    EXPECT_EQ(communicator.overlapped.size(), std::size_t(config.n_layer + 2)) << "the last micro-batch's ranges only";
    expect_backward_cover(communicator.overlapped, numel);
    EXPECT_EQ(communicator.joins, 1);
    EXPECT_TRUE(communicator.whole.empty()) << "no second reduction of the gradients";
  }
  {  // a bucket of three layers' size: neighbours merged until a bucket holds at least that much
    const std::int64_t layer = model.layout().offset(model.layout().index_of("layers.1.attn_norm.weight")) -
                               model.layout().offset(model.layout().index_of("layers.0.attn_norm.weight"));
    RecordingCommunicator communicator(model.gradients());
    TrainStep step(model, adamw, shape, true, &communicator, 3 * layer * std::int64_t(sizeof(float)));
    step.enqueue(tokens, targets, 1, 1e-3);
    step.result(1);
    // final norm + layers 2, 1, 0 reach three layers; the embedding is the last bucket.
    ASSERT_EQ(communicator.overlapped.size(), 2u);
    expect_backward_cover(communicator.overlapped, numel);
    EXPECT_EQ(communicator.overlapped[0].first, model.layout().offset(model.layout().index_of("layers.0.attn_norm.weight")));
  }
  {  // 0: one all-reduce of the whole arena after the backward
    RecordingCommunicator communicator(model.gradients());
    TrainStep step(model, adamw, shape, true, &communicator, 0);
    step.enqueue(tokens, targets, 1, 1e-3);
    step.result(1);
    EXPECT_TRUE(communicator.overlapped.empty());
    EXPECT_EQ(communicator.whole, (std::vector<Range>{{0, numel}}));
  }
}

// ZeRO-1 over a pretend world of two: each bucket's sums go to the rank owning its elements,
// a bucket across the shard edge is split there, and no reduce-scatter follows.
TEST(GradientOverlap, WithZeroOneEachBucketIsReducedToTheOwnersOfItsShards) {
  auto backend = make_backend(DeviceChoice::cpu, "float", 1);
  const ModelConfig config = tiny_model();
  Model model(config, *backend, 2);
  model.initialize(3);
  const std::int64_t numel = model.gradients().numel();
  const std::int64_t shard = model.padded_gradients().numel() / 2;
  const int B = 2, T = 8;
  const auto tokens = random_tokens(std::size_t(B) * T, 1), targets = random_tokens(tokens.size(), 2);
  RecordingCommunicator communicator(model.gradients());
  AdamW adamw(model, OptimConfig{}, &communicator);
  ASSERT_TRUE(adamw.sharded());
  TrainStep step(model, adamw, TrainStepShape{1, B, T, 1.0 / (B * T)}, true, &communicator, 1);
  step.enqueue(tokens, targets, 1, 1e-3);
  step.result(1);

  expect_backward_cover(communicator.overlapped, numel);
  ASSERT_EQ(communicator.roots.size(), communicator.overlapped.size());
  bool split_at_edge = false;
  for (std::size_t i = 0; i < communicator.overlapped.size(); ++i) {
    const auto [begin, end] = communicator.overlapped[i];
    EXPECT_EQ(communicator.roots[i], int(begin / shard)) << "range [" << begin << ", " << end << ")";
    EXPECT_EQ(begin / shard, (end - 1) / shard) << "range [" << begin << ", " << end << ") crosses the shard edge";
    split_at_edge = split_at_edge || begin == shard;
  }
  EXPECT_TRUE(split_at_edge) << "the shard edge lies inside a layer, so one range must start there";
  EXPECT_EQ(communicator.joins, 2) << "one after the buckets, one after the optimizer's gather";
  EXPECT_TRUE(communicator.whole.empty()) << "no reduce-scatter after the buckets";
}

// The updated weights come back in chunks, each broadcast by the shard's owner as soon as it is
// updated: per chunk one piece per rank, at the same place in each shard, together covering the
// padded arena once (without a separate compute copy, as here, the masters themselves).
TEST(GradientOverlap, WithZeroOneTheUpdatedShardsAreBroadcastChunkByChunkByTheirOwners) {
  auto backend = make_backend(DeviceChoice::cpu, "float", 1);
  Model model(tiny_model(), *backend, 2);
  model.initialize(3);
  const std::int64_t padded = model.padded_parameters().numel(), shard = padded / 2;
  const int B = 2, T = 8;
  const auto tokens = random_tokens(std::size_t(B) * T, 1), targets = random_tokens(tokens.size(), 2);
  RecordingCommunicator communicator(model.padded_parameters());
  AdamW adamw(model, OptimConfig{}, &communicator);
  TrainStep step(model, adamw, TrainStepShape{1, B, T, 1.0 / (B * T)}, false, &communicator, 1);
  step.enqueue(tokens, targets, 1, 1e-3);
  step.result(1);

  const std::vector<Range>& pieces = communicator.overlapped;
  ASSERT_EQ(pieces.size(), 8u) << "four chunks, one piece per rank each";
  ASSERT_EQ(communicator.broadcast_roots.size(), pieces.size());
  std::vector<Range> sorted = pieces;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted.front().first, 0);
  EXPECT_EQ(sorted.back().second, padded);
  for (std::size_t i = 1; i < sorted.size(); ++i) EXPECT_EQ(sorted[i].first, sorted[i - 1].second) << "piece " << i;
  for (std::size_t i = 0; i < pieces.size(); i += 2) {
    EXPECT_EQ(communicator.broadcast_roots[i], 0);
    EXPECT_EQ(communicator.broadcast_roots[i + 1], 1);
    EXPECT_EQ(pieces[i + 1].first, pieces[i].first + shard) << "chunk " << i / 2 << ": the same place in each shard";
    EXPECT_EQ(pieces[i + 1].second, pieces[i].second + shard);
    EXPECT_LE(pieces[i].second, shard);
    EXPECT_EQ(pieces[i].first % 256, 0);
  }
}

TEST(GradientOverlap, BucketsRefuseRangesOutOfBackwardOrderAndAnIncompleteCover) {
  pope::testing::ThreadCommunicator communicator(std::make_shared<pope::testing::ThreadWorld>(1), 0);
  std::vector<float> grads(100);
  const Tensor arena{grads.data(), DType::f32, DeviceKind::cpu, {100}};
  GradientBuckets buckets(communicator, arena, 16);
  buckets.ready(80, 100);
  EXPECT_THROW(buckets.ready(10, 50), std::logic_error);  // a gap: [50, 80) was skipped
  buckets.ready(40, 80);
  EXPECT_THROW(buckets.flush(), std::logic_error);  // [0, 40) never reported
  buckets.ready(60, 100);  // flush reset it for the next backward pass
  buckets.ready(0, 60);
  EXPECT_NO_THROW(buckets.flush());
  EXPECT_THROW(GradientBuckets(communicator, arena, 0), std::invalid_argument);
  EXPECT_THROW(GradientBuckets(communicator, arena, 16, 99), std::invalid_argument);  // one shard of 99 < 100
}

// Thread ranks, each its own tokens: buckets of a few hundred bytes and the single
// reduction after the backward sum the same values in the same (rank) order, so the weights
// agree bit for bit after several steps — all-reduce over two ranks, and with ZeRO-1 the
// reductions to each shard's owner against the reduce-scatter, over two and three ranks.
std::vector<float> train_ranks(int ranks, bool zero, std::int64_t bucket_bytes) {
  const ModelConfig config = tiny_model();
  auto world = std::make_shared<pope::testing::ThreadWorld>(ranks);
  std::vector<std::vector<float>> weights{std::size_t(ranks)};
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      pope::testing::ThreadCommunicator communicator(world, r);
      auto backend = make_backend(DeviceChoice::cpu, "float", 1);
      Model model(config, *backend, zero ? ranks : 1);
      model.initialize(5);
      OptimConfig optim;
      optim.weight_decay = 0.1;
      AdamW adamw(model, optim, zero ? &communicator : nullptr);
      const int B = 2, T = 8;
      TrainStep step(model, adamw, TrainStepShape{2, B, T, 1.0 / (2 * ranks * B * T)}, true, &communicator,
                     bucket_bytes);
      for (long s = 1; s <= 4; ++s) {
        step.enqueue(random_tokens(2 * B * T, std::uint64_t(10 * s + r)),
                     random_tokens(2 * B * T, std::uint64_t(100 * s + r)), s, 1e-2);
        step.result(s);
      }
      weights[std::size_t(r)] = model.parameters_to_host();
    });
  for (auto& thread : threads) thread.join();
  for (int r = 1; r < ranks; ++r) EXPECT_EQ(weights[std::size_t(r)], weights[0]) << "rank " << r;
  return weights[0];
}

TEST(GradientOverlap, OverlappedBucketsGiveTheSingleAllReducesWeightsBitwise) {
  const auto single = train_ranks(2, false, 0);
  EXPECT_EQ(train_ranks(2, false, 256), single);
  EXPECT_EQ(train_ranks(2, false, std::int64_t(1) << 30), single);
}

TEST(GradientOverlap, ZeroOneBucketsGiveTheReduceScattersWeightsBitwise) {
  for (int ranks : {2, 3}) {
    const auto scattered = train_ranks(ranks, true, 0);
    EXPECT_EQ(train_ranks(ranks, true, 256), scattered) << ranks << " ranks";
    EXPECT_EQ(train_ranks(ranks, true, std::int64_t(1) << 30), scattered) << ranks << " ranks";
  }
}
