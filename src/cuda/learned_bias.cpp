#include "cuda/learned_bias.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "position/registry.hpp"
#include "position/pj_bias_math.hpp"

namespace pope::cuda {

static_assert(kernels::kPjBiasMaxOrder == kMaxPjOrder, "the CUDA PJ-bias order bound must match the CPU's");
static_assert(int(kernels::kPjSlotCount) == int(kPjParamCount) && int(kernels::kPjSlotOmega) == int(kPjOmega) &&
                  int(kernels::kPjSlotGateLogits) == int(kPjGateLogits) &&
                  int(kernels::kPjSlotFjOrderLogits) == int(kPjFjOrderLogits) &&
                  int(kernels::kPjSlotFjRe) == int(kPjFjRe) && int(kernels::kPjSlotFjIm) == int(kPjFjIm) &&
                  int(kernels::kPjSlotFjDamping) == int(kPjFjDamping) &&
                  int(kernels::kPjSlotAffineSlope) == int(kPjAffineSlope) &&
                  int(kernels::kPjSlotLcOrderLogits) == int(kPjLcOrderLogits) &&
                  int(kernels::kPjSlotLcRe) == int(kPjLcRe) && int(kernels::kPjSlotLcIm) == int(kPjLcIm),
              "the CUDA PJ-bias slots must follow PjParam");

namespace {

void check_count(std::span<float* const> pointers, std::size_t needed, const char* what) {
  if (pointers.size() < needed)
    throw std::invalid_argument("learned score bias: the plan reads " + std::to_string(needed) + " layer parameters, got " +
                                std::to_string(pointers.size()) + " " + what);
}

}  // namespace

std::optional<LearnedBias> LearnedBias::of(const BiasPlan& plan, int n_head, std::span<float* const> params,
                                           std::span<float* const> grads, const int* bucket_of_lag,
                                           const int* bucket_starts, const std::vector<int>& host_bucket_starts) {
  if (!plan.learned()) return std::nullopt;
  LearnedBias bias;
  bias.kind_ = plan.kind;
  if (plan.kind == BiasKind::pj) {
    const std::size_t first = std::size_t(plan.pj.first_param), needed = first + kPjParamCount;
    check_count(params, needed, "parameter pointers");
    if (!grads.empty()) check_count(grads, needed, "gradient pointers");
    bias.pj_.n_head = n_head;
    bias.pj_.order = plan.pj.order;
    bias.pj_.train_length = plan.pj.train_length;
    bias.pj_.lightcone_rho = plan.pj.lightcone_rho;
    for (int k = 0; k < 3; ++k) bias.pj_.sector_enabled[k] = plan.pj.sectors[std::size_t(k)];
    for (std::size_t i = 0; i < kPjParamCount; ++i) {
      bias.pj_.values[i] = params[first + i];
      if (!grads.empty()) bias.pj_grads_.values[i] = grads[first + i];
    }
    return bias;
  }
  const std::size_t index = std::size_t(plan.buckets.param);
  check_count(params, index + 1, "parameter pointers");
  if (!grads.empty()) check_count(grads, index + 1, "gradient pointers");
  bias.buckets_.n_head = n_head;
  bias.buckets_.buckets = plan.buckets.buckets;
  bias.buckets_.bucket_of_lag = bucket_of_lag;
  bias.buckets_.bucket_starts = bucket_starts;
  bias.buckets_.weights = params[index];
  bias.bucket_grad_ = grads.empty() ? nullptr : grads[index];
  const std::vector<int>& lags = plan.buckets.bucket_of_lag;
  if (lags.empty() || host_bucket_starts.size() != std::size_t(plan.buckets.buckets) + 1)
    throw std::invalid_argument("learned score bias: lag buckets need the call's lag table and bucket starts");
  bias.last_bucket_ = lags.back();
  bias.gradient_lags_ = kernels::lag_bucket_gradient_lags(host_bucket_starts.data(), plan.buckets.buckets,
                                                          bias.last_bucket_);
  return bias;
}

cudaError_t LearnedBias::build_table(int seq_len, float* table, cudaStream_t stream) const {
  if (kind_ == BiasKind::pj) return kernels::pj_bias_table(pj_, seq_len, table, stream);
  return kernels::lag_bucket_bias_table(buckets_, seq_len, table, stream);
}

std::size_t LearnedBias::backward_scratch_bytes(int seq_len) const {
  return kind_ == BiasKind::pj ? kernels::pj_bias_backward_partial_doubles(pj_, seq_len) * sizeof(double) : 0;
}

cudaError_t LearnedBias::backward(int seq_len, const float* diag_grad, void* scratch, cudaStream_t stream) const {
  if (kind_ == BiasKind::pj)
    return kernels::pj_bias_backward(pj_, seq_len, diag_grad, pj_grads_, static_cast<double*>(scratch), stream);
  return kernels::lag_bucket_bias_backward(buckets_, seq_len, last_bucket_, diag_grad, bucket_grad_, stream);
}

std::vector<int> lag_bucket_starts(const LagBucketPlan& plan) {
  const int lags = static_cast<int>(plan.bucket_of_lag.size());
  std::vector<int> starts(std::size_t(plan.buckets) + 1, lags);
  // Walking down from the last lag, each bucket's start is its smallest lag; empty buckets
  // (past the call's lags) start and end at the next bucket's start.
  for (int lag = lags - 1; lag >= 0; --lag) starts[std::size_t(plan.bucket_of_lag[std::size_t(lag)])] = lag;
  for (int b = plan.buckets - 1; b >= 0; --b)
    starts[std::size_t(b)] = std::min(starts[std::size_t(b)], starts[std::size_t(b) + 1]);
  return starts;
}

}  // namespace pope::cuda
