#include "pope/train_step.hpp"

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <exception>
#include <optional>
#include <stdexcept>

#include "model/gradient_buckets.hpp"

namespace pope {

// Host staging of one step: its inputs, its results, and a fence recorded once the device
// has copied the results out (so everything before, the input uploads too, is done).
struct TrainStep::Slot {
  Buffer tokens, targets, schedule, stats, stop_votes;
  std::unique_ptr<Fence> done;
  long step = 0;  // the step whose results `stats` receives; 0 before the first
  // With phase timing: the boundaries start | backward done | sums in | updated | gathered.
  std::array<std::unique_ptr<TimedFence>, 5> phase_marks;
  bool timed = false;  // whether this slot's step recorded them
};

StepPhases& StepPhases::operator+=(const StepPhases& other) {
  forward_backward += other.forward_backward;
  reduction += other.reduction;
  update += other.update;
  gather += other.gather;
  return *this;
}

StepPhases StepPhases::operator/(double divisor) const {
  return {forward_backward / divisor, reduction / divisor, update / divisor, gather / divisor};
}

TrainStep::TrainStep(Model& model, AdamW& optimizer, TrainStepShape shape, bool use_graph,
                     Communicator* communicator, std::int64_t bucket_bytes)
    : model_(model),
      optimizer_(optimizer),
      shape_(shape),
      use_graph_(use_graph),
      communicator_(communicator != nullptr ? *communicator : single_process_),
      bucket_bytes_(bucket_bytes) {
  if (shape.micro_batches <= 0 || shape.batch <= 0 || shape.seq_len <= 0)
    throw std::invalid_argument(fmt::format("TrainStep: {} micro-batches of {} × {} tokens; expected all positive",
                                            shape.micro_batches, shape.batch, shape.seq_len));
  if (bucket_bytes < 0)
    throw std::invalid_argument(fmt::format("TrainStep: gradient buckets of {} bytes, expected >= 0", bucket_bytes));
  Backend& be = model.backend();
  const std::int64_t per_micro = std::int64_t(shape.batch) * shape.seq_len;
  tokens_ = allocate_tensor(be, {shape.micro_batches, per_micro}, DType::i32);
  targets_ = allocate_tensor(be, {shape.micro_batches, per_micro}, DType::i32);
  schedule_ = allocate_tensor(be, {kStepScheduleSize}, DType::f64);
  stats_ = allocate_tensor(be, {kStepStatsSize}, DType::f64);
  stop_votes_ = allocate_tensor(be, {1}, DType::f64);
  for (auto& slot : slots_) {
    slot = std::make_unique<Slot>();
    slot->tokens = be.allocate_host(tokens_.tensor.nbytes());
    slot->targets = be.allocate_host(targets_.tensor.nbytes());
    slot->schedule = be.allocate_host(schedule_.tensor.nbytes());
    slot->stats = be.allocate_host(stats_.tensor.nbytes());
    slot->stop_votes = be.allocate_host(stop_votes_.tensor.nbytes());
    slot->done = be.make_fence();
  }
}

// The device may still copy a step's results into the pinned slots: wait before they are
// freed (through the communicator, which gives up when other ranks have failed). A
// destructor must not throw, and an error here has been or will be reported by the call
// that queued the work.
TrainStep::~TrainStep() {
  // Destroyed by an exception on this rank: the other ranks may never join the collectives
  // still queued, so end them now rather than wait for the timeout.
  if (std::uncaught_exceptions() > 0) communicator_.abort();
  for (auto& slot : slots_) {
    try {
      communicator_.wait(*slot->done);
    } catch (...) {
    }
  }
}

bool TrainStep::replaying() const {
  return graph_ != nullptr && recorded_generation_ == model_.activation_generation() &&
         recorded_scratch_ == model_.backend().scratch_generation();
}

void TrainStep::enqueue(std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets, long step,
                        double lr, bool stop_vote) {
  const std::int64_t count = shape_.tokens();
  if (std::int64_t(tokens.size()) != count || std::int64_t(targets.size()) != count)
    throw std::invalid_argument(fmt::format("TrainStep: {} tokens and {} targets given, expected {} micro-batches × "
                                            "{} × {} = {} each",
                                            tokens.size(), targets.size(), shape_.micro_batches, shape_.batch,
                                            shape_.seq_len, count));
  check_tokens(tokens, targets, model_.config().vocab_size);
  const auto schedule = optimizer_.schedule(step, lr);

  Backend& be = model_.backend();
  Slot& slot = *slots_[std::size_t(enqueued_ % 2)];
  communicator_.wait(*slot.done);  // the device is done with this slot's previous step (two steps ago)
  if (time_phases_ && slot.phase_marks[0] == nullptr)
    for (auto& mark : slot.phase_marks) mark = be.make_timed_fence();
  slot.timed = time_phases_;
  queuing_ = &slot;
  std::memcpy(slot.tokens.get(), tokens.data(), tokens.size_bytes());
  std::memcpy(slot.targets.get(), targets.data(), targets.size_bytes());
  std::memcpy(slot.schedule.get(), schedule.data(), sizeof(schedule));
  *static_cast<double*>(slot.stop_votes.get()) = stop_vote ? 1.0 : 0.0;
  be.copy_from_host_async(tokens_.tensor, slot.tokens.get());
  be.copy_from_host_async(targets_.tensor, slot.targets.get());
  be.copy_from_host_async(schedule_.tensor, slot.schedule.get());
  be.copy_from_host_async(stop_votes_.tensor, slot.stop_votes.get());
  run_step();
  be.copy_to_host_async(slot.stats.get(), stats_.tensor);
  be.copy_to_host_async(slot.stop_votes.get(), stop_votes_.tensor);
  slot.done->record();
  slot.step = step;
  ++enqueued_;
}

TrainStepResult TrainStep::result(long step) {
  // The newest slot first, in case a step number was enqueued twice.
  for (long back = 1; back <= 2 && back <= enqueued_; ++back) {
    Slot& slot = *slots_[std::size_t((enqueued_ - back) % 2)];
    if (slot.step != step) continue;
    communicator_.wait(*slot.done);
    const std::span<const double, kStepStatsSize> stats(static_cast<const double*>(slot.stats.get()), kStepStatsSize);
    TrainStepResult result{stats[kStatsLossSum], optimizer_.result_from(stats),
                           int(std::lround(*static_cast<const double*>(slot.stop_votes.get()))), std::nullopt};
    if (slot.timed) {  // every mark precedes `done`, so all have been reached
      const auto between = [&](int from, int to) { return slot.phase_marks[to]->seconds_since(*slot.phase_marks[from]); };
      result.phases = StepPhases{between(0, 1), between(1, 2), between(2, 3), between(3, 4)};
    }
    return result;
  }
  throw std::logic_error(
      fmt::format("TrainStep: no results kept for step {}; only the last two enqueued steps are", step));
}

// Eager until one step of the current activation buffers has run (it reserves every scratch
// buffer the step needs), then recorded once and replayed; recorded again if the model's
// activations or the backend's scratch changed (e.g. by an evaluation with another batch size,
// or a sample decoded past the training length). Steps with
// collectives stay eager: NCCL can be recorded in a graph, but an eager step is what the
// multi-GPU check has verified, and at data-parallel sizes the launch overhead is small.
void TrainStep::run_step() {
  if (time_phases_) graph_.reset();  // timed steps run eagerly, also when timing starts after a recording
  if (replaying()) {
    graph_->replay();
    return;
  }
  graph_.reset();
  Backend& be = model_.backend();
  const bool warm =
      warm_ && warm_generation_ == model_.activation_generation() && warm_scratch_ == be.scratch_generation();
  if (!use_graph_ || time_phases_ || !be.supports_graphs() || communicator_.size() > 1 || !warm) {
    queue_step();
    warm_ = true;
    warm_generation_ = model_.activation_generation();
    warm_scratch_ = be.scratch_generation();
    return;
  }
  std::unique_ptr<GraphCapture> capture = be.make_graph_capture();
  capture->begin();
  queue_step();  // on an exception, the capture's destructor ends the recording
  capture->end();
  graph_ = std::move(capture);
  recorded_generation_ = model_.activation_generation();
  recorded_scratch_ = be.scratch_generation();
  graph_->replay();
}

namespace {
// Removes the model's gradients-ready callback when the step's backward passes are queued,
// also when one of them throws.
struct GradientsReadyScope {
  Model& model;
  ~GradientsReadyScope() { model.set_gradients_ready({}); }
};
}  // namespace

void TrainStep::mark_phase(int boundary) {
  if (queuing_ != nullptr && queuing_->timed) queuing_->phase_marks[std::size_t(boundary)]->record();
}

// Every rank's gradient already carries the global batch's scale, so their sum is the
// gradient of the global mean loss; the summed loss lets every rank's non-finite guard take
// the same decision. The gradients are summed in fp32 whichever way they are split; the sum
// is elementwise, so with two ranks (a + b = b + a) buckets give the single all-reduce's bits
// (with ZeRO-1, the reduce-scatter's); with more, NCCL's order of the summands may depend on
// an element's place in the buffer (a last-bit difference), and every rank still receives the
// same sums.
void TrainStep::queue_step() {
  Backend& be = model_.backend();
  mark_phase(0);
  be.fill(stats_.tensor, 0.0);  // the loss sum starts at 0; the other entries are overwritten
  model_.zero_gradients();
  const Tensor loss_sum = stats_.tensor.rows(kStatsLossSum, kStatsLossSum + 1);
  const Shape micro_batch{std::int64_t(shape_.batch) * shape_.seq_len};
  const bool overlap = communicator_.size() > 1 && bucket_bytes_ > 0;
  std::optional<GradientBuckets> buckets;
  if (overlap)
    buckets.emplace(communicator_, model_.gradients(), bucket_bytes_,
                    optimizer_.sharded() ? model_.padded_gradients().numel() / communicator_.size() : 0);
  {
    GradientsReadyScope scope{model_};
    for (int m = 0; m < shape_.micro_batches; ++m) {
      // Only the last micro-batch's backward makes gradients final.
      if (overlap && m + 1 == shape_.micro_batches)
        model_.set_gradients_ready([&](std::int64_t begin, std::int64_t end) { buckets->ready(begin, end); });
      model_.forward_backward(tokens_.tensor.rows(m, m + 1).reshaped(micro_batch),
                              targets_.tensor.rows(m, m + 1).reshaped(micro_batch), shape_.batch, shape_.seq_len,
                              shape_.grad_scale, loss_sum);
    }
  }
  mark_phase(1);
  if (overlap) {
    buckets->flush();
    communicator_.join();
  } else if (optimizer_.sharded()) {
    communicator_.reduce_scatter_sum(model_.padded_gradients());  // each rank needs its shard's sum only
  } else {
    communicator_.all_reduce_sum(model_.gradients());
  }
  communicator_.all_reduce_sum(loss_sum);
  communicator_.all_reduce_sum(stop_votes_.tensor);
  mark_phase(2);
  optimizer_.step_on_device(schedule_.tensor, stats_.tensor,
                            queuing_ != nullptr && queuing_->timed ? queuing_->phase_marks[3].get() : nullptr);
  mark_phase(4);
}

}  // namespace pope
