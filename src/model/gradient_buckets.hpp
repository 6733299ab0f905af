// Overlaps the data-parallel gradient reduction with the backward pass: the ranges the
// backward finishes (Model::GradientsReady, last layer first) are merged into buckets of at
// least a given size, and each full bucket's reduction starts on the communicator's stream
// while the backward goes on with the layers below. Every rank forms the same buckets (they
// depend on the layout and the size only), so the ranks make the same collective calls.
#pragma once

#include <cstdint>

#include "pope/communicator.hpp"
#include "pope/tensor.hpp"

namespace pope {

class GradientBuckets {
 public:
  // gradients: the flat arena of Model::gradients(); bucket_bytes > 0.
  // shard_numel 0: every bucket is all-reduced. shard_numel > 0 (ZeRO-1): rank r owns the
  // elements [r·shard_numel, (r+1)·shard_numel) and each bucket's sums go to the owners of
  // its elements only — a bucket across a shard edge is one reduction per owner — which
  // moves half an all-reduce's bytes, as a reduce-scatter does, but can start per bucket.
  // (The padding past the arena that completes the last shard is zero on every rank and
  // is not reduced: its sum is zero.)
  GradientBuckets(Communicator& communicator, Tensor gradients, std::int64_t bucket_bytes,
                  std::int64_t shard_numel = 0);

  // Gradients [begin, end) are final; `end` must be where the previous range began (the
  // first range ends at the arena's end). Throws std::logic_error otherwise.
  void ready(std::int64_t begin, std::int64_t end);
  // Starts the last, partly filled bucket and checks that the ranges covered the arena
  // exactly once (std::logic_error if not); then resets for the next backward pass. The
  // caller joins the communicator before the optimizer reads the gradients.
  void flush();

 private:
  void start_pending();

  Communicator& communicator_;
  Tensor gradients_;
  std::int64_t bucket_numel_;
  std::int64_t shard_numel_;
  std::int64_t pending_begin_, pending_end_;  // the bucket being filled: [begin, end)
};

}  // namespace pope
