// pope-bench's library parts: the timing decorator forwards ops and counts them, the train
// benchmark's numbers agree with each other, and a step dump holds exactly what the model
// computes for its weights and batch.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <string>

#include "cpu/cpu_backend.hpp"
#include "pope/bench.hpp"
#include "pope/checkpoint.hpp"
#include "pope/model.hpp"
#include "pope/rng.hpp"
#include "runtime/bench/bench_profiling_backend.hpp"
#include "scratch_dir.hpp"

using namespace pope;

namespace {

RunConfig tiny_config(const std::string& position) {
  RunConfig c;
  c.model.vocab_size = 61;
  c.model.padded_vocab_size = 64;
  c.model.n_layer = 2;
  c.model.n_head = 2;
  c.model.n_embd = 16;
  c.model.context_length = 8;
  c.model.position.kind = position;
  c.model.position.pope.delta_init = DeltaInit::uniform;
  c.train.batch_size = 4;
  c.train.micro_batch_size = 2;
  c.train.seq_len = 8;
  c.train.threads = 1;
  c.train.device = DeviceChoice::cpu;
  return c;
}

OwnedTensor random_tensor(Backend& backend, Shape shape, Rng& rng) {
  OwnedTensor t = allocate_tensor(backend, shape, DType::f32);
  std::vector<float> values(static_cast<std::size_t>(shape_numel(shape)));
  for (float& v : values) v = static_cast<float>(rng.normal());
  tensor_from_host_f32(backend, t.tensor, values);
  return t;
}

template <class T>
std::vector<T> values_of(const SafetensorsTensor& t) {
  std::vector<T> out(t.bytes.size() / sizeof(T));
  std::memcpy(out.data(), t.bytes.data(), t.bytes.size());
  return out;
}

}  // namespace

TEST(ProfilingBackend, ForwardsOpsAndTimesThemOnlyWhileEnabled) {
  auto cpu = make_cpu_backend("float", 1);
  ProfilingBackend profiler(*cpu);
  Rng rng(7);
  const OwnedTensor a = random_tensor(*cpu, {4, 3}, rng), b = random_tensor(*cpu, {5, 3}, rng);
  const OwnedTensor direct = allocate_tensor(*cpu, {4, 5}, DType::f32);
  const OwnedTensor profiled = allocate_tensor(*cpu, {4, 5}, DType::f32);
  cpu->matmul(direct.tensor, a.tensor, b.tensor, false, true);

  profiler.matmul(profiled.tensor, a.tensor, b.tensor, false, true, 1.0, 0.0);
  EXPECT_TRUE(profiler.times().empty()) << "disabled: nothing recorded";
  profiler.set_enabled(true);
  profiler.matmul(profiled.tensor, a.tensor, b.tensor, false, true, 1.0, 0.0);
  profiler.matmul(profiled.tensor, a.tensor, b.tensor, false, true, 1.0, 0.0);
  const double squares = profiler.sum_of_squares(a.tensor);

  EXPECT_EQ(tensor_to_host_f32(*cpu, profiled.tensor), tensor_to_host_f32(*cpu, direct.tensor));
  EXPECT_DOUBLE_EQ(squares, cpu->sum_of_squares(a.tensor));
  const std::vector<OpTime> times = profiler.times();
  ASSERT_EQ(times.size(), 2u);
  const auto matmul = std::find_if(times.begin(), times.end(), [](const OpTime& t) { return t.op == "matmul"; });
  ASSERT_NE(matmul, times.end());
  EXPECT_EQ(matmul->detail, "out [4, 5] = a [4, 3] · bᵀ [5, 3]");
  EXPECT_EQ(matmul->calls, 2);
  EXPECT_DOUBLE_EQ(matmul->flops, 2 * (2.0 * 4 * 5 * 3));
  EXPECT_GT(matmul->seconds, 0.0);
}

TEST(ProfilingBackend, NamesFp8CastsAndProductsByShapeWithTheirWork) {
  auto cpu = make_cpu_backend("float", 1);
  ProfilingBackend profiler(*cpu);
  profiler.set_enabled(true);
  const OwnedTensor x = allocate_tensor(*cpu, {4, 8}, DType::f32), pre = allocate_tensor(*cpu, {4, 8}, DType::f32);
  const OwnedTensor x8 = allocate_tensor(*cpu, {4, 8}, DType::e5m2), x8_t = allocate_tensor(*cpu, {8, 4}, DType::e5m2);
  const OwnedTensor w8 = allocate_tensor(*cpu, {6, 8}, DType::e4m3), out = allocate_tensor(*cpu, {4, 6}, DType::f32);
  const OwnedTensor scale = allocate_tensor(*cpu, {1}, DType::f32), amax = allocate_tensor(*cpu, {1}, DType::f32);
  for (const OwnedTensor* t : {&x, &pre, &out, &amax}) cpu->fill(t->tensor, 0.0);
  cpu->fill(scale.tensor, 1.0);
  profiler.fp8_cast(x8.tensor, x8_t.tensor, x.tensor, scale.tensor, amax.tensor, Backend::Fp8Prologue::gelu_backward,
                    pre.tensor);
  profiler.fp8_cast({}, x8_t.tensor, x.tensor, scale.tensor, amax.tensor, Backend::Fp8Prologue::none, {});
  profiler.fp8_matmul(out.tensor, x8.tensor, scale.tensor, w8.tensor, scale.tensor, 0.0, true, out.tensor);

  std::map<std::string, OpTime> by_detail;
  for (const OpTime& t : profiler.times()) by_detail[t.op + ": " + t.detail] = t;
  ASSERT_EQ(by_detail.size(), 3u);
  const OpTime& fused = by_detail.at("fp8_cast: x [4, 8] → e5m2 rows + ᵀ of x · gelu'(pre)");
  EXPECT_DOUBLE_EQ(fused.bytes, 2 * 32 * 4 + 2 * 32) << "x and pre read (f32), both outputs written";
  EXPECT_DOUBLE_EQ(by_detail.at("fp8_cast: x [4, 8] → e5m2 ᵀ").bytes, 32 * 4 + 32);
  const OpTime& product = by_detail.at("fp8_matmul: out [4, 6] = a [4, 8] · bᵀ [6, 8] + addend");
  EXPECT_DOUBLE_EQ(product.flops, 2.0 * 4 * 6 * 8);
  EXPECT_EQ(product.bytes, 0.0);
}

TEST(TrainBenchmark, FlopsPerTokenFollowTheNanoGptConvention) {
  ModelConfig m;
  m.n_layer = 2;
  m.n_embd = 32;
  // 6·1000 for the weights, 12·2·16·32 = 12288 for attention.
  EXPECT_DOUBLE_EQ(model_flops_per_token(1000, m, 16), 18288.0);
}

TEST(TrainBenchmark, NumbersAgreeAndTheProfileCoversTheStep) {
  const RunConfig config = tiny_config("pope");
  TrainBenchOptions options;
  options.warmup_steps = 1;
  options.timed_steps = 3;
  options.profile = true;
  const TrainBenchResult r = run_train_benchmark(config, options);

  ASSERT_EQ(r.step_seconds.size(), 3u);
  EXPECT_EQ(r.accumulation, 2);
  EXPECT_EQ(r.tokens_per_step, 4 * 8);
  EXPECT_FALSE(r.on_gpu);
  EXPECT_FALSE(r.mfu.has_value());
  std::vector<double> sorted = r.step_seconds;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_DOUBLE_EQ(r.median_step_seconds, sorted[1]);
  EXPECT_DOUBLE_EQ(r.tokens_per_second, 32.0 / sorted[1]);
  EXPECT_NEAR(r.last_loss, std::log(61.0), 0.5) << "random tokens at initialisation";

  long attention_forward = 0, adamw = 0;
  double op_seconds = 0.0;
  for (const OpTime& t : r.profile) {
    if (t.op == "attention_forward") attention_forward += t.calls;
    if (t.op == "adamw") adamw += t.calls;
    op_seconds += t.seconds;
  }
  EXPECT_EQ(attention_forward, config.model.n_layer * r.accumulation) << "one call per layer and micro-batch";
  EXPECT_EQ(adamw, 1);
  EXPECT_LE(op_seconds, r.profiled_step_seconds) << "ops are timed inside the step";

  const nlohmann::json j = train_bench_to_json(r);
  EXPECT_EQ(j["step_seconds"].size(), 3u);
  EXPECT_TRUE(j["mfu_vs_790"].is_null());
  EXPECT_EQ(j["profile"]["ops"].size(), r.profile.size());
  EXPECT_NE(format_train_bench(r).find("| tokens/s |"), std::string::npos);
}

TEST(TrainBenchmark, RejectsBadOptions) {
  TrainBenchOptions options;
  options.timed_steps = 0;
  EXPECT_THROW(run_train_benchmark(tiny_config("rope"), options), ConfigError);
  options.timed_steps = 1;
  options.use_data = true;  // data.train is empty
  try {
    run_train_benchmark(tiny_config("rope"), options);
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.path(), "data.train");
  }
}

// The dump's loss and gradients are what a fresh model computes from the dump's own weights
// and batch: so the file holds the right slices under the right names.
TEST(StepDump, HoldsTheModelsLossAndGradientsForItsWeightsAndBatch) {
  const RunConfig config = tiny_config("pope");
  pope::testing::ScratchDir dir;
  write_step_dump(config, dir / "step.safetensors", 5);
  const SafetensorsContents dump = read_safetensors(dir / "step.safetensors");
  EXPECT_EQ(dump.metadata.at("format"), "pope-step-dump");
  EXPECT_EQ(dump.metadata.at("activation_dtype"), "f32");
  EXPECT_EQ(config_from_json(nlohmann::json::parse(dump.metadata.at("config"))).model.n_embd, 16);

  auto backend = make_cpu_backend("float", 1);
  Model model(config.model, *backend);
  const ParameterLayout& layout = model.layout();
  std::vector<float> params(static_cast<std::size_t>(layout.total_numel()), 0.0f);
  for (std::size_t i = 0; i < layout.specs().size(); ++i) {
    const SafetensorsTensor& t = dump.at(layout.specs()[i].name);
    ASSERT_EQ(t.shape, layout.specs()[i].shape) << t.name;
    const std::vector<float> v = values_of<float>(t);
    std::copy(v.begin(), v.end(), params.begin() + layout.offset(i));
  }
  EXPECT_NE(values_of<float>(dump.at("layers.0.attn_norm.weight"))[0], 1.0f) << "gains are jittered";
  model.parameters_from_host(params);

  const std::vector<std::int32_t> tokens = values_of<std::int32_t>(dump.at("tokens"));
  const std::vector<std::int32_t> targets = values_of<std::int32_t>(dump.at("targets"));
  ASSERT_EQ(dump.at("tokens").shape, (Shape{2, 8}));
  const long masked = std::count_if(targets.begin(), targets.end(), [](std::int32_t t) { return t < 0; });
  const long unmasked = long(targets.size()) - masked;
  ASSERT_GT(unmasked, 0);

  model.zero_gradients();
  const LossSum loss = model.forward_backward(tokens.data(), targets.data(), 2, 8, 1.0 / double(unmasked));
  EXPECT_EQ(loss.count, unmasked);
  EXPECT_FLOAT_EQ(values_of<float>(dump.at("loss"))[0], float(loss.mean()));
  const std::vector<float> grads = tensor_to_host_f32(*backend, model.gradients());
  for (std::size_t i = 0; i < layout.specs().size(); ++i) {
    const std::vector<float> dumped = values_of<float>(dump.at("grad." + layout.specs()[i].name));
    const std::vector<float> expected(grads.begin() + layout.offset(i),
                                      grads.begin() + layout.offset(i) + long(dumped.size()));
    EXPECT_EQ(dumped, expected) << layout.specs()[i].name;
  }
}
