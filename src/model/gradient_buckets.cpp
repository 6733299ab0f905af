#include "model/gradient_buckets.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

namespace pope {

GradientBuckets::GradientBuckets(Communicator& communicator, Tensor gradients, std::int64_t bucket_bytes,
                                 std::int64_t shard_numel)
    : communicator_(communicator),
      gradients_(gradients),
      bucket_numel_(std::max<std::int64_t>(1, bucket_bytes / std::int64_t(dtype_size(gradients.dtype)))),
      shard_numel_(shard_numel),
      pending_begin_(gradients.numel()),
      pending_end_(gradients.numel()) {
  if (bucket_bytes <= 0)
    throw std::invalid_argument(fmt::format("GradientBuckets: bucket of {} bytes, expected > 0", bucket_bytes));
  if (shard_numel < 0 || (shard_numel > 0 && shard_numel * communicator.size() < gradients.numel()))
    throw std::invalid_argument(fmt::format("GradientBuckets: shards of {} elements over {} ranks do not cover {} "
                                            "gradients",
                                            shard_numel, communicator.size(), gradients.numel()));
}

void GradientBuckets::ready(std::int64_t begin, std::int64_t end) {
  if (end != pending_begin_ || begin > end || begin < 0)
    throw std::logic_error(fmt::format("GradientBuckets: gradients [{}, {}) reported final, expected a range ending "
                                       "at {} (the backward pass must finish the arena from its end, contiguously)",
                                       begin, end, pending_begin_));
  pending_begin_ = begin;
  if (pending_end_ - pending_begin_ >= bucket_numel_) start_pending();
}

void GradientBuckets::flush() {
  start_pending();
  const std::int64_t covered_from = pending_begin_;
  pending_begin_ = pending_end_ = gradients_.numel();
  if (covered_from != 0)
    throw std::logic_error(fmt::format("GradientBuckets: the backward pass reported gradients [{}, {}) only, not the "
                                       "whole arena",
                                       covered_from, gradients_.numel()));
}

void GradientBuckets::start_pending() {
  if (pending_begin_ == pending_end_) return;
  if (shard_numel_ == 0) {
    communicator_.all_reduce_sum_async(gradients_.rows(pending_begin_, pending_end_));
  } else {
    for (std::int64_t end = pending_end_; end > pending_begin_;) {  // top down, as the backward goes
      const std::int64_t owner = (end - 1) / shard_numel_;
      const std::int64_t begin = std::max(pending_begin_, owner * shard_numel_);
      communicator_.reduce_sum_async(gradients_.rows(begin, end), int(owner));
      end = begin;
    }
  }
  pending_end_ = pending_begin_;
}

}  // namespace pope
