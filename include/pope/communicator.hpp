// Collectives between data-parallel ranks, behind one interface so that the trainer never
// sees NCCL: the single-process communicator does nothing, the NCCL one (CUDA builds with
// NCCL) reduces GPU buffers in order with the backend's queued work.
#pragma once

#include <chrono>
#include <memory>
#include <span>
#include <stdexcept>

#include "pope/backend.hpp"
#include "pope/distributed.hpp"
#include "pope/tensor.hpp"

namespace pope {

// A collective that failed or did not finish in time (a rank died, hung, or NCCL reported
// an error); the message names this rank and, where known, the cause.
class CommunicatorError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A part of a tensor that every rank receives from rank `root` (Communicator::broadcast).
struct BroadcastPiece {
  Tensor data;
  int root = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // data (f32 or f64, in backend memory) = Σ over ranks of every rank's data, in place.
  // Queued after the work already queued on the backend, without waiting; every rank must
  // make the same calls in the same order.
  virtual void all_reduce_sum(Tensor data) = 0;
  // The same sum, queued on the communicator's own stream once the work queued on the
  // backend so far has finished, so that the backend goes on with later work (the rest of
  // the backward pass) meanwhile. `data` must not be written until join(). Backends that run
  // in order (the CPU) may reduce at once.
  virtual void all_reduce_sum_async(Tensor data) = 0;
  // The same sum delivered to rank `root` only (ZeRO-1's overlapped reduction: only the
  // owner of a shard reads its sum), queued like all_reduce_sum_async; the other ranks'
  // data is left as it was. Every rank must make the call with the same root and size.
  virtual void reduce_sum_async(Tensor data, int root) = 0;
  // Work queued on the backend after this call waits for every *_async reduction before it.
  virtual void join() = 0;
  // ZeRO-1's pair, in place over data of numel divisible by size(), in equal shards (rank r's
  // shard is elements [r·n/size, (r+1)·n/size)): reduce_scatter_sum leaves in this rank's
  // shard the sum over ranks of that shard (the rest of data is left undefined);
  // all_gather gives every rank every rank's shard (it adds nothing, so bf16 is allowed too).
  // Queued like all_reduce_sum.
  virtual void reduce_scatter_sum(Tensor data) = 0;
  virtual void all_gather(Tensor data) = 0;
  // Every rank's pieces[i].data = rank pieces[i].root's (f32, f64 or bf16), for all pieces as
  // one group; queued like all_reduce_sum. Every rank passes the same pieces (sizes, roots).
  virtual void broadcast(std::span<const BroadcastPiece> pieces) = 0;
  // The same, queued like all_reduce_sum_async: on the communicator's own stream once the work
  // queued on the backend so far has finished; the pieces must not be touched until join().
  virtual void broadcast_async(std::span<const BroadcastPiece> pieces) = 0;
  // Waits for `fence` (recorded after collectives) while watching for failed ranks: throws
  // CommunicatorError when the communication failed or the fence is not reached within the
  // timeout, instead of blocking for ever.
  virtual void wait(Fence& fence) = 0;
  // Every rank has reached this call (it returns on none before all have), with the same
  // error handling as wait().
  virtual void barrier() = 0;
  // Gives up on every pending collective after a local failure, so that the other ranks
  // see an error rather than wait for this one. Never throws.
  virtual void abort() noexcept = 0;
};

// Rank 0 of 1: nothing to reduce (its one shard is the whole tensor); wait() is the fence's own wait.
class SingleProcessCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void all_reduce_sum(Tensor) override {}
  void all_reduce_sum_async(Tensor) override {}
  void reduce_sum_async(Tensor, int) override {}
  void join() override {}
  void reduce_scatter_sum(Tensor) override {}
  void all_gather(Tensor) override {}
  void broadcast(std::span<const BroadcastPiece>) override {}
  void broadcast_async(std::span<const BroadcastPiece>) override {}
  void wait(Fence& fence) override { fence.wait(); }
  void barrier() override {}
  void abort() noexcept override {}
};

// The communicator for `world` over `backend`'s device memory: the single-process one for a
// world of 1, else NCCL, its unique id shared through `rendezvous` (a CUDA backend on the
// rank's local device is required). Throws LaunchError when this build or backend cannot
// run `world` (no NCCL, a CPU backend) and CommunicatorError when NCCL cannot connect the
// ranks within `timeout`.
std::unique_ptr<Communicator> make_communicator(const World& world, Backend& backend, Rendezvous* rendezvous,
                                                std::chrono::duration<double> timeout);

}  // namespace pope
