// A Communicator between threads of one process over CPU-backend tensors, so that the
// data-parallel trainer (several ranks, one model each) is tested without GPUs or NCCL.
// Sums run in rank order, so every rank gets bit-identical results, as NCCL's do.
#pragma once

#include <barrier>
#include <memory>
#include <stdexcept>
#include <vector>

#include "pope/communicator.hpp"

namespace pope::testing {

// State shared by the ranks of one thread world.
struct ThreadWorld {
  explicit ThreadWorld(int size) : size(size), sync(size), contributions(std::size_t(size)) {}
  int size;
  std::barrier<> sync;
  std::vector<Tensor> contributions;  // each rank's tensor during an all-reduce
};

class ThreadCommunicator final : public Communicator {
 public:
  ThreadCommunicator(std::shared_ptr<ThreadWorld> world, int rank) : world_(std::move(world)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return world_->size; }

  void all_reduce_sum(Tensor data) override { sum_into(data, true); }
  // The CPU backend has finished all queued work when a call returns, so the sums can be
  // taken at once.
  void all_reduce_sum_async(Tensor data) override { sum_into(data, true); }
  void reduce_sum_async(Tensor data, int root) override {
    if (root < 0 || root >= world_->size) throw std::invalid_argument("ThreadCommunicator: a reduction to no rank");
    sum_into(data, root == rank_);
  }
  void join() override {}

  void reduce_scatter_sum(Tensor data) override {
    const std::int64_t shard = shard_numel(data);
    world_->contributions[std::size_t(rank_)] = data;
    world_->sync.arrive_and_wait();
    std::vector<double> sum(std::size_t(shard), 0.0);
    const std::size_t first = std::size_t(rank_ * shard);
    for (const Tensor& part : world_->contributions)  // rank order, as all_reduce_sum
      for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += element(part, first + i);
    world_->sync.arrive_and_wait();
    for (std::size_t i = 0; i < sum.size(); ++i) set_element(data, first + i, sum[i]);
  }

  void all_gather(Tensor data) override {
    const std::int64_t shard = shard_numel(data);
    world_->contributions[std::size_t(rank_)] = data;
    world_->sync.arrive_and_wait();
    for (int r = 0; r < world_->size; ++r) {
      if (r == rank_) continue;
      const Tensor& part = world_->contributions[std::size_t(r)];
      for (std::size_t i = std::size_t(r * shard); i < std::size_t((r + 1) * shard); ++i)
        set_element(data, i, element(part, i));
    }
    world_->sync.arrive_and_wait();
  }

  void broadcast(std::span<const BroadcastPiece> pieces) override {
    for (const BroadcastPiece& piece : pieces) {
      if (piece.root < 0 || piece.root >= world_->size) throw std::invalid_argument("ThreadCommunicator: a broadcast from no rank");
      world_->contributions[std::size_t(rank_)] = piece.data;
      world_->sync.arrive_and_wait();
      const Tensor& source = world_->contributions[std::size_t(piece.root)];
      Tensor data = piece.data;
      if (piece.root != rank_)
        for (std::size_t i = 0; i < std::size_t(data.numel()); ++i) set_element(data, i, element(source, i));
      world_->sync.arrive_and_wait();
    }
  }
  void broadcast_async(std::span<const BroadcastPiece> pieces) override { broadcast(pieces); }

  void wait(Fence& fence) override { fence.wait(); }
  void barrier() override { world_->sync.arrive_and_wait(); }
  // Leaves the world, so that the other threads' barriers stop waiting for this one.
  void abort() noexcept override {
    if (!aborted_) world_->sync.arrive_and_drop();
    aborted_ = true;
  }

 private:
  // Sums every rank's `data` in rank order; stores the sum in this rank's `data` if `keep`.
  void sum_into(Tensor data, bool keep) {
    world_->contributions[std::size_t(rank_)] = data;
    world_->sync.arrive_and_wait();  // every rank has published its tensor
    std::vector<double> sum(std::size_t(data.numel()), 0.0);
    for (const Tensor& part : world_->contributions)
      for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += element(part, i);
    world_->sync.arrive_and_wait();  // every rank has read every tensor
    if (keep)
      for (std::size_t i = 0; i < sum.size(); ++i) set_element(data, i, sum[i]);
  }
  static double element(const Tensor& t, std::size_t i) {
    return t.dtype == DType::f32 ? double(t.as<float>()[i]) : t.as<double>()[i];
  }
  static void set_element(Tensor& t, std::size_t i, double value) {
    if (t.dtype == DType::f32)
      t.as<float>()[i] = float(value);
    else
      t.as<double>()[i] = value;
  }
  std::int64_t shard_numel(const Tensor& data) const {
    if (data.numel() % world_->size != 0)
      throw std::invalid_argument("ThreadCommunicator: a sharded collective over a tensor not divisible by the ranks");
    return data.numel() / world_->size;
  }
  std::shared_ptr<ThreadWorld> world_;
  int rank_;
  bool aborted_ = false;
};

}  // namespace pope::testing
