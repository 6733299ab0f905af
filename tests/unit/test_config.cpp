#include <gtest/gtest.h>

#include <cstdlib>  // mkdtemp
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "config/config_schema.hpp"
#include "pope/config.hpp"
#include "pope/model.hpp"
#include "pope/position.hpp"

using namespace pope;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

// Runs `action`, expects a ConfigError at `path` whose message contains every fragment.
void expect_config_error(const std::function<void()>& action, const std::string& path,
                         const std::vector<std::string>& fragments) {
  try {
    action();
    ADD_FAILURE() << "expected a ConfigError at " << path;
  } catch (const ConfigError& error) {
    EXPECT_EQ(error.path(), path) << error.what();
    for (const std::string& fragment : fragments) {
      EXPECT_NE(std::string(error.what()).find(fragment), std::string::npos)
          << "'" << fragment << "' missing from: " << error.what();
    }
  }
}

void expect_json_error(const json& config, const std::string& path, const std::vector<std::string>& fragments) {
  expect_config_error([&] { config_from_json(config, "test.json"); }, path, fragments);
}

void expect_invalid(const std::function<void(RunConfig&)>& change, const std::string& path,
                    const std::vector<std::string>& fragments) {
  RunConfig config;
  change(config);
  expect_config_error([&] { validate(config); }, path, fragments);
}

fs::path shipped(const std::string& name) { return fs::path(POPE_SOURCE_DIR) / "configs" / (name + ".json"); }

// Every leaf of a JSON object as a dotted path.
void collect_leaf_paths(const json& object, const std::string& prefix, std::vector<std::string>& out) {
  for (const auto& [key, value] : object.items()) {
    const std::string path = prefix.empty() ? key : prefix + "." + key;
    if (value.is_object()) {
      collect_leaf_paths(value, path, out);
    } else {
      out.push_back(path);
    }
  }
}

// A fresh directory under the system temp dir, made the working directory for the
// test's lifetime (both undone on destruction).
class ScratchDirectory {
 public:
  ScratchDirectory() : previous_(fs::current_path()) {
    std::string pattern = (fs::temp_directory_path() / "pope_test_config_XXXXXX").string();
    root_ = mkdtemp(pattern.data());
    fs::current_path(root_);
  }
  ~ScratchDirectory() {
    fs::current_path(previous_);
    fs::remove_all(root_);
  }
  const fs::path& root() const { return root_; }
  void write(const fs::path& relative, const std::string& text) const {
    fs::create_directories((root_ / relative).parent_path());
    std::ofstream(root_ / relative) << text;
  }

 private:
  fs::path previous_;
  fs::path root_;
};

}  // namespace

TEST(Config, ErrorMessageIsPathThenMessage) {
  ConfigError error("model.n_head", "expected an integer");
  EXPECT_STREQ(error.what(), "model.n_head: expected an integer");
  EXPECT_EQ(error.path(), "model.n_head");
}

TEST(Config, DefaultsRoundTripThroughJson) {
  const json defaults = config_to_json(RunConfig{});
  EXPECT_EQ(config_to_json(config_from_json(defaults)), defaults);
  // A missing key takes the struct default.
  EXPECT_EQ(config_to_json(config_from_json(json::object())), defaults);
  EXPECT_EQ(defaults["model"]["position"]["pope"]["delta_init"], "zero");
  EXPECT_EQ(defaults["model"]["position"]["pope"]["delta_bound"], "clamp");
  EXPECT_EQ(defaults["train"]["seed"], 1337u);
}

TEST(Config, NonDefaultValuesRoundTrip) {
  RunConfig config;
  config.model.position.kind = "rope";
  config.model.position.rope.scaling.kind = RopeScalingKind::yarn;
  config.model.position.rope.scaling.factor = 4.0;
  config.model.position.pope.learn_delta = false;
  config.model.position.pope.delta_bound = DeltaBound::none;
  config.optim.lr = 3e-4;
  config.train.steps = 5'000'000'000L;
  config.train.seed = 18'000'000'000'000'000'000ull;  // above INT64_MAX: needs the unsigned path
  config.out_dir = "runs/x";
  const RunConfig back = config_from_json(config_to_json(config));
  EXPECT_EQ(back.model.position.kind, "rope");
  EXPECT_EQ(back.model.position.rope.scaling.kind, RopeScalingKind::yarn);
  EXPECT_EQ(back.model.position.rope.scaling.factor, 4.0);
  EXPECT_FALSE(back.model.position.pope.learn_delta);
  EXPECT_EQ(back.model.position.pope.delta_bound, DeltaBound::none);
  EXPECT_EQ(back.optim.lr, 3e-4);
  EXPECT_EQ(back.train.steps, 5'000'000'000L);
  EXPECT_EQ(back.train.seed, 18'000'000'000'000'000'000ull);
  EXPECT_EQ(back.out_dir, "runs/x");
  EXPECT_EQ(config_to_json(back), config_to_json(config));
}

TEST(Config, ShippedConfigsLoadAndValidate) {
  struct Expected {
    std::string name;
    int n_embd, n_head, n_layer, micro_batch_size;
  };
  for (const Expected& e : std::vector<Expected>{{"owt_124m", 768, 12, 12, 32},
                                                 {"owt_253m", 1024, 16, 16, 16},
                                                 {"owt_774m", 1280, 20, 36, 16}}) {
    SCOPED_TRACE(e.name);
    const RunConfig config = load_config(shipped(e.name));
    validate(config);
    EXPECT_EQ(config.model.n_embd, e.n_embd);
    EXPECT_EQ(config.model.n_head, e.n_head);
    EXPECT_EQ(config.model.n_layer, e.n_layer);
    EXPECT_EQ(config.model.head_dim(), 64);
    EXPECT_EQ(config.model.context_length, 1024);
    EXPECT_EQ(config.model.position.kind, "pope");
    EXPECT_EQ(config.model.position.pope.delta_init, DeltaInit::zero);
    EXPECT_EQ(config.optim.lr, 6e-4);
    EXPECT_EQ(config.optim.min_lr, 6e-5);
    EXPECT_EQ(config.optim.warmup_steps, 1000);
    EXPECT_EQ(config.optim.beta2, 0.95);
    EXPECT_EQ(config.optim.weight_decay, 0.01);
    EXPECT_EQ(config.optim.grad_clip, 1.0);
    EXPECT_EQ(config.train.steps, 100000);
    EXPECT_EQ(config.train.batch_size, 64);
    EXPECT_EQ(config.train.seq_len, 1024);
    EXPECT_EQ(config.train.micro_batch_size, e.micro_batch_size);
    EXPECT_EQ(config.grad_accumulation(1) * e.micro_batch_size, 64);
    EXPECT_EQ(config.data.train, "data/owt/train.bin");
    EXPECT_EQ(config.data.val, "data/owt/val.bin");
  }
  const RunConfig small = load_config(shipped("small_cpu"));
  validate(small);
  EXPECT_EQ(small.model.n_embd, 128);
  EXPECT_EQ(small.train.steps, 150);
  EXPECT_EQ(small.grad_accumulation(1), 1);
  EXPECT_EQ(small.data.train, "data/demo/train.bin");
}

TEST(Config, UnknownKeysAreRejectedAtAnyDepth) {
  expect_json_error({{"model", {{"position", {{"pope", {{"delta_int", "zero"}}}}}}}},
                    "model.position.pope.delta_int", {"unknown key", "delta_init", "test.json"});
  expect_json_error({{"trian", {{"steps", 10}}}}, "trian", {"unknown key", "the top level", "train"});
  // A dotted key must not alias the nested one.
  expect_json_error({{"model.n_head", 8}}, "model.n_head",
                    {"unknown key", "a config file nests its sections: write \"model\": {\"n_head\": ...}"});
  expect_json_error({{"model", 3}}, "model", {"is a section", "n_head", "3 (an integer)"});
  expect_json_error(json::array(), "<root>", {"expected a JSON object"});
}

// A typo in a key (--set optim.lrr=1, "modle" in a file) is answered with the keys spelled close
// to it, or ending in the same key; a key spelled like none is not given a guess.
TEST(Config, UnknownKeysSuggestCloseSpellings) {
  json config = json::object();
  expect_config_error([&] { apply_override(config, "optim.lrr=1"); }, "optim.lrr",
                      {"unknown key (did you mean optim.lr?)", "the keys of optim are lr, min_lr", "optim.lrr=1"});
  expect_config_error([&] { apply_override(config, "trian.steps=3"); }, "trian.steps",
                      {"did you mean train.steps?", "the keys of the top level are model"});
  expect_config_error([&] { apply_override(config, "train.lr=3"); }, "train.lr", {"did you mean optim.lr?"});
  expect_config_error([&] { apply_override(config, "optim.beta=0.9"); }, "optim.beta",
                      {"did you mean optim.beta1 or optim.beta2?"});
  expect_json_error({{"optim", {{"lrr", 1}}}}, "optim.lrr", {"did you mean optim.lr?", "test.json"});
  expect_json_error({{"modle", {{"n_head", 8}}}}, "modle", {"did you mean model?", "the keys of the top level"});
  for (const char* far : {"optim.zzzzzz=1", "optim.x=1", "qqqq.zzzz=1"}) {
    try {
      apply_override(config, far);
      ADD_FAILURE() << far << " was accepted";
    } catch (const ConfigError& error) {
      EXPECT_EQ(std::string(error.what()).find("did you mean"), std::string::npos) << error.what();
      EXPECT_NE(std::string(error.what()).find("unknown key"), std::string::npos) << error.what();
    }
  }
}

// A section given a value (--set optim=3, "optim": 3) is said to be one, with its keys.
TEST(Config, SectionsGivenAValueListTheirKeys) {
  json config = json::object();
  expect_config_error([&] { apply_override(config, "optim=3"); }, "optim",
                      {"is a section (keys: lr, min_lr,", "set optim.<key>"});
  expect_config_error([&] { apply_override(config, "model.position=rope"); }, "model.position",
                      {"is a section (keys: kind,", "set model.position.<key>"});
  expect_json_error({{"optim", 3}}, "optim",
                    {"is a section (keys: lr, min_lr,", "found 3 (an integer)", "set optim.<key>", "test.json"});
}

TEST(Config, WrongTypesNameThePathAndTheExpectedType) {
  expect_json_error({{"model", {{"n_head", "twelve"}}}}, "model.n_head",
                    {"expected an integer", "\"twelve\" (a string)", "test.json"});
  expect_json_error({{"model", {{"n_head", 12.5}}}}, "model.n_head", {"expected an integer", "12.5"});
  expect_json_error({{"model", {{"n_head", 1e12}}}}, "model.n_head", {"expected an integer"});
  expect_json_error({{"model", {{"n_head", 1LL << 40}}}}, "model.n_head", {"in [-2147483648, 2147483647]"});
  expect_json_error({{"train", {{"seed", -1}}}}, "train.seed", {"expected a non-negative integer", "-1"});
  expect_json_error({{"optim", {{"lr", true}}}}, "optim.lr", {"expected a number", "true (a boolean)"});
  expect_json_error({{"model", {{"position", {{"kind", 3}}}}}}, "model.position.kind", {"expected a string"});
  expect_json_error({{"model", {{"position", {{"pope", {{"learn_delta", "no"}}}}}}}},
                    "model.position.pope.learn_delta", {"expected true or false"});
  // Integers are valid numbers for floating-point keys.
  EXPECT_EQ(config_from_json({{"optim", {{"grad_clip", 2}}}}).optim.grad_clip, 2.0);
}

TEST(Config, OutOfRangeValuesAreRejected) {
  expect_json_error({{"model", {{"n_head", 0}}}}, "model.n_head",
                    {"expected an integer in [1, 65536], found 0", "test.json"});
  expect_invalid([](RunConfig& c) { c.optim.beta2 = 1.0; }, "optim.beta2", {"in [0, 1)", "found 1"});
  expect_invalid([](RunConfig& c) { c.model.position.rope.fraction = 0.0; }, "model.position.rope.fraction",
                 {"in (0, 1]"});
  expect_invalid([](RunConfig& c) { c.optim.eps = 0.0; }, "optim.eps", {"in (0, 1]"});
  expect_invalid([](RunConfig& c) { c.optim.lr = -1e-3; }, "optim.lr", {"in (0, 10]"});
  expect_invalid([](RunConfig& c) { c.model.position.rope.scaling.factor = 0.5; },
                 "model.position.rope.scaling.factor", {">= 1"});
  expect_invalid([](RunConfig& c) { c.train.keep_checkpoints = 0; }, "train.keep_checkpoints", {">= 1"});
  expect_invalid([](RunConfig& c) { c.train.zero_stage = 2; }, "train.zero_stage", {"found 2"});
  expect_invalid([](RunConfig& c) { c.train.ddp_bucket_mb = -1; }, "train.ddp_bucket_mb", {"in [0, 1048576]"});
}

// optim.lr = 1e300 trained to infinite weights and checkpointed them; every optimizer and
// initialisation number is bounded to what can train.
TEST(Config, TrainingNumbersAreBoundedToWhatTrains) {
  expect_invalid([](RunConfig& c) { c.optim.lr = 1e300; }, "optim.lr", {"in (0, 10], found 1e+300"});
  expect_invalid([](RunConfig& c) { c.optim.lr = 0; }, "optim.lr", {"in (0, 10]"});
  expect_invalid([](RunConfig& c) { c.optim.min_lr = 11; }, "optim.min_lr", {"in [0, 10]"});
  expect_invalid([](RunConfig& c) { c.optim.eps = 2; }, "optim.eps", {"in (0, 1]"});
  expect_invalid([](RunConfig& c) { c.model.norm_eps = 1e10; }, "model.norm_eps", {"in (0, 1]"});
  expect_invalid([](RunConfig& c) { c.model.init_std = 1e200; }, "model.init_std", {"in (0, 1]"});
  expect_invalid([](RunConfig& c) { c.optim.weight_decay = 11; }, "optim.weight_decay", {"in [0, 10]"});
  expect_invalid([](RunConfig& c) { c.model.position.rope.scaling.yarn_temperature = 1e9; },
                 "model.position.rope.scaling.yarn_temperature", {"in [0, 10]"});
  // Decoupled decay by a factor 1 − lr·wd of at most 0 zeroes or flips the weights.
  expect_invalid([](RunConfig& c) { c.optim.lr = 1, c.optim.weight_decay = 1; }, "optim.weight_decay",
                 {"× optim.weight_decay below 1", "found 1"});
  RunConfig bounds;
  bounds.optim.lr = 10;
  bounds.optim.min_lr = 0;
  bounds.optim.weight_decay = 0.09;
  bounds.model.init_std = 1;
  EXPECT_NO_THROW(validate(bounds));
}

// train.steps=1e3 is a thousand steps: whole numbers in floating-point form are integers.
TEST(Config, WholeNumbersWrittenAsFloatsAreIntegers) {
  json config = json::object();
  apply_override(config, "train.steps=1e3");
  apply_override(config, "model.n_head=12.0");
  apply_override(config, "train.seed=9007199254740992.0");  // 2^53
  const RunConfig parsed = config_from_json(config);
  EXPECT_EQ(parsed.train.steps, 1000);
  EXPECT_EQ(parsed.model.n_head, 12);
  EXPECT_EQ(parsed.train.seed, 9007199254740992ull);
  expect_json_error({{"train", {{"steps", 1e3 + 0.5}}}}, "train.steps", {"expected an integer, found 1000.5"});
  expect_json_error({{"train", {{"seed", 1e19}}}}, "train.seed", {"write integers beyond 2^53 in digits"});
  expect_json_error({{"train", {{"seed", -1.0}}}}, "train.seed", {"expected a non-negative integer in [0, "});
  expect_json_error({{"model", {{"n_head", 3e9}}}}, "model.n_head", {"in [-2147483648, 2147483647]", "3000000000"});
}

// Without upper bounds, 2^31 − 1 layers hung a dry run, a width of 2^30 wrapped the parameter
// count, 100,000 threads crashed libgomp and a window of 2^31 − 1 tokens overflowed at run time.
TEST(Config, SizeKeysHaveUpperBounds) {
  struct Bound {
    std::string section, key;
    long max;
  };
  for (const Bound& bound : std::vector<Bound>{{"model", "vocab_size", 1L << 24},
                                               {"model", "padded_vocab_size", 1L << 24},
                                               {"model", "n_layer", 1024},
                                               {"model", "n_head", 65536},
                                               {"model", "n_embd", 65536},
                                               {"model", "context_length", 1L << 20},
                                               {"train", "batch_size", 1L << 20},
                                               {"train", "micro_batch_size", 1L << 20},
                                               {"train", "seq_len", 1L << 20},
                                               {"train", "threads", 1024}}) {
    const std::string path = bound.section + "." + bound.key;
    SCOPED_TRACE(path);
    const std::string range_end = ", " + std::to_string(bound.max) + "], found ";
    expect_json_error({{bound.section, {{bound.key, bound.max + 1}}}}, path,
                      {range_end + std::to_string(bound.max + 1), "test.json"});
    expect_json_error({{bound.section, {{bound.key, 2147483647}}}}, path, {range_end + "2147483647"});
  }
  expect_invalid([](RunConfig& c) { c.train.ddp_bucket_mb = 1e300; }, "train.ddp_bucket_mb", {"in [0, 1048576]"});
  // The limits themselves are allowed (0 threads: all cores).
  for (int threads : {0, 1024}) {
    EXPECT_EQ(config_from_json({{"train", {{"threads", threads}}}}).train.threads, threads);
  }
  EXPECT_EQ(config_from_json({{"model", {{"n_layer", 1024}}}}).model.n_layer, 1024);
  EXPECT_EQ(config_from_json({{"train", {{"ddp_bucket_mb", 1048576}}}}).train.ddp_bucket_mb, 1048576.0);
  const RunConfig long_window =
      config_from_json({{"train", {{"seq_len", 1 << 20}, {"batch_size", 1}, {"micro_batch_size", 1}}}});
  EXPECT_EQ(long_window.train.seq_len, 1 << 20);
}

// Sizes that are each in range can still multiply past what the trainer counts in: the
// parameter count (about 5·10^13 at the largest widths and depths) and a step's tokens.
TEST(Config, ParameterCountAndTokensPerStepAreBounded) {
  const auto wide = [](RunConfig& c, int n_layer) {
    c.model.n_embd = 65536;
    c.model.n_head = 1024;
    c.model.n_layer = n_layer;
  };
  // 12·65536² ≈ 5.2·10^10 per layer: 21 layers fit under 2^40, 22 do not.
  RunConfig fits;
  wide(fits, 21);
  EXPECT_NO_THROW(validate(fits));
  expect_invalid([&](RunConfig& c) { wide(c, 22); }, "model.n_embd",
                 {"at most 2^40 = 1099511627776 parameters", "model.n_layer (22)", "model.n_embd (65536)",
                  "model.vocab_size (50257)"});
  expect_invalid([&](RunConfig& c) { wide(c, 1024); }, "model.n_embd", {"found 52780053168128"});
  // The embedding alone: 2^24 rows × 2^16 = 2^40, plus the layer.
  expect_invalid(
      [&](RunConfig& c) {
        wide(c, 1);
        c.model.vocab_size = c.model.padded_vocab_size = 1 << 24;
      },
      "model.n_embd", {"model.vocab_size (16777216)"});

  const auto tokens = [](RunConfig& c, int batch) {
    c.train.seq_len = 1 << 20;
    c.train.batch_size = c.train.micro_batch_size = batch;
  };
  RunConfig most_tokens;
  tokens(most_tokens, 2047);
  EXPECT_NO_THROW(validate(most_tokens));
  expect_invalid([&](RunConfig& c) { tokens(c, 2048); }, "train.seq_len",
                 {"train.batch_size (2048) × train.seq_len (1048576)", "at most 2^31 − 1 = 2147483647",
                  "found 2147483648"});
}

// The bound is checked on config_schema::parameter_count, which must be count_parameters
// without laying out every layer.
TEST(Config, ValidationCountsParametersLikeCountParameters) {
  std::vector<RunConfig> configs;
  for (const char* name : {"owt_124m", "owt_774m", "small_cpu", "indirect_indexing_alibi_half"}) {
    configs.push_back(load_config(shipped(name)));
  }
  for (const char* kind : {"nope", "rope", "alibi", "pj_rotary", "full", "rope_affine"}) {
    RunConfig config;
    config.model.position.kind = kind;
    configs.push_back(config);
  }
  RunConfig no_delta;
  no_delta.model.position.pope.learn_delta = false;
  configs.push_back(no_delta);
  for (const RunConfig& config : configs) {
    const ModelConfig& model = config.model;
    SCOPED_TRACE(model.position.kind + ", " + std::to_string(model.n_layer) + " layers");
    const auto position = make_position_encoding(model);
    const std::int64_t expected = count_parameters(model, build_parameter_layout(model, *position));
    EXPECT_EQ(config_schema::parameter_count(model), double(expected));
  }
}

TEST(Config, CrossFieldRules) {
  expect_invalid([](RunConfig& c) { c.model.n_embd = 770; }, "model.n_embd", {"multiple of model.n_head (12)"});
  expect_invalid([](RunConfig& c) { c.model.n_embd = 780; }, "model.n_embd", {"even head dim", "65"});
  expect_invalid([](RunConfig& c) { c.model.padded_vocab_size = 50000; }, "model.padded_vocab_size",
                 {"at least model.vocab_size (50257)"});
  expect_invalid([](RunConfig& c) { c.optim.min_lr = 1e-3; }, "optim.min_lr", {"at most optim.lr"});
  expect_invalid([](RunConfig& c) { c.train.micro_batch_size = 24; }, "train.batch_size", {"multiple of"});
  expect_invalid([](RunConfig& c) { c.model.position.rope.scaling.yarn_beta = 1.0; },
                 "model.position.rope.scaling.yarn_beta", {"more than yarn_alpha"});
  expect_invalid(
      [](RunConfig& c) {
        c.model.position.kind = "rope";
        c.model.position.rope.fraction = 0.3;  // 19.2 channels of 64
      },
      "model.position.rope.fraction", {"even whole number"});
  expect_invalid(
      [](RunConfig& c) {
        c.model.position.kind = "alibi";
        c.model.position.alibi.head_fraction = 0.3;  // 3.6 heads of 12
      },
      "model.position.alibi.head_fraction", {"whole number of heads"});

  // Windows longer than L_train: an error for plain RoPE only.
  expect_invalid(
      [](RunConfig& c) {
        c.model.position.kind = "rope";
        c.train.seq_len = 4096;
      },
      "train.seq_len", {"at most model.context_length (1024)"});
  RunConfig long_window;
  long_window.train.seq_len = 4096;
  for (const char* kind : {"pope", "nope", "alibi"}) {
    long_window.model.position.kind = kind;
    EXPECT_NO_THROW(validate(long_window)) << kind;
  }
  long_window.model.position.kind = "rope";
  long_window.model.position.rope.scaling.kind = RopeScalingKind::yarn;
  long_window.model.position.rope.scaling.factor = 4.0;
  EXPECT_NO_THROW(validate(long_window));
  RunConfig half_rope;
  half_rope.model.position.kind = "rope";
  half_rope.model.position.rope.fraction = 0.5;
  EXPECT_NO_THROW(validate(half_rope));
}

// attention.impl = cudnn: cuDNN's SDPA takes no score bias, runs on the GPU only, and takes head
// dims that are multiples of 8 with q/k rows of at most 256.
TEST(Config, CudnnAttentionImplIsCheckedAgainstEncodingDeviceAndWidth) {
  for (const std::string kind : {"nope", "rope", "rope_yarn", "pope", "pj_rotary"}) {
    RunConfig config;
    config.attention.impl = AttentionImpl::cudnn;
    config.model.position.kind = kind;
    EXPECT_NO_THROW(validate(config)) << kind;
  }
  for (const std::string kind : {"alibi", "full", "affine", "rope_affine"}) {
    expect_invalid(
        [&](RunConfig& c) {
          c.attention.impl = AttentionImpl::cudnn;
          c.model.position.kind = kind;
        },
        "attention.impl", {"expected fused", "model.position.kind " + kind, "score bias", "cuDNN"});
  }
  expect_invalid(
      [](RunConfig& c) {
        c.attention.impl = AttentionImpl::cudnn;
        c.train.device = DeviceChoice::cpu;
      },
      "attention.impl", {"expected fused", "train.device cpu"});
  expect_invalid(
      [](RunConfig& c) {
        c.attention.impl = AttentionImpl::cudnn;
        c.model.n_head = 3;  // PoPE at head dim 256: q/k rows of 512
      },
      "attention.impl", {"head dim 256", "q/k width 512"});
  RunConfig fused_on_cpu;
  fused_on_cpu.model.position.kind = "alibi";
  fused_on_cpu.train.device = DeviceChoice::cpu;
  EXPECT_NO_THROW(validate(fused_on_cpu));
}

TEST(Config, BadEnumListsTheAllowedValues) {
  expect_json_error({{"model", {{"position", {{"kind", "popee"}}}}}}, "model.position.kind",
                    {"expected one of nope, none, rope, pope, alibi, rope_pi", "\"popee\""});
  expect_json_error({{"train", {{"device", "gpu"}}}}, "train.device", {"expected one of auto, cpu, cuda", "\"gpu\""});
  expect_json_error({{"optim", {{"schedule", "step"}}}}, "optim.schedule", {"cosine, linear, constant"});
  expect_json_error({{"attention", {{"impl", "flash"}}}}, "attention.impl", {"expected one of fused, cudnn"});
  expect_json_error({{"model", {{"position", {{"pope", {{"delta_bound", "wrap"}}}}}}}},
                    "model.position.pope.delta_bound", {"expected one of clamp, none, project", "\"wrap\""});
  expect_json_error({{"optim", {{"schedule", 3}}}}, "optim.schedule", {"expected a string"});
}

// Every key that takes names refuses any other name, listing its names, and the names it
// accepts round-trip through JSON unchanged.
TEST(Config, RefusesUnknownNames) {
  int named = 0;
  for (const config_schema::Field& field : config_schema::fields()) {
    const std::vector<std::string_view> names = config_schema::allowed_names(field);
    if (names.empty() || field.path == "model.position.kind") continue;
    ++named;
    json bad = config_to_json(RunConfig{});
    bad[config_schema::pointer_to(field.path)] = "no_such_name";
    std::vector<std::string> fragments{"\"no_such_name\""};
    for (std::string_view name : names) fragments.emplace_back(name);
    expect_json_error(bad, std::string(field.path), fragments);
    for (std::string_view name : names) {
      json good = config_to_json(RunConfig{});
      good[config_schema::pointer_to(field.path)] = std::string(name);
      try {
        EXPECT_EQ(config_to_json(config_from_json(good))[config_schema::pointer_to(field.path)], std::string(name));
      } catch (const ConfigError& e) {
        // A name may conflict with the defaults of other keys; it must not be refused as unknown.
        EXPECT_EQ(e.message().find("expected one of"), std::string::npos) << field.path << ": " << e.what();
      }
    }
  }
  EXPECT_GE(named, 10);
}

TEST(Config, OverridesSetNestedKeysOfEveryType) {
  json config = json::parse(R"({"model": {"n_head": 12}})");
  apply_override(config, "model.position.kind=rope");  // unquoted: a plain string
  apply_override(config, "optim.lr=3e-4");
  apply_override(config, "model.n_head=8");
  apply_override(config, "data.train=\"a b.bin\"");
  apply_override(config, "model.position.pope.learn_delta=false");
  apply_override(config, "out_dir=runs/with=sign");  // only the first '=' separates
  const RunConfig parsed = config_from_json(config);
  EXPECT_EQ(parsed.model.position.kind, "rope");
  EXPECT_EQ(parsed.optim.lr, 3e-4);
  EXPECT_EQ(parsed.model.n_head, 8);
  EXPECT_EQ(parsed.data.train, "a b.bin");
  EXPECT_FALSE(parsed.model.position.pope.learn_delta);
  EXPECT_EQ(parsed.out_dir, "runs/with=sign");
}

TEST(Config, BadOverridesAreRejected) {
  json config = json::object();
  expect_config_error([&] { apply_override(config, "model.n_heads=8"); }, "model.n_heads",
                      {"unknown key", "model.n_heads=8"});
  expect_config_error([&] { apply_override(config, "model=3"); }, "model", {"is a section"});
  expect_config_error([&] { apply_override(config, "model.n_head"); }, "model.n_head", {"a.b.c=value"});
  json not_a_section = {{"model", 3}};
  expect_config_error([&] { apply_override(not_a_section, "model.n_head=8"); }, "model", {"expected an object"});
  // The type is checked when the JSON is parsed.
  apply_override(config, "model.n_head=abc");
  expect_json_error(config, "model.n_head", {"expected an integer", "\"abc\" (a string)"});
  // A number beyond a double is said to be one, not read as the string "1e400".
  expect_config_error([&] { apply_override(config, "optim.lr=1e400"); }, "optim.lr",
                      {"1e400 is outside the range of a double"});
}

// A path given through --set is taken as it is; bytes that are not UTF-8 were found only when
// the resolved config was dumped, as a json type error naming neither the key nor the file.
TEST(Config, StringsThatAreNotUtf8AreRefusedNamingTheKey) {
  const auto with_train = [](const std::string& value) {
    json config = json::object();
    apply_override(config, "data.train=" + value);
    return config;
  };
  expect_json_error(with_train("\xff\xfe.bin"), "data.train", {"expected UTF-8 text", "0xFF at offset 0", "test.json"});
  expect_json_error(with_train("runs/\xc0\xaf"), "data.train", {"0xC0 at offset 5"});  // overlong '/'
  expect_json_error(with_train("\xed\xa0\x80"), "data.train", {"0xA0 at offset 1"});  // a surrogate
  expect_json_error(with_train("caf\xc3"), "data.train", {"ends inside a multi-byte character"});
  const RunConfig accepted = config_from_json(with_train("d\xc3\xa9j\xc3\xa0/\xe6\x97\xa5/\xf0\x9f\x98\x80.bin"));
  EXPECT_EQ(accepted.data.train, "d\xc3\xa9j\xc3\xa0/\xe6\x97\xa5/\xf0\x9f\x98\x80.bin");
  EXPECT_NO_THROW((void)config_to_json(accepted).dump());
  ScratchDirectory scratch;
  scratch.write("run.json", "{}");
  expect_config_error([] { load_config("run.json", {"out_dir=\xff"}); }, "out_dir",
                      {"expected UTF-8 text", "run.json with --set overrides"});
}

TEST(Config, LoadConfigAppliesOverridesAndReportsFileErrors) {
  ScratchDirectory scratch;
  scratch.write("run.json", R"({"model": {"n_layer": 2}, "train": {"steps": 7}})");
  const RunConfig config = load_config("run.json", {"train.steps=9", "model.position.kind=nope"});
  EXPECT_EQ(config.model.n_layer, 2);
  EXPECT_EQ(config.train.steps, 9);
  EXPECT_EQ(config.model.position.kind, "nope");
  expect_config_error([] { load_config("run.json", {"model.n_layer=0"}); }, "model.n_layer",
                      {"run.json with --set overrides"});

  scratch.write("broken.json", "{\n  \"model\": {\n    \"n_layer\": 2,\n  }\n}\n");
  expect_config_error([] { load_config("broken.json"); }, "broken.json", {"invalid JSON", "line 4"});
  expect_config_error([] { load_config("missing_dir/none.json"); }, "missing_dir/none.json", {"not found"});
  scratch.write("overflow.json", R"({"model": {"n_layer": 1e400}})");  // no double holds it
  expect_config_error([] { load_config("overflow.json"); }, "overflow.json", {"invalid JSON", "1e400"});
  std::filesystem::create_directory("a_directory");
  expect_config_error([] { load_config("a_directory"); }, "a_directory", {"is a directory", "JSON file"});

  // A key named twice in one object (nlohmann would keep the last silently), at any depth.
  scratch.write("twice.json", R"({"optim": {"lr": 0.001, "min_lr": 0.0001, "lr": 0.002}})");
  expect_config_error([] { load_config("twice.json"); }, "optim.lr", {"appears twice in", "twice.json"});
  scratch.write("twice_top.json", R"({"out_dir": "a", "train": {"steps": 3}, "out_dir": "b"})");
  expect_config_error([] { load_config("twice_top.json"); }, "out_dir", {"appears twice"});
  // Equal keys in different objects are not twice.
  scratch.write("apart.json", R"({"model": {"n_layer": 2}, "train": {"steps": 3}, "data": {"train": "x.bin"}})");
  EXPECT_EQ(load_config("apart.json").data.train, "x.bin");
}

// 100,000 nested arrays segfaulted where the value was quoted in the type error; a config
// nests 4 levels, so anything past kMaxJsonDepth is refused before it is parsed.
TEST(Config, DeeplyNestedValuesAreRefusedNamingFileOrKey) {
  ScratchDirectory scratch;
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  scratch.write("deep.json", R"({"model": {"n_head": )" + deep + "}}");
  expect_config_error([] { load_config("deep.json"); }, "deep.json",
                      {"invalid JSON", "nested deeper than 64 levels", "line 1"});
  json config = json::object();
  expect_config_error([&] { apply_override(config, "model.n_head=" + deep); }, "model.n_head",
                      {"nested at most 64 levels deep"});
  // Up to the bound a value is parsed and refused as the wrong type, quoted shortened.
  apply_override(config, "model.n_head=" + std::string(64, '[') + std::string(64, ']'));
  expect_json_error(config, "model.n_head", {"expected an integer", "(an array)"});
}

TEST(Config, BareNamesResolveToConfigsDirectories) {
  ScratchDirectory scratch;
  scratch.write("configs/mine.json", "{}");
  scratch.write("plain.json", "{}");
  EXPECT_EQ(resolve_config_path("plain"), fs::path("plain.json"));  // as given, plus ".json"
  EXPECT_TRUE(fs::equivalent(resolve_config_path("mine"), scratch.root() / "configs/mine.json"));
  EXPECT_TRUE(fs::equivalent(resolve_config_path("mine.json"), scratch.root() / "configs/mine.json"));
  // From below, the search walks up to the configs/ directory.
  fs::create_directories(scratch.root() / "build/deep");
  fs::current_path(scratch.root() / "build/deep");
  EXPECT_TRUE(fs::equivalent(resolve_config_path("mine"), scratch.root() / "configs/mine.json"));
  // Names with a directory part are never searched for.
  expect_config_error([] { resolve_config_path("sub/mine"); }, "sub/mine", {"not found"});
  expect_config_error([] { resolve_config_path("no_such_config"); }, "no_such_config",
                      {"not found", "configs/no_such_config.json"});
}

TEST(Config, BareNamesFallBackToTheExecutablesSourceTree) {
  const std::string source = fs::weakly_canonical(POPE_SOURCE_DIR).string();
  const std::string binary = fs::weakly_canonical(POPE_BINARY_DIR).string();
  if (binary.rfind(source + "/", 0) != 0) GTEST_SKIP() << "build directory outside the source tree";
  ScratchDirectory scratch;  // no configs/ here or above (the temp dir)
  EXPECT_TRUE(fs::equivalent(resolve_config_path("owt_124m"), shipped("owt_124m")));
}

// The way the ranks share a step (ZeRO-1, buckets) is bookkeeping too: checkpoints hold the
// whole state, so a run resumes with either setting.
TEST(Config, HashIsStableAndIgnoresOnlyRunBookkeeping) {
  const RunConfig base;
  const std::string hash = config_hash(base);
  EXPECT_EQ(hash.size(), 16u);
  EXPECT_EQ(hash.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_EQ(config_hash(config_from_json(config_to_json(base))), hash);

  const std::vector<std::function<void(RunConfig&)>> bookkeeping = {
      [](RunConfig& c) { c.train.log_every = 1; },        [](RunConfig& c) { c.train.checkpoint_every = 7; },
      [](RunConfig& c) { c.train.keep_checkpoints = 9; }, [](RunConfig& c) { c.train.device = DeviceChoice::cpu; },
      [](RunConfig& c) { c.train.threads = 3; },          [](RunConfig& c) { c.train.steps = 5; },
      [](RunConfig& c) { c.out_dir = "elsewhere"; },      [](RunConfig& c) { c.train.eval_every = 1; },
      [](RunConfig& c) { c.train.eval_batches = 2; },    [](RunConfig& c) { c.train.zero_stage = 1; },
      [](RunConfig& c) { c.train.ddp_bucket_mb = 0; },   [](RunConfig& c) { c.attention.impl = AttentionImpl::cudnn; }};
  RunConfig all_changed;
  for (const auto& change : bookkeeping) {
    RunConfig changed;
    change(changed);
    change(all_changed);
    EXPECT_NE(config_to_json(changed), config_to_json(base));
    EXPECT_EQ(config_hash(changed), hash);
  }
  EXPECT_EQ(config_hash(all_changed), hash);

  const std::vector<std::function<void(RunConfig&)>> result_changing = {
      [](RunConfig& c) { c.optim.lr = 5e-4; }, [](RunConfig& c) { c.model.position.kind = "rope"; },
      [](RunConfig& c) { c.train.seed = 1; }, [](RunConfig& c) { c.data.train = "other.bin"; },
      [](RunConfig& c) { c.model.position.pope.delta_bound = DeltaBound::none; },
      [](RunConfig& c) { c.model.position.pope.delta_bound = DeltaBound::project; }};
  for (const auto& change : result_changing) {
    RunConfig changed;
    change(changed);
    EXPECT_NE(config_hash(changed), hash);
    EXPECT_EQ(config_hash_differences(base, changed).size(), 1u);
  }
  // What config_hash_differences names: hashed keys only, "key: before → after" in README order.
  RunConfig changed = all_changed;
  changed.optim.lr = 5e-4;
  changed.model.position.kind = "rope";
  EXPECT_EQ(config_hash_differences(base, changed),
            (std::vector<std::string>{"model.position.kind: \"" + base.model.position.kind + "\" → \"rope\"",
                                      "optim.lr: " + nlohmann::json(base.optim.lr).dump() + " → 0.0005"}));
  EXPECT_TRUE(config_hash_differences(base, all_changed).empty());
}

// A checkpoint written before model.position.pope.delta_bound existed still resumes: the key
// enters the hash only when it differs from its default. tests/data/configs/resolved_at_21de848.json
// is config_to_json(RunConfig{}).dump(2) printed by the tree at commit 21de848 (built apart, the
// last commit before the key), and 7d2a0d70c6c94251 its config_hash there. The file holds every
// key, so the defaults of today do not enter the comparison.
TEST(Config, HashOfAConfigFromBeforeDeltaBoundIsUnchanged) {
  std::ifstream in(fs::path(POPE_SOURCE_DIR) / "tests/data/configs/resolved_at_21de848.json");
  const json resolved = json::parse(in);
  ASSERT_FALSE(resolved["model"]["position"]["pope"].contains("delta_bound"));
  const RunConfig old_run = config_from_json(resolved);
  EXPECT_EQ(config_hash(old_run), "7d2a0d70c6c94251");
  RunConfig clamped = old_run;
  clamped.model.position.pope.delta_bound = DeltaBound::clamp;  // the default, spelled out
  EXPECT_EQ(config_hash(config_from_json(config_to_json(clamped))), "7d2a0d70c6c94251");
  for (const DeltaBound bound : {DeltaBound::none, DeltaBound::project}) {
    RunConfig changed = old_run;
    changed.model.position.pope.delta_bound = bound;
    EXPECT_NE(config_hash(changed), "7d2a0d70c6c94251") << name_of(bound);
    EXPECT_EQ(config_hash_differences(old_run, changed),
              (std::vector<std::string>{fmt::format("model.position.pope.delta_bound: \"clamp\" → \"{}\"",
                                                    name_of(bound))}));
  }
}

TEST(Config, GradAccumulationSplitsTheGlobalBatch) {
  RunConfig config;  // batch 64, micro 16
  EXPECT_EQ(config.grad_accumulation(), 4);
  EXPECT_EQ(config.grad_accumulation(2), 2);
  EXPECT_EQ(config.grad_accumulation(4), 1);
  expect_config_error([&] { config.grad_accumulation(3); }, "train.batch_size", {"16", "× world size (3) = 48"});
  expect_config_error([&] { config.grad_accumulation(8); }, "train.batch_size", {"= 128"});
  expect_config_error([&] { config.grad_accumulation(0); }, "train.batch_size", {"world size"});
}

// Each key that takes names lists every one in its row of the table, as `name`.
TEST(Config, ReadmeListsEveryNameOfANamedKey) {
  std::ifstream in(fs::path(POPE_SOURCE_DIR) / "configs/README.md");
  ASSERT_TRUE(in) << "configs/README.md missing";
  std::map<std::string, std::string> rows;  // key -> its table row
  for (std::string line; std::getline(in, line);) {
    if (!line.starts_with("| `")) continue;
    const std::size_t end = line.find('`', 3);
    if (end != std::string::npos) rows.emplace(line.substr(3, end - 3), line);
  }
  int named = 0;
  for (const config_schema::Field& field : config_schema::fields()) {
    const std::vector<std::string_view> names = config_schema::allowed_names(field);
    if (names.empty() || field.path == "model.position.kind") continue;  // the kinds have a table of their own
    ++named;
    const auto row = rows.find(std::string(field.path));
    ASSERT_NE(row, rows.end()) << field.path << " has no row";
    for (std::string_view name : names)
      EXPECT_NE(row->second.find(std::string("`").append(name).append("`")), std::string::npos)
          << field.path << ": " << name;
  }
  EXPECT_GE(named, 10);
}

TEST(Config, ReadmeDocumentsEveryKey) {
  std::ifstream in(fs::path(POPE_SOURCE_DIR) / "configs/README.md");
  ASSERT_TRUE(in) << "configs/README.md missing";
  std::stringstream readme;
  readme << in.rdbuf();
  std::vector<std::string> paths;
  collect_leaf_paths(config_to_json(RunConfig{}), "", paths);
  ASSERT_GT(paths.size(), 40u);
  for (const std::string& path : paths) {
    EXPECT_NE(readme.str().find("`" + path + "`"), std::string::npos) << path << " is not documented";
  }
}
