// One optimizer step as backend work only: zero the gradients, forward and backward over
// every micro-batch (the loss summed on the device), on several data-parallel ranks the sum
// of the gradients and losses over the ranks, the global gradient norm, and AdamW clipped
// and guarded on the device. The host uploads the step's tokens, targets and
// schedule without waiting and reads the results only when asked. On a backend that
// supports graphs, the step runs eagerly once, is then recorded (a CUDA graph) and replayed.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>

#include "pope/backend.hpp"
#include "pope/communicator.hpp"
#include "pope/model.hpp"
#include "pope/optim.hpp"

namespace pope {

struct TrainStepShape {
  int micro_batches = 1;    // gradient-accumulation steps per optimizer step
  int batch = 1;            // B of each micro-batch
  int seq_len = 1;          // T
  double grad_scale = 1.0;  // the loss gradient's factor (1 / tokens of the global batch, all ranks)
  std::int64_t tokens() const { return std::int64_t(micro_batches) * batch * seq_len; }
};

// Device time of one step's phases, in seconds (TrainStep::time_phases).
struct StepPhases {
  double forward_backward = 0.0;  // zeroing the gradients, every micro-batch's forward and backward
  double reduction = 0.0;  // from the end of the backward until the sums over the ranks are in: the
                           // part of the gradient reduction not hidden behind the backward
  double update = 0.0;     // gradient norm and AdamW (on this rank's shard with ZeRO-1)
  double gather = 0.0;     // ZeRO-1: all-gather of the updated compute copy, positional masters' broadcast
  double total() const { return forward_backward + reduction + update + gather; }
  StepPhases& operator+=(const StepPhases& other);
  StepPhases operator/(double divisor) const;
};

struct TrainStepResult {
  double loss_sum = 0.0;   // Σ token losses over every micro-batch of every rank (unmasked targets)
  OptimizerStepResult optimizer;
  int stop_votes = 0;      // ranks that asked to stop with this step (see enqueue)
  std::optional<StepPhases> phases;  // with time_phases(true)
};

class TrainStep {
 public:
  // use_graph = false keeps every step eager (for comparisons); it is ignored by backends
  // without graph support. With a communicator of several ranks, each step sums the
  // gradients and losses over the ranks before the optimizer (so every rank applies the same
  // update) and runs eagerly; nullptr means a single process. The gradient sum is an
  // all-reduce per bucket of at least bucket_bytes, started during the backward of the last
  // micro-batch as soon as its layers are done (bucket_bytes = 0: one all-reduce of the whole
  // arena after the backward); when the optimizer is sharded (ZeRO-1) each bucket is reduced
  // to the ranks owning its shards instead (bucket_bytes = 0: one reduce-scatter after the
  // backward). Throws std::invalid_argument for a non-positive shape or a negative bucket size.
  TrainStep(Model& model, AdamW& optimizer, TrainStepShape shape, bool use_graph = true,
            Communicator* communicator = nullptr, std::int64_t bucket_bytes = kDefaultBucketBytes);

  static constexpr std::int64_t kDefaultBucketBytes = std::int64_t(25) << 20;
  ~TrainStep();
  TrainStep(const TrainStep&) = delete;
  TrainStep& operator=(const TrainStep&) = delete;

  // Queues optimizer step `step` (1-based) at learning rate `lr` over tokens and targets of
  // shape().tokens() entries each (micro-batch after micro-batch, B·T each; targets < 0 are
  // masked). Returns without waiting for this step; it waits for the step two before, whose
  // host staging it reuses, so the host runs at most two steps ahead. Token ids are checked here.
  // stop_vote: this rank asks to stop after this step; the votes of all ranks are summed into
  // the step's result, so that every rank sees the same count at the same step.
  void enqueue(std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets, long step, double lr,
               bool stop_vote = false);

  // The results of the step most recently enqueued, or of the one before it: waits for that
  // step only. Throws std::logic_error for an older step (its results are overwritten).
  TrainStepResult result(long step);

  // From the next enqueue on, times every step's phases on the device (timed fences between
  // them, no synchronisation) and returns them with its results. Timed steps run eagerly: a
  // recorded graph would replay its first timestamps.
  void time_phases(bool on) { time_phases_ = on; }

  const TrainStepShape& shape() const { return shape_; }
  // Whether a recording of the step exists for the model's current activation buffers and the
  // backend's current scratch, so that the next enqueue replays it (true from the second step
  // on a graph backend).
  bool replaying() const;

 private:
  struct Slot;
  void run_step();
  void queue_step();
  void mark_phase(int boundary);  // records the queuing slot's timed fence `boundary` when timing

  Model& model_;
  AdamW& optimizer_;
  TrainStepShape shape_;
  bool use_graph_;
  SingleProcessCommunicator single_process_;
  Communicator& communicator_;  // single_process_ unless one was given
  OwnedTensor tokens_, targets_;  // device [micro_batches, B·T] i32
  OwnedTensor schedule_, stats_;  // device f64 [kStepScheduleSize], [kStepStatsSize]
  OwnedTensor stop_votes_;        // device f64 [1]
  // Two sets of host staging memory, so the host fills one while the device may still read
  // the other (double buffering).
  std::array<std::unique_ptr<Slot>, 2> slots_;
  std::unique_ptr<GraphCapture> graph_;
  std::uint64_t recorded_generation_ = 0;  // Model::activation_generation() the recording holds
  std::uint64_t recorded_scratch_ = 0;     // and Backend::scratch_generation()
  bool warm_ = false;                      // an eager step has run on...
  std::uint64_t warm_generation_ = 0;      // ...these activation buffers
  std::uint64_t warm_scratch_ = 0;         // ...and this backend scratch
  long enqueued_ = 0;
  std::int64_t bucket_bytes_;
  bool time_phases_ = false;
  Slot* queuing_ = nullptr;  // the slot whose step queue_step() is queuing
};

}  // namespace pope
