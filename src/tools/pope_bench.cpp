// pope-bench: benchmarks. `train` times whole optimizer steps of a config's model and can dump
// one forward/backward for the PyTorch oracle (scripts/reference/torch_gpt.py); `attention`
// times the CUDA attention per encoding and sequence length; `sample` times generation;
// `matmul` times the linear layers' products in bf16 and in FP8.
// Exit codes: 0 done, 1 runtime/data error, 2 usage or config error.
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "pope/attention_bench.hpp"
#include "pope/bench.hpp"
#include "pope/checkpoint.hpp"
#include "pope/config.hpp"
#include "pope/matmul_bench.hpp"
#include "pope/position.hpp"
#include "tools/console_log.hpp"
#include "tools/enum_option.hpp"
#include "tools/number_checks.hpp"
#include "tools/output_file.hpp"
#include "tools/version.hpp"

namespace {

constexpr int kExitRuntime = 1;
constexpr int kExitConfig = 2;

// Options every timing mode shares: untimed calls first, then the timed ones (median reported),
// and --json.
void add_json_option(CLI::App* mode, std::string& json_path) {
  mode->add_option("--json", json_path, "also write the numbers as one JSON object to this file")
      ->check(pope::tools::kOutputFile);
}
void add_repeat_options(CLI::App* mode, int& warmup, int& repeats, int default_repeats, const std::string& untimed,
                        const std::string& per) {
  mode->add_option("--warmup", warmup, "untimed " + untimed + " first")
      ->default_val(5)
      ->check(pope::tools::integer_check(warmup, 0));
  mode->add_option("--repeats", repeats, "timed calls per " + per + " (median reported)")
      ->default_val(default_repeats)
      ->check(pope::tools::integer_check(repeats, 1));
}

struct TrainCommand {
  std::string config_path, device, dump_path, json_path;
  std::vector<std::string> overrides;
  pope::TrainBenchOptions options;
};

void add_train_command(CLI::App& app, TrainCommand& cmd) {
  CLI::App* train = app.add_subcommand(
      "train",
      "Time full optimizer steps (micro-batches × accumulation + clipping + AdamW) of the config's model on random "
      "tokens (fixed seed) and print tokens/s, ms/step, model TFLOP/s, MFU and device memory.");
  train->add_option("-c,--config", cmd.config_path, "JSON config file; a bare name resolves in configs/")->required();
  train->add_option("-s,--set", cmd.overrides,
                    "override a config key, e.g. --set train.micro_batch_size=32 "
                    "(repeatable); the step is train.batch_size sequences");
  train->add_option("--device", cmd.device, "auto | cpu | cuda (overrides train.device)")
      ->check(pope::tools::one_of_names<pope::DeviceChoice>());
  train->add_option("--steps", cmd.options.timed_steps, "timed optimizer steps (median reported)")
      ->default_val(10)
      ->check(pope::tools::integer_check(cmd.options.timed_steps, 1));
  train->add_option("--warmup", cmd.options.warmup_steps, "untimed steps first")
      ->default_val(3)
      ->check(pope::tools::integer_check(cmd.options.warmup_steps, 0));
  train->add_option("--seed", cmd.options.seed, "seed of the random tokens (and of --dump-step's jitter)")
      ->default_val(1337)
      ->check(pope::tools::integer_check(cmd.options.seed));
  train->add_flag("--data", cmd.options.use_data, "random windows of data.train instead of random tokens");
  train->add_flag("--profile", cmd.options.profile,
                  "then one more step with the time of every backend op: on the GPU its device time between two CUDA "
                  "events (nothing synchronised in between), on the CPU the host time of its call");
  add_json_option(train, cmd.json_path);
  train->add_option("--dump-step", cmd.dump_path,
                    "instead of timing: one forward/backward of a micro-batch, written as safetensors (weights, "
                    "tokens, targets, loss, grad.<name>) for scripts/reference/torch_gpt.py");
}

std::string joined(const std::vector<std::string>& names) {
  std::string text;
  for (const std::string& name : names) text += (text.empty() ? "" : ", ") + name;
  return text;
}

struct AttentionCommand {
  std::string json_path;
  std::string impl = "fused";  // fused | cudnn | both → options.impls
  pope::AttentionBenchOptions options;
};

void add_attention_command(CLI::App& app, AttentionCommand& cmd) {
  CLI::App* attention = app.add_subcommand(
      "attention",
      "Time the CUDA causal attention (q/k transform included) forward, backward and forward+backward per "
      "encoding and sequence length T at batch B = ⌊--tokens / T⌋ (median over --repeats calls per phase, the three phases' calls interleaved, CUDA events, "
      "after --warmup calls) and print ms and TFLOP/s (causal FLOPs: forward 2·B·H·(T²/2)·(qk_width + head_dim), backward 2.5× "
      "forward). Needs a CUDA device.");
  attention->add_option("--encodings", cmd.options.encodings,
                        "encodings to time: any model.position.kind (" + joined(pope::position_kinds()) +
                            "), or `all` for every one; the learned biases (PJ-bias methods, t5_bias) need "
                            "--head-dim 64 or 128, pj_rotary a head dim that 2(K + 1) divides")
      ->delimiter(',')
      ->default_str("nope,rope,pope,alibi,full,pj_rotary,xpos,t5_bias");
  attention->add_option("--lengths", cmd.options.lengths, "sequence lengths T, each ≤ --tokens")
      ->delimiter(',')
      ->check(pope::tools::integer_check(cmd.options.lengths, 1))
      ->default_str("1024,4096,10240,16384");
  attention->add_option("--tokens", cmd.options.tokens, "tokens per run: B = ⌊tokens / T⌋")->default_val(16384)->check(pope::tools::integer_check(cmd.options.tokens, 1));
  attention->add_option("--heads", cmd.options.n_head, "heads H")->default_val(12)->check(pope::tools::integer_check(cmd.options.n_head, 1));
  attention->add_option("--head-dim", cmd.options.head_dim, "head dimension d")->default_val(64)->check(pope::tools::integer_check(cmd.options.head_dim, 1));
  add_repeat_options(attention, cmd.options.warmup, cmd.options.repeats, 30, "forward+backward calls", "phase");
  add_json_option(attention, cmd.json_path);
  attention->add_option("--impl", cmd.impl,
                        "who computes the attention of the encoded q̃, k̃ (attention.impl): fused (ours), cudnn "
                        "(cuDNN's fused SDPA, encodings without a score bias only), or both, one row each per "
                        "encoding and T")
      ->check(CLI::IsMember({"fused", "cudnn", "both"}))
      ->default_val("fused");
  attention->add_flag("!--atomic-dq", cmd.options.deterministic,
                      "time the fused backward with dq̃ added atomically in the key kernel (not bitwise repeatable) "
                      "instead of the deterministic query kernel");
}

// Written atomically (temporary file, fsync, rename), so a reader never sees half a file.
void write_json(const std::string& path, const nlohmann::json& numbers) {
  pope::write_file_atomic(path, numbers.dump() + "\n");
}

int run_attention(const AttentionCommand& cmd) {
  pope::AttentionBenchOptions options = cmd.options;
  options.impls = cmd.impl == "both" ? std::vector{pope::AttentionImpl::fused, pope::AttentionImpl::cudnn}
                                     : std::vector{*pope::enum_from_name<pope::AttentionImpl>(cmd.impl)};
  const std::vector<pope::AttentionBenchRow> rows = pope::run_attention_benchmark(options);
  std::cout << pope::format_attention_bench(rows);
  if (!cmd.json_path.empty()) write_json(cmd.json_path, pope::attention_bench_to_json(rows));
  return 0;
}

int run_train(const TrainCommand& cmd) {
  std::vector<std::string> overrides = cmd.overrides;
  if (!cmd.device.empty()) overrides.push_back("train.device=" + cmd.device);
  const pope::RunConfig config = pope::load_config(cmd.config_path, overrides);
  if (!cmd.dump_path.empty()) {
    pope::write_step_dump(config, cmd.dump_path, cmd.options.seed);
    std::printf("wrote one forward/backward (%s, %d × %d tokens) to %s\n", config.model.position.kind.c_str(),
                config.train.micro_batch_size, config.train.seq_len, cmd.dump_path.c_str());
    return 0;
  }
  const pope::TrainBenchResult result = pope::run_train_benchmark(config, cmd.options);
  std::cout << pope::format_train_bench(result);
  if (!cmd.json_path.empty()) write_json(cmd.json_path, pope::train_bench_to_json(result));
  return 0;
}

struct SampleCommand {
  std::string config_path, device, json_path;
  std::vector<std::string> overrides;
  pope::SampleBenchOptions options;
};

void add_sample_command(CLI::App& app, SampleCommand& cmd) {
  CLI::App* sample = app.add_subcommand(
      "sample",
      "Time generation with the key/value cache (pope-sample's decode loop, greedy) of the config's model, "
      "initialised, on random prompt tokens: prefill and decode tokens/s.");
  sample->add_option("-c,--config", cmd.config_path, "JSON config file; a bare name resolves in configs/")->required();
  sample->add_option("-s,--set", cmd.overrides, "override a config key (repeatable)");
  sample->add_option("--device", cmd.device, "auto | cpu | cuda (overrides train.device)")
      ->check(pope::tools::one_of_names<pope::DeviceChoice>());
  sample->add_option("--batch", cmd.options.batch, "sequences decoded together (default 1)")
      ->check(pope::tools::integer_check(cmd.options.batch, 1, 4096));
  sample->add_option("--prompt-tokens", cmd.options.prompt_tokens, "prompt length (default 128)")
      ->check(pope::tools::integer_check(cmd.options.prompt_tokens, 1, 1 << 20));
  sample->add_option("--new-tokens", cmd.options.new_tokens, "decode steps (default 256)")
      ->check(pope::tools::integer_check(cmd.options.new_tokens, 1, 1 << 20));
  sample->add_option("--rounds", cmd.options.rounds, "timed generations after one untimed (median; default 3)")
      ->check(pope::tools::integer_check(cmd.options.rounds, 1, 1000));
  add_json_option(sample, cmd.json_path);
}

int run_sample(const SampleCommand& cmd) {
  std::vector<std::string> overrides = cmd.overrides;
  if (!cmd.device.empty()) overrides.push_back("train.device=" + cmd.device);
  const pope::RunConfig config = pope::load_config(cmd.config_path, overrides);
  const pope::SampleBenchResult result = pope::run_sample_benchmark(config, cmd.options);
  std::cout << pope::format_sample_bench(result);
  if (!cmd.json_path.empty()) write_json(cmd.json_path, pope::sample_bench_to_json(result));
  return 0;
}

struct MatmulCommand {
  std::string config_path, json_path;
  std::vector<std::string> overrides;
  pope::MatmulBenchOptions options;
};

void add_matmul_command(CLI::App& app, MatmulCommand& cmd) {
  CLI::App* matmul = app.add_subcommand(
      "matmul",
      "Time the products of the config's linear layers (qkv, attention output, MLP in and out: forward, input "
      "gradient, weight gradient, on train.micro_batch_size × train.seq_len rows) in bf16 as the training step runs "
      "them and in per-tensor scaled FP8 through cuBLASLt (e4m3 operands, e5m2 gradients), and the FP8 casts apart "
      "(median of CUDA event pairs, the phases interleaved). Needs a CUDA device with FP8 tensor cores (sm_89+).");
  matmul->add_option("-c,--config", cmd.config_path, "JSON config file; a bare name resolves in configs/")->required();
  matmul->add_option("-s,--set", cmd.overrides, "override a config key (repeatable)");
  add_repeat_options(matmul, cmd.options.warmup, cmd.options.repeats, 20, "rounds of every product", "product");
  add_json_option(matmul, cmd.json_path);
}

int run_matmul(const MatmulCommand& cmd) {
  const pope::RunConfig config = pope::load_config(cmd.config_path, cmd.overrides);
  const pope::MatmulBenchResult result = pope::run_matmul_benchmark(config, cmd.options);
  std::cout << pope::format_matmul_bench(result);
  if (!cmd.json_path.empty()) write_json(cmd.json_path, pope::matmul_bench_to_json(result));
  return 0;
}

}  // namespace

// Every model.position.kind once, a tab and what it is: the list the bench scripts and the
// PyTorch oracle's test loop over.
int run_encodings() {
  for (const std::string& kind : pope::position_kinds())
    std::cout << kind << '\t' << pope::position_kind_summary(kind) << '\n';
  std::cout.flush();
  return std::cout ? 0 : kExitRuntime;
}

int main(int argc, char** argv) {
  pope::tools::log_to_stderr("pope-bench");
  CLI::App app{"pope-bench: benchmarks of the pope trainer."};
  app.footer("Exit codes: 0 done, 1 data/runtime error, 2 usage or config error.");
  app.require_subcommand(1);
  TrainCommand train;
  add_train_command(app, train);
  AttentionCommand attention;
  add_attention_command(app, attention);
  SampleCommand sample;
  add_sample_command(app, sample);
  MatmulCommand matmul;
  add_matmul_command(app, matmul);
  app.add_subcommand("encodings",
                     "List every model.position.kind (aliases left out), one per line: the name, a tab, what it "
                     "is. Scripts that run every encoding read this list.");
  pope::tools::finish_cli(app, "pope-bench");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : kExitConfig;
  }

  try {
    if (app.got_subcommand("attention")) return run_attention(attention);
    if (app.got_subcommand("encodings")) return run_encodings();
    if (app.got_subcommand("sample")) return run_sample(sample);
    if (app.got_subcommand("matmul")) return run_matmul(matmul);
    return run_train(train);
  } catch (const pope::ConfigError& e) {
    spdlog::error("config error: {}", e.what());
    return kExitConfig;
  } catch (const std::bad_alloc&) {
    spdlog::error("{}", pope::tools::kOutOfMemory);
    return kExitRuntime;
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    return kExitRuntime;
  }
}
