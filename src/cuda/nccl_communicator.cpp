// NCCL collectives on the CUDA backend's stream (the overlapped reductions on a side stream
// that join() makes the backend's stream wait for). The communicator is non-blocking (NCCL's
// `blocking = 0`): initialisation and every call return at once and their progress is
// polled here together with ncclCommGetAsyncError and a deadline, so that a rank whose
// peer died or hangs stops with an error naming itself after POPE_NCCL_TIMEOUT_S instead of
// waiting for ever; on any failure the communicator is aborted so that pending work ends.
#include "cuda/nccl_communicator.hpp"

#include <cuda_runtime.h>
#include <fmt/format.h>
#include <nccl.h>

#include <cstring>
#include <exception>
#include <functional>
#include <thread>

#include "cuda/cuda_backend.hpp"
#include "cuda/cuda_check.hpp"

namespace pope {

namespace {

using Clock = std::chrono::steady_clock;

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(const World& world, Backend& backend, Rendezvous& rendezvous, std::chrono::duration<double> timeout)
      : world_(world), stream_(cuda_backend_stream(backend)), timeout_(timeout) {
    ncclUniqueId id{};
    if (world.is_root()) check_call(ncclGetUniqueId(&id), "ncclGetUniqueId");
    const std::string shared = rendezvous.share_from_root(std::string(reinterpret_cast<const char*>(&id), sizeof id));
    if (shared.size() != sizeof id)
      throw CommunicatorError(fmt::format("rank {}: the rendezvous delivered {} bytes, expected NCCL's {}-byte unique id",
                                          world.rank, shared.size(), sizeof id));
    std::memcpy(&id, shared.data(), sizeof id);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const ncclResult_t started = ncclCommInitRankConfig(&comm_, world.size, id, world.rank, &config);
    settle(started, "ncclCommInitRankConfig (connecting the ranks)");
    rendezvous.complete();  // every rank has joined, so every rank has read the id
    POPE_CUDA_CHECK(cudaMalloc(&barrier_value_, sizeof(float)));
    POPE_CUDA_CHECK(cudaMemset(barrier_value_, 0, sizeof(float)));  // only its arrival matters, but keep it finite
    POPE_CUDA_CHECK(cudaEventCreateWithFlags(&barrier_done_, cudaEventDisableTiming));
    POPE_CUDA_CHECK(cudaStreamCreateWithFlags(&side_stream_, cudaStreamNonBlocking));
    POPE_CUDA_CHECK(cudaEventCreateWithFlags(&compute_reached_, cudaEventDisableTiming));
    POPE_CUDA_CHECK(cudaEventCreateWithFlags(&side_done_, cudaEventDisableTiming));
  }

  ~NcclCommunicator() override {
    cudaStreamDestroy(side_stream_);  // its pending work, if any, still completes
    cudaEventDestroy(side_done_);
    cudaEventDestroy(compute_reached_);
    cudaEventDestroy(barrier_done_);
    cudaFree(barrier_value_);
    if (comm_ == nullptr) return;
    // Destroyed while an exception unwinds (a failure on this rank): the other ranks may
    // never reach the next collective, so give up at once rather than flush.
    if (std::uncaught_exceptions() > 0) {
      abort();
      return;
    }
    // Flush what is queued, then free; a communicator that cannot finish in time is aborted
    // (a destructor must neither throw nor hang).
    try {
      settle(ncclCommFinalize(comm_), "ncclCommFinalize");
      ncclCommDestroy(comm_);
      comm_ = nullptr;
    } catch (const CommunicatorError&) {
    }
    abort();
  }

  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return world_.rank; }
  int size() const override { return world_.size; }

  void all_reduce_sum(Tensor data) override {
    const ncclDataType_t type = checked_type(data, "all_reduce_sum");
    settle(ncclAllReduce(data.data, data.data, std::size_t(data.numel()), type, ncclSum, comm_, stream_),
           "ncclAllReduce");
  }

  // On the side stream, so that the backend's stream goes on meanwhile.
  void all_reduce_sum_async(Tensor data) override {
    const ncclDataType_t type = checked_type(data, "all_reduce_sum_async");
    side_stream_after_compute();
    settle(ncclAllReduce(data.data, data.data, std::size_t(data.numel()), type, ncclSum, comm_, side_stream_),
           "ncclAllReduce (overlapped)");
  }

  // In place: NCCL reads the root's buffer as its contribution and writes the sum there; the
  // other ranks' buffers are only read.
  void reduce_sum_async(Tensor data, int root) override {
    const ncclDataType_t type = checked_type(data, "reduce_sum_async");
    if (root < 0 || root >= world_.size)
      throw std::invalid_argument(fmt::format("reduce_sum_async: root rank {} of {} ranks", root, world_.size));
    side_stream_after_compute();
    settle(ncclReduce(data.data, data.data, std::size_t(data.numel()), type, ncclSum, root, comm_, side_stream_),
           "ncclReduce (overlapped)");
  }

  void join() override {
    POPE_CUDA_CHECK(cudaEventRecord(side_done_, side_stream_));
    POPE_CUDA_CHECK(cudaStreamWaitEvent(stream_, side_done_, 0));
  }

  // In place: rank r's shard is also its receive buffer, as NCCL allows.
  void reduce_scatter_sum(Tensor data) override {
    const ncclDataType_t type = checked_type(data, "reduce_scatter_sum");
    const std::size_t shard = shard_numel(data, "reduce_scatter_sum");
    settle(ncclReduceScatter(data.data, shard_pointer(data, shard), shard, type, ncclSum, comm_, stream_),
           "ncclReduceScatter");
  }

  void all_gather(Tensor data) override {
    const ncclDataType_t type = checked_type(data, "all_gather", true);
    const std::size_t shard = shard_numel(data, "all_gather");
    settle(ncclAllGather(shard_pointer(data, shard), data.data, shard, type, comm_, stream_), "ncclAllGather");
  }

  void broadcast(std::span<const BroadcastPiece> pieces) override { broadcast_on(pieces, stream_, "broadcast"); }

  // On the side stream, so that the backend's stream goes on meanwhile.
  void broadcast_async(std::span<const BroadcastPiece> pieces) override {
    side_stream_after_compute();
    broadcast_on(pieces, side_stream_, "broadcast_async");
  }


  void wait(Fence& fence) override {
    watch([&] { return fence.ready(); }, "waiting for a step's collectives");
  }

  void barrier() override {
    require_open("barrier");
    settle(ncclAllReduce(barrier_value_, barrier_value_, 1, ncclFloat32, ncclSum, comm_, stream_), "ncclAllReduce");
    POPE_CUDA_CHECK(cudaEventRecord(barrier_done_, stream_));
    watch(
        [&] {
          const cudaError_t status = cudaEventQuery(barrier_done_);
          if (status == cudaErrorNotReady) return false;
          POPE_CUDA_CHECK(status);
          return true;
        },
        "barrier");
  }

  void abort() noexcept override {
    if (comm_ == nullptr) return;
    ncclCommAbort(comm_);
    comm_ = nullptr;
  }

 private:
  // One group: NCCL launches the pieces together instead of one kernel each.
  void broadcast_on(std::span<const BroadcastPiece> pieces, cudaStream_t stream, const char* what) {
    if (pieces.empty()) return;
    for (const BroadcastPiece& piece : pieces) {  // every check before the group opens
      checked_type(piece.data, what, true);
      if (piece.root < 0 || piece.root >= world_.size)
        throw std::invalid_argument(fmt::format("{}: root rank {} of {} ranks", what, piece.root, world_.size));
    }
    check_call(ncclGroupStart(), "ncclGroupStart");
    for (const BroadcastPiece& piece : pieces) {
      const Tensor& data = piece.data;
      const ncclResult_t queued = ncclBroadcast(data.data, data.data, std::size_t(data.numel()),
                                                checked_type(data, what, true), piece.root, comm_, stream);
      if (queued != ncclSuccess && queued != ncclInProgress) {
        ncclGroupEnd();
        check_call(queued, "ncclBroadcast");
      }
    }
    settle(ncclGroupEnd(), "ncclBroadcast (grouped)");
  }

  // The side stream waits for the backend's work so far, so that a reduction started on it
  // reads final gradients.
  void side_stream_after_compute() {
    POPE_CUDA_CHECK(cudaEventRecord(compute_reached_, stream_));
    POPE_CUDA_CHECK(cudaStreamWaitEvent(side_stream_, compute_reached_, 0));
  }

  // The NCCL type of an f32 or f64 CUDA tensor (or bf16 for the collectives that only copy,
  // `copies_only`: sums stay fp32); checks that the communicator is open.
  ncclDataType_t checked_type(const Tensor& data, const char* what, bool copies_only = false) const {
    const bool bf16 = copies_only && data.dtype == DType::bf16;
    if (data.device != DeviceKind::cuda || (data.dtype != DType::f32 && data.dtype != DType::f64 && !bf16))
      throw std::invalid_argument(fmt::format("{}: a {} {} tensor; expected {} in CUDA memory", what,
                                              data.device == DeviceKind::cuda ? "CUDA" : "host",
                                              dtype_name(data.dtype), copies_only ? "f32, f64 or bf16" : "f32 or f64"));
    require_open(what);
    return bf16 ? ncclBfloat16 : data.dtype == DType::f32 ? ncclFloat32 : ncclFloat64;
  }

  std::size_t shard_numel(const Tensor& data, const char* what) const {
    if (data.numel() % world_.size != 0)
      throw std::invalid_argument(fmt::format("{}: {} elements do not split into {} equal shards", what, data.numel(),
                                              world_.size));
    return std::size_t(data.numel() / world_.size);
  }

  void* shard_pointer(const Tensor& data, std::size_t shard) const {
    return static_cast<char*>(data.data) + std::size_t(world_.rank) * shard * dtype_size(data.dtype);
  }

  void require_open(const char* what) const {
    if (comm_ == nullptr)
      throw CommunicatorError(fmt::format("rank {}: {} after the communicator was aborted", world_.rank, what));
  }

  // Polls `done` until it holds, failing on an asynchronous NCCL error or the deadline.
  void watch(const std::function<bool()>& done, const char* what) {
    require_open(what);
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(timeout_);
    for (;;) {
      if (done()) return;
      ncclResult_t state = ncclSuccess;
      check_call(ncclCommGetAsyncError(comm_, &state), "ncclCommGetAsyncError");
      if (state != ncclSuccess && state != ncclInProgress) fail(state, what);
      if (Clock::now() > deadline) timed_out(what);
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  // A non-blocking call returns ncclInProgress while NCCL still works on it in the
  // background; the next call may only be made once it has settled.
  void settle(ncclResult_t result, const char* what) {
    if (result != ncclInProgress) {
      check_call(result, what);
      return;
    }
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(timeout_);
    for (;;) {
      ncclResult_t state = ncclInProgress;
      check_call(ncclCommGetAsyncError(comm_, &state), "ncclCommGetAsyncError");
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) fail(state, what);
      if (Clock::now() > deadline) timed_out(what);
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  void check_call(ncclResult_t result, const char* what) {
    if (result != ncclSuccess) fail(result, what);
  }

  [[noreturn]] void fail(ncclResult_t result, const char* what) {
    const char* detail = ncclGetLastError(comm_);  // this thread's last NCCL error message
    const std::string message = fmt::format(
        "rank {} of {}: {} failed: NCCL {}{}{}", world_.rank, world_.size, what, ncclGetErrorString(result),
        detail != nullptr && *detail != '\0' ? fmt::format(" ({})", detail) : std::string(),
        result == ncclRemoteError || result == ncclSystemError
            ? "; another rank probably failed or was killed: look for its own 'rank N' error"
            : "");
    abort();
    throw CommunicatorError(message);
  }

  [[noreturn]] void timed_out(const char* what) {
    const std::string message = fmt::format(
        "rank {} of {}: {} did not finish within {:.0f} s (POPE_NCCL_TIMEOUT_S); another rank is probably dead, "
        "hung or much slower: look for its own 'rank N' error",
        world_.rank, world_.size, what, timeout_.count());
    abort();
    throw CommunicatorError(message);
  }

  World world_;
  cudaStream_t stream_;       // the backend's
  cudaStream_t side_stream_ = nullptr;  // all_reduce_sum_async's, joined back into stream_
  cudaEvent_t compute_reached_ = nullptr, side_done_ = nullptr;
  std::chrono::duration<double> timeout_;
  ncclComm_t comm_ = nullptr;
  float* barrier_value_ = nullptr;
  cudaEvent_t barrier_done_ = nullptr;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(const World& world, Backend& backend, Rendezvous& rendezvous,
                                                     std::chrono::duration<double> timeout) {
  return std::make_unique<NcclCommunicator>(world, backend, rendezvous, timeout);
}

}  // namespace pope
