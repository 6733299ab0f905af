// safetensors files (round trip, corruption, interoperability with an independent Python
// reader/writer) and trainer checkpoints (round trip, pruning, replacement, errors).
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>

#include "pope/checkpoint.hpp"
#include "scratch_dir.hpp"

using namespace pope;
using pope::testing::read_bytes;
using pope::testing::ScratchDir;
using pope::testing::thrown_message;
using pope::testing::write_bytes;

namespace {

template <class T>
SafetensorsTensor make_tensor(const std::string& name, DType dtype, Shape shape, const std::vector<T>& values) {
  SafetensorsTensor t{name, dtype, std::move(shape), std::vector<std::uint8_t>(values.size() * sizeof(T))};
  std::memcpy(t.bytes.data(), values.data(), t.bytes.size());
  return t;
}

template <class T>
std::vector<T> values_of(const SafetensorsTensor& t) {
  std::vector<T> values(t.bytes.size() / sizeof(T));
  std::memcpy(values.data(), t.bytes.data(), t.bytes.size());
  return values;
}

// One tensor of every dtype, including a scalar and an empty tensor.
std::vector<SafetensorsTensor> all_dtype_tensors() {
  return {make_tensor<float>("weights.f32", DType::f32, {2, 3}, {1.5f, -2.25f, 0.0f, 3e-8f, 1e30f, -0.0f}),
          make_tensor<double>("values.f64", DType::f64, {3}, {0.1, -1e300, 2.0 / 3.0}),
          make_tensor<std::uint16_t>("half.bf16", DType::bf16, {2, 2}, {0x3FC0, 0xC010, 0x0000, 0x4049}),  // 1.5 −2.25 0 3.140625
          make_tensor<std::int32_t>("ids.i32", DType::i32, {}, {-123456789}),
          make_tensor<std::uint16_t>("tokens.u16", DType::u16, {4}, {0, 1, 50256, 65535}),
          make_tensor<float>("empty", DType::f32, {0, 3}, {})};
}

// A file whose header is exactly `header` (then padded) followed by `data_bytes` bytes.
void write_raw_safetensors(const std::filesystem::path& path, std::string header, std::size_t data_bytes) {
  header.append((8 - header.size() % 8) % 8, ' ');
  std::vector<std::uint8_t> bytes(8 + header.size() + data_bytes, 0);
  const std::uint64_t length = header.size();
  std::memcpy(bytes.data(), &length, 8);
  std::memcpy(bytes.data() + 8, header.data(), header.size());
  write_bytes(path, bytes);
}

}  // namespace

// ---- safetensors ------------------------------------------------------------------------------

TEST(Safetensors, RoundTripOfEveryDtypeAndMetadata) {
  ScratchDir dir;
  const auto path = dir / "all.safetensors";
  const auto tensors = all_dtype_tensors();
  write_safetensors(path, tensors, {{"format", "pope"}, {"note", "ünïcode"}});

  const auto bytes = read_bytes(path);
  std::uint64_t header_length = 0;
  std::memcpy(&header_length, bytes.data(), 8);
  EXPECT_EQ(header_length % 8, 0u) << "data section must be 8-byte aligned";

  const auto contents = read_safetensors(path);
  ASSERT_EQ(contents.tensors.size(), tensors.size());
  for (const auto& expected : tensors) {
    const auto& found = contents.at(expected.name);
    EXPECT_EQ(found.dtype, expected.dtype) << expected.name;
    EXPECT_EQ(found.shape, expected.shape) << expected.name;
    EXPECT_EQ(found.bytes, expected.bytes) << expected.name;
  }
  EXPECT_EQ(contents.metadata.at("note"), "ünïcode");
  EXPECT_EQ(contents.metadata.at("format"), "pope");
  EXPECT_THROW(contents.at("absent"), CheckpointError);
}

TEST(Safetensors, WriterRejectsInconsistentTensors) {
  ScratchDir dir;
  auto bad_size = make_tensor<float>("x", DType::f32, {2, 2}, {1, 2, 3});
  EXPECT_THROW(write_safetensors(dir / "a.safetensors", {bad_size}), CheckpointError);
  auto t = make_tensor<float>("x", DType::f32, {1}, {1});
  EXPECT_THROW(write_safetensors(dir / "a.safetensors", {t, t}), CheckpointError);
  EXPECT_THROW(write_safetensors(dir / "missing" / "a.safetensors", {t}), CheckpointError);
  EXPECT_FALSE(std::filesystem::exists(dir / "a.safetensors"));
}

TEST(Safetensors, EveryCorruptionIsACheckpointErrorNamingTheFile) {
  ScratchDir dir;
  const auto path = dir / "bad.safetensors";
  const std::string f32_12 = R"("t": {"dtype": "F32", "shape": [3], "data_offsets": [0, 12]})";
  struct Case {
    std::string what;
    std::string header;
    std::size_t data_bytes;
    std::string expected_text;
  };
  const std::vector<Case> cases{
      {"not JSON", "{\"t\": ", 12, "not valid JSON"},
      {"not an object", "[1, 2]", 0, "not a JSON object"},
      {"unknown dtype", R"({"t": {"dtype": "F16", "shape": [3], "data_offsets": [0, 6]}})", 6, "dtype \"F16\""},
      {"negative dimension", R"({"t": {"dtype": "F32", "shape": [-3], "data_offsets": [0, 12]}})", 12, "non-negative"},
      {"missing offsets", R"({"t": {"dtype": "F32", "shape": [3]}})", 12, "no \"data_offsets\""},
      {"offsets past the end", "{" + f32_12 + "}", 8, "outside the 8-byte data section"},
      {"size not numel × dtype", R"({"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 12]}})", 12, "needs 8"},
      {"huge shape", R"({"t": {"dtype": "F64", "shape": [4294967296, 4294967296], "data_offsets": [0, 8]}})", 8,
       "more than the whole file"},
      {"overlap", "{" + f32_12 + R"(, "u": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}})", 12,
       "must not overlap"},
      {"gap", R"({"t": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})", 8, "starts at data offset 4"},
      {"trailing bytes", "{" + f32_12 + "}", 20, "8 bytes unaccounted"},
      {"metadata not strings", "{" + f32_12 + R"(, "__metadata__": {"step": 3}})", 12, "metadata 'step'"},
      // Nesting this deep overflowed the stack wherever the value was copied or quoted.
      {"nested 100,000 deep", "{" + f32_12 + R"(, "__metadata__": {"x": )" + std::string(100000, '[') +
                                  std::string(100000, ']') + "}}",
       12, "not valid JSON"},
  };
  for (const auto& c : cases) {
    write_raw_safetensors(path, c.header, c.data_bytes);
    const auto message = thrown_message<CheckpointError>([&] { read_safetensors(path); });
    EXPECT_NE(message.find("bad.safetensors"), std::string::npos) << c.what << ": " << message;
    EXPECT_NE(message.find(c.expected_text), std::string::npos) << c.what << ": " << message;
  }

  // Damage to the length prefix or the file's end.
  write_bytes(path, {1, 2, 3});
  EXPECT_NE(thrown_message<CheckpointError>([&] { read_safetensors(path); }).find("fewer than the 8-byte"),
            std::string::npos);
  write_safetensors(path, all_dtype_tensors());
  auto bytes = read_bytes(path);
  bytes.pop_back();
  write_bytes(path, bytes);
  EXPECT_NE(thrown_message<CheckpointError>([&] { read_safetensors(path); }).find("bad.safetensors"),
            std::string::npos);
  bytes[0] = 0xFF;  // header length far beyond the file
  write_bytes(path, bytes);
  EXPECT_NE(thrown_message<CheckpointError>([&] { read_safetensors(path); }).find("does not fit"), std::string::npos);
  EXPECT_NE(thrown_message<CheckpointError>([&] { read_safetensors(dir / "none.safetensors"); }).find("none.safetensors"),
            std::string::npos);
}

// An independent reader and writer: Python's struct and json modules, following the
// format description only. C++ writes, Python decodes into JSON; Python writes, C++ reads.
TEST(Safetensors, InteroperatesWithAPythonImplementation) {
  if (std::system("python3 -c 'import json, struct' > /dev/null 2>&1") != 0) GTEST_SKIP() << "python3 not available";
  ScratchDir dir;
  const auto tensors = all_dtype_tensors();
  write_safetensors(dir / "from_cpp.safetensors", tensors, {{"format", "pope"}});

  std::ofstream(dir / "interop.py") << R"PY(
import json, struct, sys
src, decoded_path, out = sys.argv[1:4]
blob = open(src, "rb").read()
(n,) = struct.unpack("<Q", blob[:8])
assert n % 8 == 0, "header not padded to 8 bytes"
header = json.loads(blob[8:8 + n])
data = blob[8 + n:]
codes = {"F32": "f", "F64": "d", "I32": "i", "U16": "H", "BF16": "H"}
decoded = {"__metadata__": header.pop("__metadata__")}
for name, info in header.items():
    begin, end = info["data_offsets"]
    code = codes[info["dtype"]]
    count = (end - begin) // struct.calcsize(code)
    values = list(struct.unpack("<%d%s" % (count, code), data[begin:end]))
    if info["dtype"] == "BF16":  # bf16 is the top half of an f32
        values = [struct.unpack("<f", struct.pack("<I", v << 16))[0] for v in values]
    decoded[name] = {"dtype": info["dtype"], "shape": info["shape"], "values": values}
json.dump(decoded, open(decoded_path, "w"))

# A file written from the format description alone: metadata last, names out of data order.
parts = [("b", "I32", [3], struct.pack("<3i", 7, -8, 9)), ("a", "F32", [2, 2], struct.pack("<4f", 0.5, 1.0, -3.0, 7.25))]
head, offset, body = {}, 0, b""
for name, dtype, shape, raw in reversed(parts):
    head[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
    offset += len(raw)
    body += raw
head["__metadata__"] = {"written_by": "python"}
text = json.dumps(head).encode()
text += b" " * (-len(text) % 8)
open(out, "wb").write(struct.pack("<Q", len(text)) + text + body)
)PY";
  const std::string command = "python3 " + (dir / "interop.py").string() + " " + (dir / "from_cpp.safetensors").string() +
                              " " + (dir / "decoded.json").string() + " " + (dir / "from_python.safetensors").string();
  ASSERT_EQ(std::system(command.c_str()), 0) << command;

  const auto decoded = nlohmann::json::parse(std::ifstream(dir / "decoded.json"));
  EXPECT_EQ(decoded["__metadata__"]["format"], "pope");
  EXPECT_EQ(decoded["weights.f32"]["shape"], nlohmann::json({2, 3}));
  EXPECT_EQ(decoded["weights.f32"]["values"].get<std::vector<float>>(), values_of<float>(tensors[0]));
  EXPECT_EQ(decoded["values.f64"]["values"].get<std::vector<double>>(), values_of<double>(tensors[1]));
  const auto bf16 = decoded["half.bf16"]["values"];
  EXPECT_EQ(bf16[0].get<double>(), 1.5);
  EXPECT_EQ(bf16[1].get<double>(), -2.25);
  EXPECT_EQ(bf16[3].get<double>(), 3.140625);
  EXPECT_EQ(decoded["ids.i32"]["shape"], nlohmann::json::array());
  EXPECT_EQ(decoded["ids.i32"]["values"], nlohmann::json({-123456789}));
  EXPECT_EQ(decoded["tokens.u16"]["values"], nlohmann::json({0, 1, 50256, 65535}));
  EXPECT_EQ(decoded["empty"]["shape"], nlohmann::json({0, 3}));

  const auto from_python = read_safetensors(dir / "from_python.safetensors");
  EXPECT_EQ(from_python.metadata.at("written_by"), "python");
  EXPECT_EQ(from_python.at("a").shape, (Shape{2, 2}));
  EXPECT_EQ(values_of<float>(from_python.at("a")), (std::vector<float>{0.5f, 1.0f, -3.0f, 7.25f}));
  EXPECT_EQ(values_of<std::int32_t>(from_python.at("b")), (std::vector<std::int32_t>{7, -8, 9}));
}

// ---- checkpoints -------------------------------------------------------------------------------

namespace {

ParameterLayout tiny_layout(std::int64_t delta_width = 4) {
  ParameterLayout layout;
  layout.add({"wte.weight", {10, 8}, true});
  layout.add({"layers.0.attn_norm.weight", {8}});
  layout.add({"layers.0.attn.qkv.weight", {24, 8}, true});
  layout.add({"layers.0.position.delta", {2, delta_width}});
  layout.add({"final_norm.weight", {8}});
  return layout;
}

// Distinct values everywhere except the layout's padding, which stays zero.
std::vector<float> arena_values(const ParameterLayout& layout, float scale) {
  std::vector<float> flat(static_cast<std::size_t>(layout.total_numel()), 0.0f);
  for (std::size_t i = 0; i < layout.specs().size(); ++i)
    for (std::int64_t j = 0; j < shape_numel(layout.specs()[i].shape); ++j)
      flat[static_cast<std::size_t>(layout.offset(i) + j)] = scale * static_cast<float>(i * 1000 + j) + 0.25f;
  return flat;
}

CheckpointData full_checkpoint(const ParameterLayout& layout, long step) {
  CheckpointData data;
  data.state.step = step;
  data.state.samples_consumed = (std::uint64_t{1} << 63) + 5;
  data.state.rng = {~std::uint64_t{0}, 0, 0x123456789ABCDEFull, std::uint64_t{1} << 53 | 1};
  data.state.config_hash = "sha256:abc";
  data.state.consecutive_nonfinite = 2;
  data.state.last_val_loss = 3.0123456789012345;
  data.params = arena_values(layout, 1.0f + static_cast<float>(step));
  data.adam_m = arena_values(layout, -0.5f);
  data.adam_v = arena_values(layout, 1e-3f);
  return data;
}

std::vector<std::string> entries_of(const std::filesystem::path& dir) {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

TEST(Checkpoint, SaveLoadRoundTripIsExact) {
  ScratchDir run;
  const auto layout = tiny_layout();
  const auto saved = full_checkpoint(layout, 1000);
  const auto dir = save_checkpoint(run.path(), layout, saved, 3);
  EXPECT_EQ(dir, run / "checkpoints" / "step_00001000");
  EXPECT_EQ(entries_of(dir), (std::vector<std::string>{"model.safetensors", "optimizer.safetensors", "trainer.json"}));

  for (const auto& path : {dir, run.path()}) {  // a step directory, or a run directory → its latest
    const auto loaded = load_checkpoint(path, layout);
    EXPECT_EQ(loaded.params, saved.params);
    EXPECT_EQ(loaded.adam_m, saved.adam_m);
    EXPECT_EQ(loaded.adam_v, saved.adam_v);
    EXPECT_EQ(loaded.state.step, 1000);
    EXPECT_EQ(loaded.state.samples_consumed, saved.state.samples_consumed);
    EXPECT_EQ(loaded.state.rng, saved.state.rng);
    EXPECT_EQ(loaded.state.config_hash, saved.state.config_hash);
    EXPECT_EQ(loaded.state.consecutive_nonfinite, 2);
    EXPECT_EQ(loaded.state.last_val_loss, saved.state.last_val_loss);
  }

  // The weights file is a plain safetensors file with the model's names.
  const auto model = read_safetensors(dir / "model.safetensors");
  EXPECT_EQ(model.metadata.at("format"), "pope");
  EXPECT_EQ(model.metadata.at("step"), "1000");
  EXPECT_EQ(model.at("layers.0.attn.qkv.weight").shape, (Shape{24, 8}));
  EXPECT_EQ(values_of<float>(model.at("final_norm.weight"))[3], saved.params[static_cast<std::size_t>(layout.offset(4) + 3)]);
  EXPECT_EQ(read_safetensors(dir / "optimizer.safetensors").tensors.size(), 2 * layout.specs().size());
}

TEST(Checkpoint, WeightsOnlyNeedsNothingButTheModel) {
  ScratchDir run;
  const auto layout = tiny_layout();
  auto saved = full_checkpoint(layout, 10);
  saved.adam_m.clear();
  saved.adam_v.clear();
  const auto dir = save_checkpoint(run.path(), layout, saved, 1);
  EXPECT_FALSE(std::filesystem::exists(dir / "optimizer.safetensors"));
  EXPECT_TRUE(load_checkpoint(dir, layout).adam_m.empty());

  std::filesystem::remove(dir / "trainer.json");
  const auto message = thrown_message<CheckpointError>([&] { load_checkpoint(dir, layout); });
  EXPECT_NE(message.find("incomplete: trainer.json does not exist"), std::string::npos) << message;
  const auto weights = load_checkpoint(dir, layout, /*weights_only=*/true);
  EXPECT_EQ(weights.params, saved.params);
  EXPECT_EQ(weights.state.step, 0);

  // A FIFO in its place is named for what it is, and never opened (it would block).
  ASSERT_EQ(::mkfifo((dir / "trainer.json").c_str(), 0600), 0) << std::strerror(errno);
  const auto fifo = thrown_message<CheckpointError>([&] { load_checkpoint(dir, layout); });
  EXPECT_NE(fifo.find("trainer.json is a FIFO (named pipe)"), std::string::npos) << fifo;
  const auto state = thrown_message<CheckpointError>([&] { read_trainer_state(dir); });
  EXPECT_NE(state.find("trainer.json is a FIFO (named pipe)"), std::string::npos) << state;
}

TEST(Checkpoint, KeepsTheNewestAndReplacesAReSavedStep) {
  ScratchDir run;
  const auto layout = tiny_layout();
  for (long step = 1; step <= 5; ++step) save_checkpoint(run.path(), layout, full_checkpoint(layout, step), 2);
  EXPECT_EQ(entries_of(run / "checkpoints"), (std::vector<std::string>{"step_00000004", "step_00000005"}));

  auto resaved = full_checkpoint(layout, 5);
  resaved.params = arena_values(layout, 42.0f);
  save_checkpoint(run.path(), layout, resaved, 2);
  EXPECT_EQ(entries_of(run / "checkpoints"), (std::vector<std::string>{"step_00000004", "step_00000005"}));
  EXPECT_EQ(load_checkpoint(run.path(), layout).params, resaved.params);

  // The step just written always survives, even when older than the others (a run resumed
  // from an earlier checkpoint); it counts towards keep_last.
  save_checkpoint(run.path(), layout, full_checkpoint(layout, 3), 2);
  EXPECT_EQ(entries_of(run / "checkpoints"), (std::vector<std::string>{"step_00000003", "step_00000005"}));
}

TEST(Checkpoint, LatestIgnoresTemporaryAndIncompleteDirectories) {
  ScratchDir run;
  const auto layout = tiny_layout();
  EXPECT_FALSE(latest_checkpoint(run.path()));
  save_checkpoint(run.path(), layout, full_checkpoint(layout, 5), 5);
  save_checkpoint(run.path(), layout, full_checkpoint(layout, 20), 5);
  // A crash mid-save leaves a .tmp directory (complete-looking) and one without trainer.json.
  std::filesystem::copy(run / "checkpoints" / "step_00000020", run / "checkpoints" / "step_00000090.tmp");
  std::filesystem::create_directory(run / "checkpoints" / "step_00000080");
  std::filesystem::copy(run / "checkpoints" / "step_00000020" / "model.safetensors",
                        run / "checkpoints" / "step_00000080" / "model.safetensors");
  EXPECT_EQ(latest_checkpoint(run.path()), run / "checkpoints" / "step_00000020");
  EXPECT_EQ(load_checkpoint(run.path(), layout).state.step, 20);

  // The next save cleans the stale .tmp up.
  save_checkpoint(run.path(), layout, full_checkpoint(layout, 30), 5);
  EXPECT_FALSE(std::filesystem::exists(run / "checkpoints" / "step_00000090.tmp"));
  EXPECT_EQ(*latest_checkpoint(run.path()), run / "checkpoints" / "step_00000030");
}

// A pruning killed half-way must not leave a directory that looks complete: old step
// directories are renamed to "<step>.deleting" before their files go, and a step directory
// missing any file (here optimizer.safetensors, as a delete in file order left it) is skipped.
TEST(Checkpoint, APartlyDeletedCheckpointNeverLooksComplete) {
  ScratchDir run;
  const auto layout = tiny_layout();
  const auto checkpoints = run / "checkpoints";
  save_checkpoint(run.path(), layout, full_checkpoint(layout, 20), 5);
  std::filesystem::copy(checkpoints / "step_00000020", checkpoints / "step_00000040");
  std::filesystem::remove(checkpoints / "step_00000040" / "optimizer.safetensors");
  std::filesystem::copy(checkpoints / "step_00000020", checkpoints / "step_00000050.deleting");
  EXPECT_EQ(latest_checkpoint(run.path()), checkpoints / "step_00000020");
  EXPECT_EQ(load_checkpoint(run.path(), layout).state.step, 20);

  save_checkpoint(run.path(), layout, full_checkpoint(layout, 60), 1);  // prunes 20 and 40, clears the leftover
  EXPECT_EQ(entries_of(checkpoints), (std::vector<std::string>{"step_00000060"}));
}

TEST(Checkpoint, LayoutMismatchesNameTensorAndShapes) {
  ScratchDir run;
  const auto dir = save_checkpoint(run.path(), tiny_layout(4), full_checkpoint(tiny_layout(4), 1), 1);

  auto message = thrown_message<CheckpointError>([&] { load_checkpoint(dir, tiny_layout(6)); });
  EXPECT_NE(message.find("layers.0.position.delta"), std::string::npos) << message;
  EXPECT_NE(message.find("[2, 4]"), std::string::npos) << message;
  EXPECT_NE(message.find("[2, 6]"), std::string::npos) << message;

  auto bigger = tiny_layout();
  bigger.add({"layers.0.mlp_norm.weight", {8}});
  message = thrown_message<CheckpointError>([&] { load_checkpoint(dir, bigger); });
  EXPECT_NE(message.find("no tensor 'layers.0.mlp_norm.weight'"), std::string::npos) << message;

  ParameterLayout smaller;
  smaller.add({"wte.weight", {10, 8}, true});
  message = thrown_message<CheckpointError>([&] { load_checkpoint(dir, smaller, true); });
  EXPECT_NE(message.find("does not have"), std::string::npos) << message;
  EXPECT_NE(message.find("final_norm.weight"), std::string::npos) << message;
}

// A weight or moment that is NaN or infinite is never saved (a diverged run would call it the
// last good checkpoint), so in a file it can only be damage: both refused, naming the tensor.
TEST(Checkpoint, NonFiniteValuesAreRefusedNamingTheTensor) {
  ScratchDir run;
  const auto layout = tiny_layout();
  const auto good = save_checkpoint(run.path(), layout, full_checkpoint(layout, 6), 1);
  for (const char* file : {"model.safetensors", "optimizer.safetensors"}) {
    const bool model = std::string(file) == "model.safetensors";
    for (const float bad : {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::infinity()}) {
      auto data = full_checkpoint(layout, 7);
      const std::size_t element = static_cast<std::size_t>(layout.offset(2)) + 5;  // layers.0.attn.qkv.weight[5]
      (model ? data.params : data.adam_v)[element] = bad;
      auto message = thrown_message<CheckpointError>([&] { save_checkpoint(run.path(), layout, data, 1); });
      EXPECT_NE(message.find(fmt::format("step 7: tensor '{}layers.0.attn.qkv.weight' has 1 non-finite values (the "
                                         "first at element 5); no checkpoint written",
                                         model ? "" : "v.")),
                std::string::npos)
          << message;
      EXPECT_EQ(entries_of(run / "checkpoints"), (std::vector<std::string>{"step_00000006"}));

      // The same values written into the saved checkpoint's file: damage the loader refuses.
      const auto original = read_bytes(good / file);
      std::vector<SafetensorsTensor> tensors;
      for (const std::string prefix : model ? std::vector<std::string>{""} : std::vector<std::string>{"m.", "v."}) {
        const auto& flat = prefix.empty() ? data.params : prefix == "m." ? data.adam_m : data.adam_v;
        for (std::size_t i = 0; i < layout.specs().size(); ++i) {
          std::vector<float> values(flat.begin() + layout.offset(i),
                                    flat.begin() + layout.offset(i) + shape_numel(layout.specs()[i].shape));
          tensors.push_back(make_tensor<float>(prefix + layout.specs()[i].name, DType::f32, layout.specs()[i].shape, values));
        }
      }
      write_safetensors(good / file, tensors);
      message = thrown_message<CheckpointError>([&] { load_checkpoint(good, layout); });
      EXPECT_NE(message.find(file), std::string::npos) << message;
      EXPECT_NE(message.find("attn.qkv.weight' has 1 non-finite values (the first at element 5)"), std::string::npos)
          << message;
      if (model) {
        EXPECT_THROW(load_checkpoint(good, layout, /*weights_only=*/true), CheckpointError);
      } else {
        EXPECT_EQ(load_checkpoint(good, layout, /*weights_only=*/true).params, full_checkpoint(layout, 6).params);  // moments unread
      }
      write_bytes(good / file, original);
    }
  }
}

// AdamW's second moments are means of squared gradients: a negative one is damage (the square
// root of the update would be NaN). First moments may be negative.
TEST(Checkpoint, ANegativeSecondMomentIsRefusedNamingTheTensor) {
  ScratchDir run;
  const auto layout = tiny_layout();
  auto data = full_checkpoint(layout, 6);
  data.adam_v[static_cast<std::size_t>(layout.offset(2)) + 5] = -1e-3f;  // layers.0.attn.qkv.weight[5]
  const auto dir = save_checkpoint(run.path(), layout, data, 1);
  const std::string message = thrown_message<CheckpointError>([&] { load_checkpoint(dir, layout); });
  EXPECT_NE(message.find("optimizer.safetensors"), std::string::npos) << message;
  EXPECT_NE(message.find("tensor 'v.layers.0.attn.qkv.weight' has 1 negative values (the first at element 5), "
                         "expected AdamW second moments >= 0"),
            std::string::npos)
      << message;
  ASSERT_LT(*std::min_element(data.adam_m.begin(), data.adam_m.end()), 0.0f);
  data.adam_v = arena_values(layout, 1e-3f);
  EXPECT_EQ(load_checkpoint(save_checkpoint(run.path(), layout, data, 1), layout).adam_m, data.adam_m);
}

TEST(Checkpoint, BadPathsAndArgumentsAreCheckpointErrors) {
  ScratchDir run;
  const auto layout = tiny_layout();
  EXPECT_NE(thrown_message<CheckpointError>([&] { load_checkpoint(run / "nowhere", layout); }).find("nowhere"),
            std::string::npos);
  std::filesystem::create_directory(run / "checkpoints");
  EXPECT_NE(thrown_message<CheckpointError>([&] { load_checkpoint(run.path(), layout); }).find("no complete checkpoint"),
            std::string::npos);
  auto data = full_checkpoint(layout, 1);
  const auto dir = save_checkpoint(run.path(), layout, data, 1);
  pope::testing::write_bytes(dir / "trainer.json", {'{', '"'});
  EXPECT_NE(thrown_message<CheckpointError>([&] { load_checkpoint(dir, layout); }).find("trainer.json"),
            std::string::npos);
  EXPECT_THROW(save_checkpoint(run.path(), layout, data, 0), CheckpointError);
  data.adam_v.pop_back();
  EXPECT_THROW(save_checkpoint(run.path(), layout, data, 1), CheckpointError);
}

TEST(Checkpoint, ATrainerStateOfAnotherStepThanItsDirectoryIsRefused) {
  ScratchDir run;
  const auto layout = tiny_layout();
  const auto dir = save_checkpoint(run.path(), layout, full_checkpoint(layout, 6), 1);
  EXPECT_EQ(read_trainer_state(dir).step, 6);
  auto state = nlohmann::json::parse(std::ifstream(dir / "trainer.json"));
  state["step"] = 100;
  std::ofstream(dir / "trainer.json") << state.dump();
  for (const auto& load : std::vector<std::function<void()>>{[&] { load_checkpoint(dir, layout); },
                                                            [&] { read_trainer_state(dir); }}) {
    const std::string message = thrown_message<CheckpointError>(load);
    EXPECT_NE(message.find("says step 100, but its directory is step_00000006"), std::string::npos) << message;
  }
  // A directory not named step_N (a copy made by hand) is taken at its word.
  std::filesystem::rename(dir, run / "by_hand");
  EXPECT_EQ(read_trainer_state(run / "by_hand").step, 100);
}

TEST(TrainerState, JsonRoundTripAndFieldErrors) {
  TrainerState state;
  state.step = 7;
  state.rng = {1, ~std::uint64_t{0}, 3, 4};
  state.last_val_loss = std::numeric_limits<double>::infinity();
  auto json = state.to_json();
  EXPECT_EQ(json["rng"][1], "18446744073709551615");
  const auto back = TrainerState::from_json(nlohmann::json::parse(json.dump()), "trainer.json");
  EXPECT_EQ(back.rng, state.rng);
  EXPECT_TRUE(std::isnan(back.last_val_loss));  // JSON cannot hold inf: written as null

  json.erase("samples_consumed");
  auto message = thrown_message<CheckpointError>([&] { TrainerState::from_json(json, "run/trainer.json"); });
  EXPECT_NE(message.find("run/trainer.json: missing \"samples_consumed\""), std::string::npos) << message;
  json = state.to_json();
  json["rng"][2] = "12x";
  message = thrown_message<CheckpointError>([&] { TrainerState::from_json(json, "t.json"); });
  EXPECT_NE(message.find("\"rng\""), std::string::npos) << message;
  json = state.to_json();
  json["step"] = -1;
  EXPECT_THROW(TrainerState::from_json(json, "t.json"), CheckpointError);
  json["step"] = 12;  // a signed integer, as JSON built in code holds it
  EXPECT_EQ(TrainerState::from_json(json, "t.json").step, 12);

  // Values no trainer writes: xoshiro256**'s all-zero state, a negative loss.
  json = state.to_json();
  json["rng"] = {"0", "0", "0", "0"};
  message = thrown_message<CheckpointError>([&] { TrainerState::from_json(json, "t.json"); });
  EXPECT_NE(message.find("t.json: \"rng\" is [\"0\",\"0\",\"0\",\"0\"], expected a xoshiro256** state, which is "
                         "never all zeros"),
            std::string::npos)
      << message;
  json = state.to_json();
  json["last_val_loss"] = -0.5;
  message = thrown_message<CheckpointError>([&] { TrainerState::from_json(json, "t.json"); });
  EXPECT_NE(message.find("t.json: \"last_val_loss\" is -0.5, expected a number >= 0 or null"), std::string::npos)
      << message;
}

// The run's config bounds its trainer.json: the step within train.steps, one global batch
// drawn per step, fewer consecutive non-finite steps than abort the run.
TEST(TrainerState, ChecksAgainstTheRunsLimitsNameTheField) {
  TrainerState state;
  state.step = 3;
  state.samples_consumed = 24;
  state.consecutive_nonfinite = 4;
  const TrainerStateLimits limits{.steps = 10, .batch_size = 8, .max_nonfinite_steps = 5};
  EXPECT_NO_THROW(check_trainer_state(state, limits, "t.json"));
  const auto refusal = [&](TrainerState tampered, const TrainerStateLimits& bounds) {
    return thrown_message<CheckpointError>([&] { check_trainer_state(tampered, bounds, "t.json"); });
  };
  TrainerState tampered = state;
  tampered.samples_consumed = 25;
  EXPECT_NE(refusal(tampered, limits).find("t.json: \"samples_consumed\" is 25, expected step × train.batch_size = "
                                           "3 × 8 = 24"),
            std::string::npos);
  tampered.samples_consumed = 24 + (std::uint64_t{1} << 63);  // 3 × 8 modulo 2^64: the product must not wrap
  EXPECT_NE(refusal(tampered, limits).find("\"samples_consumed\" is 9223372036854775832"), std::string::npos);
  tampered = state;
  tampered.consecutive_nonfinite = 5;
  EXPECT_NE(refusal(tampered, limits).find("\"consecutive_nonfinite\" is 5, expected at most 4 (the run aborts at "
                                           "train.max_nonfinite_steps = 5)"),
            std::string::npos);
  tampered.consecutive_nonfinite = 0;
  EXPECT_NO_THROW(check_trainer_state(tampered, {.steps = 10, .batch_size = 8, .max_nonfinite_steps = 0}, "t.json"));
  EXPECT_NE(refusal(state, {.steps = 2, .batch_size = 8, .max_nonfinite_steps = 5})
                .find("\"step\" is 3, expected at most train.steps = 2"),
            std::string::npos);
}

TEST(WriteFileAtomic, ReplacesContentsAndReportsFailures) {
  ScratchDir dir;
  write_file_atomic(dir / "config.json", "{\"a\": 1}\n");
  write_file_atomic(dir / "config.json", "{}\n");
  const auto bytes = read_bytes(dir / "config.json");
  EXPECT_EQ(std::string(bytes.begin(), bytes.end()), "{}\n");
  EXPECT_EQ(entries_of(dir.path()), (std::vector<std::string>{"config.json"}));
  EXPECT_NE(thrown_message<CheckpointError>([&] { write_file_atomic(dir / "no" / "x.json", ""); }).find("x.json"),
            std::string::npos);
}

// A rename replaces whatever is at the path: `--json link.json` turned the symlink into a plain
// file (its target unchanged). The write must go to the file the link resolves to, with the
// temporary file in that file's directory, and leave the link a link.
TEST(WriteFileAtomic, WritesThroughASymlinkAndKeepsIt) {
  ScratchDir dir;
  std::filesystem::create_directory(dir / "results");
  std::filesystem::create_directory(dir / "links");
  write_file_atomic(dir / "results" / "r.json", "old\n");
  std::filesystem::create_symlink("../results/r.json", dir / "links" / "r.json");  // relative, as ln -s makes them
  write_file_atomic(dir / "links" / "r.json", "new\n");
  EXPECT_TRUE(std::filesystem::is_symlink(dir / "links" / "r.json"));
  const auto bytes = read_bytes(dir / "results" / "r.json");
  EXPECT_EQ(std::string(bytes.begin(), bytes.end()), "new\n");
  EXPECT_EQ(entries_of(dir / "links"), (std::vector<std::string>{"r.json"}));
  EXPECT_EQ(entries_of(dir / "results"), (std::vector<std::string>{"r.json"}));

  // A dangling link: the file it names is created, as a plain open() would.
  std::filesystem::create_symlink(dir / "results" / "fresh.json", dir / "links" / "fresh.json");
  write_file_atomic(dir / "links" / "fresh.json", "{}\n");
  EXPECT_TRUE(std::filesystem::is_symlink(dir / "links" / "fresh.json"));
  EXPECT_TRUE(std::filesystem::is_regular_file(dir / "results" / "fresh.json"));
}

// As root, `--csv /dev/full` replaced the device node with a regular file. Anything that
// exists and is not a regular file is refused, named, and left as it was.
TEST(WriteFileAtomic, RefusesToReplaceWhatIsNotARegularFile) {
  ScratchDir dir;
  const auto quoted = [](const std::filesystem::path& path) { return "\"" + path.string() + "\""; };
  const auto fifo = dir / "pipe";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  auto message = thrown_message<CheckpointError>([&] { write_file_atomic(fifo, "x\n"); });
  EXPECT_NE(message.find(quoted(fifo) + " is a FIFO (named pipe), not a regular file; expected a file path to write"),
            std::string::npos)
      << message;
  EXPECT_EQ(std::filesystem::status(fifo).type(), std::filesystem::file_type::fifo);

  std::filesystem::create_directory(dir / "out");
  message = thrown_message<CheckpointError>([&] { write_file_atomic(dir / "out", "x\n"); });
  EXPECT_NE(message.find(quoted(dir / "out") + " is a directory, not a regular file"), std::string::npos) << message;
  EXPECT_TRUE(std::filesystem::is_directory(dir / "out"));

  // Through a link, the message names both the link and what it resolves to.
  std::filesystem::create_symlink(fifo, dir / "link");
  message = thrown_message<CheckpointError>([&] { write_file_atomic(dir / "link", "x\n"); });
  EXPECT_NE(message.find(quoted(dir / "link") + " resolves to " + quoted(fifo) + ", which is a FIFO"),
            std::string::npos)
      << message;
  EXPECT_EQ(std::filesystem::status(fifo).type(), std::filesystem::file_type::fifo);
  // No temporary file was left behind.
  EXPECT_EQ(entries_of(dir.path()), (std::vector<std::string>{"link", "out", "pipe"}));
  EXPECT_TRUE(std::filesystem::is_empty(dir / "out"));
}
