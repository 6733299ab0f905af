// The optimizer step: learning-rate schedule, global-norm clipping and AdamW (decoupled
// weight decay on 2-D weight matrices only), with fp32 state in the parameter dtype, and the
// projection of bounded parameters (ParamSpec::bounds) back into their bounds after it.
#pragma once

#include <array>
#include <span>
#include <string>
#include <vector>

#include "pope/backend.hpp"
#include "pope/communicator.hpp"
#include "pope/config.hpp"
#include "pope/model.hpp"

namespace pope {

// Linear warmup over warmup_steps (step s < warmup: lr·(s+1)/warmup), then the configured
// decay from lr to min_lr reached at total_steps: cosine, linear, or constant (stays at lr).
// `step` is 0-based (the step about to be taken).
double learning_rate(const OptimConfig& config, long step, long total_steps);

// The log line of a resume under another train.steps than the run's, which moves the decay's
// end and so the learning rate of the steps still to take: the decay's end under each and
// the rate at the next step (`resume_step` + 1), at the old end and at the new one.
// Empty when no rate changes (the same steps, or a constant schedule).
std::string describe_schedule_change(const OptimConfig& config, long resume_step, long old_steps, long new_steps);

struct OptimizerStepResult {
  double grad_norm = 0.0;  // global L2 norm before clipping
  double clip_scale = 1.0;
  bool applied = false;    // false when the norm was not finite (update skipped)
};

class AdamW {
 public:
  // With `shard_over` of several ranks the optimizer is sharded (ZeRO-1): the model's arenas
  // must be padded to a multiple of the ranks (Model's arena_multiple), this rank keeps the
  // moments of its equal shard of the padded arena only and updates that shard of the master
  // weights, from gradients whose shard the caller has summed over the ranks
  // (Communicator::reduce_scatter_sum); the step then gathers every rank's updated shard of
  // the compute copy (see step_on_device). Throws std::invalid_argument for an unpadded arena.
  AdamW(Model& model, const OptimConfig& config, Communicator* shard_over = nullptr);

  // Clips by global norm and applies one AdamW update with learning rate `lr`. `step` is
  // the 1-based update count used for bias correction. A non-finite gradient norm leaves
  // weights and moments untouched.
  // Reads the gradient norm back to the host; the device-side step below does not.
  OptimizerStepResult step(long step, double lr);

  // The per-step values adamw_guarded reads (StepScheduleSlot order) for update `step`
  // (1-based) at learning rate `lr`. Throws std::invalid_argument when step < 1.
  std::array<double, kStepScheduleSize> schedule(long step, double lr) const;
  // Queues the squared gradient norm into stats[kStatsGradSquares] and the guarded AdamW
  // update, which skips itself when that norm or stats[kStatsLossSum] is not finite and
  // records the outcome in stats[kStatsApplied], then clamps the parameters with bounds into
  // them (after a skipped update too, which changes nothing already inside). Reads nothing back.
  // before_gather, if given, is recorded after the update, before ZeRO-1's all-gather (for
  // timing the two; unsharded, nothing follows it).
  void step_on_device(Tensor schedule, Tensor stats, Fence* before_gather = nullptr);
  // Sharded with a separate compute copy, a step leaves the master weights outside this
  // rank's shard stale (the compute copy and the positional masters are current): this
  // gathers them, every rank taking part, before anything reads the whole master arena
  // (checkpoints, the ranks' weight check). Otherwise nothing to do.
  void gather_master_weights();
  // What the host reports of a step from its stats (StepStatsSlot order).
  OptimizerStepResult result_from(std::span<const double, kStepStatsSize> stats) const;

  // Moments of the whole arena as host fp32 (arena order) for checkpoints, the same on
  // every rank: when sharded, the shards are gathered, so every rank must call these
  // together. moments_from_host takes the whole arena's moments and keeps this rank's shard.
  std::vector<float> first_moment_to_host() const;
  std::vector<float> second_moment_to_host() const;
  void moments_from_host(std::span<const float> m, std::span<const float> v);

  bool sharded() const { return shard_over_ != nullptr; }
  // Bytes of AdamW moments this rank holds.
  std::size_t state_bytes() const { return m_.tensor.nbytes() + v_.tensor.nbytes(); }

 private:
  std::vector<float> moment_to_host(const Tensor& moment) const;
  Tensor shard_of(const Tensor& padded_arena) const;
  bool separate_compute() const;  // the model's compute copy is not its master arena

  Model& model_;
  OptimConfig config_;
  Communicator* shard_over_ = nullptr;  // null: not sharded
  std::int64_t shard_begin_ = 0, shard_end_ = 0;  // this rank's elements of the padded arena
  OwnedTensor m_, v_;
  OwnedTensor schedule_, stats_;  // for step(), which runs the device-side step eagerly
  // This rank's shard in update order: elements [begin, end) of the shard, their segments
  // (relative to begin) and, sharded, the chunk's gather: every rank's [begin, end) of its own
  // shard of the weights the forward reads (the compute copy, or the masters where there is
  // none), each from its owner. One chunk without sharding.
  struct UpdateChunk {
    std::int64_t begin = 0, end = 0;
    std::vector<ParamSegment> segments;
    std::vector<BroadcastPiece> gather;
  };
  static constexpr int kGatherChunks = 4;
  std::vector<UpdateChunk> chunks_;
  std::vector<BroadcastPiece> master_pieces_;  // master_read_ranges() cut by shards, with owners
};

}  // namespace pope
