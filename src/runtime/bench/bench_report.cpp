// How pope-bench train shows its numbers: a short Markdown table (plus the profile) for
// people, one JSON object for scripts.
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string_view>

#include "pope/bench.hpp"

namespace pope {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

std::string optional_text(const std::optional<double>& value, const std::string& format_with, double divisor) {
  return value ? fmt::format(fmt::runtime(format_with), *value / divisor) : std::string("n/a");
}

// Per-op totals over every detail (shapes), the slowest first.
std::vector<OpTime> totals_per_op(const std::vector<OpTime>& profile) {
  std::map<std::string, OpTime> by_op;
  for (const OpTime& t : profile) {
    OpTime& total = by_op[t.op];
    total.op = t.op;
    total.calls += t.calls;
    total.seconds += t.seconds;
    total.flops += t.flops;
  }
  std::vector<OpTime> out;
  for (auto& [op, total] : by_op) out.push_back(total);
  std::sort(out.begin(), out.end(), [](const OpTime& a, const OpTime& b) { return a.seconds > b.seconds; });
  return out;
}

std::string format_profile(const TrainBenchResult& r) {
  double op_sum = 0.0;
  for (const OpTime& t : r.profile) op_sum += t.seconds;
  // A GPU op is timed where the device reaches its fences; a CPU op has finished when its call
  // returns, so its fences read the host clock (backend.hpp, TimedFence).
  const char* timing = r.on_gpu ? "device time of each op between two CUDA events, nothing synchronised in between"
                                : "host time of each op, from the steady clock before and after its call";
  const char* rest = r.on_gpu ? "the device idle between ops, waiting for the host" : "the host's work between ops";
  std::string out = fmt::format(
      "\nProfile of one eager step: {}\n({:.1f} ms wall; the ops sum to {:.1f} ms, the rest is {}).\n\n"
      "| op | calls | ms | % of ops |\n|---|---:|---:|---:|\n",
      timing, r.profiled_step_seconds * 1e3, op_sum * 1e3, rest);
  for (const OpTime& t : totals_per_op(r.profile))
    out += fmt::format("| {} | {} | {:.2f} | {:.1f} |\n", t.op, t.calls, t.seconds * 1e3,
                       op_sum > 0 ? 100.0 * t.seconds / op_sum : 0.0);
  // One table per op timed by shape: products with their TFLOP/s, FP8 casts with their GB/s.
  for (const char* op : {"matmul", "fp8_matmul", "fp8_cast"}) {
    const bool cast = std::string_view(op) == "fp8_cast";
    std::string rows;
    for (const OpTime& t : r.profile)
      if (t.op == op && !t.detail.empty())
        rows += fmt::format("| {} | {} | {:.2f} | {:.3g} |\n", t.detail, t.calls, t.seconds * 1e3,
                            t.seconds > 0 ? (cast ? t.bytes / 1e9 : t.flops / 1e12) / t.seconds : 0.0);
    if (rows.empty()) continue;
    out += fmt::format("\n| {} | calls | ms | {} |\n|---|---:|---:|---:|\n",
                       cast ? "fp8_cast (bytes read and written once)" : fmt::format("{} (a linear layer computes x·Wᵀ)", op),
                       cast ? "GB/s" : "TFLOP/s");
    out += rows;
  }
  return out;
}

}  // namespace

std::string format_train_bench(const TrainBenchResult& r) {
  if (r.step_seconds.empty()) throw std::invalid_argument("format_train_bench: the result holds no timed step");
  const auto [fastest, slowest] = std::minmax_element(r.step_seconds.begin(), r.step_seconds.end());
  std::string out = fmt::format(
      "pope-bench train: {} | position {} | {:.2f}M parameters\n"
      "{} sequences × {} tokens × {} accumulation = {} tokens/step ({})\n\n",
      r.backend, r.position_kind, double(r.parameters) / 1e6, r.micro_batch, r.seq_len, r.accumulation,
      r.tokens_per_step, r.random_tokens ? "random tokens" : "data.train windows");
  out += "| metric | value |\n|---|---:|\n";
  out += fmt::format("| tokens/s | {:.0f} |\n", r.tokens_per_second);
  out += fmt::format("| ms/step (median of {}; fastest … slowest) | {:.1f} ({:.1f} … {:.1f}) |\n",
                     r.step_seconds.size(), r.median_step_seconds * 1e3, *fastest * 1e3, *slowest * 1e3);
  out += fmt::format("| forward / backward / optimizer ms per step | {:.1f} / {:.1f} / {:.1f} |\n",
                     r.forward_seconds * 1e3, r.backward_seconds * 1e3, r.optimizer_seconds * 1e3);
  out += fmt::format("| model TFLOP/s | {:.3g} |\n", r.model_tflops);
  out += fmt::format("| MFU vs {:.0f} TFLOP/s (H200 bf16) | {} |\n", kH200PeakBf16Flops / 1e12,
                     optional_text(r.mfu, "{:.3f}", 1.0));
  out += fmt::format("| device memory in use, peak (added by this run) | {} ({}) |\n",
                     optional_text(r.device_memory_bytes, "{:.1f} GiB", kGiB),
                     optional_text(r.device_memory_added_bytes, "{:.1f} GiB", kGiB));
  out += fmt::format("| loss, last step | {:.4f} |\n", r.last_loss);
  out += fmt::format(
      "\nFLOPs/token = 6·N + 12·n_layer·T·n_embd = {:.4g} (N = {} parameters, the tied embedding counted once;\n"
      "T = {}). Forward is timed separately (Model::forward over the same micro-batches); backward = "
      "forward+backward − forward.\n",
      r.flops_per_token, r.parameters, r.seq_len);
  if (!r.profile.empty()) out += format_profile(r);
  return out;
}

nlohmann::json train_bench_to_json(const TrainBenchResult& r) {
  auto optional_json = [](const std::optional<double>& v) { return v ? nlohmann::json(*v) : nlohmann::json(nullptr); };
  nlohmann::json j = {{"backend", r.backend},
                      {"on_gpu", r.on_gpu},
                      {"position", r.position_kind},
                      {"parameters", r.parameters},
                      {"micro_batch", r.micro_batch},
                      {"seq_len", r.seq_len},
                      {"accumulation", r.accumulation},
                      {"random_tokens", r.random_tokens},
                      {"tokens_per_step", r.tokens_per_step},
                      {"step_seconds", r.step_seconds},
                      {"median_step_seconds", r.median_step_seconds},
                      {"tokens_per_second", r.tokens_per_second},
                      {"flops_per_token", r.flops_per_token},
                      {"model_tflops", r.model_tflops},
                      {"mfu_vs_790", optional_json(r.mfu)},
                      {"forward_seconds", r.forward_seconds},
                      {"backward_seconds", r.backward_seconds},
                      {"optimizer_seconds", r.optimizer_seconds},
                      {"device_memory_bytes", optional_json(r.device_memory_bytes)},
                      {"device_memory_added_bytes", optional_json(r.device_memory_added_bytes)},
                      {"last_loss", r.last_loss}};
  if (!r.profile.empty()) {
    nlohmann::json ops = nlohmann::json::array();
    for (const OpTime& t : r.profile)
      ops.push_back(
          {{"op", t.op}, {"detail", t.detail}, {"calls", t.calls}, {"seconds", t.seconds}, {"flops", t.flops},
           {"bytes", t.bytes}});
    j["profile"] = {{"step_seconds", r.profiled_step_seconds}, {"ops", ops}};
  }
  return j;
}

}  // namespace pope
