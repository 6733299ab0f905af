// Token files (llm.c shards, nanoGPT .bin), datasets over several files, and samplers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <set>

#include "pope/data.hpp"
#include "scratch_dir.hpp"

using namespace pope;
using pope::testing::read_bytes;
using pope::testing::ScratchDir;
using pope::testing::thrown_message;
using pope::testing::write_bytes;

namespace {

constexpr int kVocab = 50257;

std::vector<std::uint16_t> counting_tokens(std::size_t count, std::uint16_t first = 0) {
  std::vector<std::uint16_t> tokens(count);
  std::iota(tokens.begin(), tokens.end(), first);
  return tokens;
}

void write_nanogpt(const std::filesystem::path& path, const std::vector<std::uint16_t>& tokens) {
  std::vector<std::uint8_t> bytes(tokens.size() * 2);
  std::memcpy(bytes.data(), tokens.data(), bytes.size());
  write_bytes(path, bytes);
}

// Overwrites header int32 number `index` of an llm.c shard.
void patch_header(const std::filesystem::path& path, std::size_t index, std::int32_t value) {
  auto bytes = read_bytes(path);
  std::memcpy(bytes.data() + index * 4, &value, 4);
  write_bytes(path, bytes);
}

}  // namespace

// ---- TokenFile ---------------------------------------------------------------------------

TEST(TokenFile, LlmcShardRoundTrip) {
  ScratchDir dir;
  const auto tokens = counting_tokens(1000, 7);
  write_llmc_shard(dir / "shard.bin", tokens);
  EXPECT_EQ(std::filesystem::file_size(dir / "shard.bin"), 1024u + 2 * tokens.size());
  const auto file = TokenFile::open(dir / "shard.bin", kVocab);
  EXPECT_EQ(file.format(), TokenFileFormat::llmc);
  EXPECT_EQ(file.read(0, file.size()), tokens);
  // The temporary file of the atomic write is gone.
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path()), {}), 1);
}

TEST(TokenFile, NanogptFileRoundTrip) {
  ScratchDir dir;
  const auto tokens = counting_tokens(333, 100);
  write_nanogpt(dir / "train.bin", tokens);
  const auto file = TokenFile::open(dir / "train.bin", kVocab);
  EXPECT_EQ(file.format(), TokenFileFormat::nanogpt);
  EXPECT_EQ(file.size(), tokens.size());
  EXPECT_EQ(file.read(0, file.size()), tokens);
}

TEST(TokenFile, DescriptorOutlivesCopies) {
  ScratchDir dir;
  write_llmc_shard(dir / "shard.bin", counting_tokens(10));
  std::vector<TokenFile> files;
  {
    const auto file = TokenFile::open(dir / "shard.bin", kVocab);
    files.push_back(file);
  }
  EXPECT_EQ(files[0].read(9, 1), std::vector<std::uint16_t>{9});
}

TEST(TokenFile, TruncatedAndOverlongLlmcShardsNameExpectedAndActualSize) {
  ScratchDir dir;
  const auto path = dir / "shard.bin";
  write_llmc_shard(path, counting_tokens(100));
  auto bytes = read_bytes(path);
  bytes.resize(bytes.size() - 2);
  write_bytes(path, bytes);
  auto message = thrown_message<DataError>([&] { TokenFile::open(path, kVocab); });
  EXPECT_NE(message.find("1224"), std::string::npos) << message;  // 1024 + 100 × 2
  EXPECT_NE(message.find("1222"), std::string::npos) << message;
  EXPECT_NE(message.find("truncated"), std::string::npos) << message;

  bytes.resize(bytes.size() + 6);
  write_bytes(path, bytes);
  message = thrown_message<DataError>([&] { TokenFile::open(path, kVocab); });
  EXPECT_NE(message.find("4 extra bytes"), std::string::npos) << message;
}

TEST(TokenFile, BrokenLlmcHeadersAreErrorsNotNanogptFiles) {
  ScratchDir dir;
  const auto path = dir / "shard.bin";
  write_llmc_shard(path, counting_tokens(100));
  patch_header(path, 1, 2);
  EXPECT_NE(thrown_message<DataError>([&] { TokenFile::open(path, kVocab); }).find("version 2"), std::string::npos);

  write_llmc_shard(path, counting_tokens(100));
  patch_header(path, 2, 101);
  EXPECT_NE(thrown_message<DataError>([&] { TokenFile::open(path, kVocab); }).find("declares 101 tokens"),
            std::string::npos);

  write_llmc_shard(path, counting_tokens(100));
  patch_header(path, 2, 0);
  EXPECT_NE(thrown_message<DataError>([&] { TokenFile::open(path, kVocab); }).find("positive"), std::string::npos);

  // The magic followed by less than a header: an llm.c error, even though the size is even.
  auto bytes = read_bytes(path);
  bytes.resize(512);
  write_bytes(path, bytes);
  EXPECT_NE(thrown_message<DataError>([&] { TokenFile::open(path, kVocab); }).find("llm.c magic"), std::string::npos);
}

TEST(TokenFile, DamagedMagicIsHeaderDamageNotHeaderlessTokens) {
  ScratchDir dir;
  const auto path = dir / "shard.bin";
  for (const std::int32_t magic : {kLlmcMagic + 1, 0, -1}) {
    write_llmc_shard(path, counting_tokens(100));
    patch_header(path, 0, magic);
    const auto message = thrown_message<DataError>([&] { TokenFile::open(path, kVocab); });
    EXPECT_NE(message.find("shard.bin\" has a damaged llm.c header: its first int32 is " + std::to_string(magic)),
              std::string::npos)
        << message;
    EXPECT_EQ(message.find("token at index"), std::string::npos) << message;
  }
  // Magic and version both gone: the reserved words still give the header away.
  write_llmc_shard(path, counting_tokens(100));
  patch_header(path, 0, 7);
  patch_header(path, 1, 9);
  EXPECT_NE(thrown_message<DataError>([&] { TokenFile::open(path, kVocab); }).find("253 of the 253 reserved int32 are 0"),
            std::string::npos);
  // A reserved word that is not 0 behind an intact magic.
  write_llmc_shard(path, counting_tokens(100));
  patch_header(path, 100, 5);
  EXPECT_NE(thrown_message<DataError>([&] { TokenFile::open(path, kVocab); }).find("damaged header: int32 [100] is 5"),
            std::string::npos);
}

TEST(TokenFile, OddSizedNanogptFileIsRejected) {
  ScratchDir dir;
  write_bytes(dir / "train.bin", {1, 0, 2, 0, 3});
  const auto message = thrown_message<DataError>([&] { TokenFile::open(dir / "train.bin", kVocab); });
  EXPECT_NE(message.find("odd size of 5 bytes"), std::string::npos) << message;
}

TEST(TokenFile, EmptyMissingAndDirectoryPathsAreNamed) {
  ScratchDir dir;
  write_bytes(dir / "empty.bin", {});
  auto message = thrown_message<DataError>([&] { TokenFile::open(dir / "empty.bin", kVocab); });
  EXPECT_NE(message.find("empty.bin"), std::string::npos);
  EXPECT_NE(message.find("is empty"), std::string::npos);
  message = thrown_message<DataError>([&] { TokenFile::open(dir / "missing.bin", kVocab); });
  EXPECT_NE(message.find("missing.bin\" does not exist"), std::string::npos) << message;
  message = thrown_message<DataError>([&] { TokenFile::open(dir.path(), kVocab); });
  EXPECT_NE(message.find("is a directory"), std::string::npos) << message;
}

TEST(TokenFile, IdAtOrAboveVocabularyNamesFileIndexAndId) {
  ScratchDir dir;
  auto tokens = counting_tokens(20);
  tokens[13] = 500;
  write_nanogpt(dir / "val.bin", tokens);
  write_llmc_shard(dir / "shard.bin", tokens);
  for (const char* name : {"val.bin", "shard.bin"}) {
    const auto message = thrown_message<DataError>([&] { TokenFile::open(dir / name, 500); });
    EXPECT_NE(message.find(name), std::string::npos) << message;
    EXPECT_NE(message.find("index 13 has id 500"), std::string::npos) << message;
    EXPECT_NO_THROW(TokenFile::open(dir / name, 501));
    EXPECT_NO_THROW(TokenFile::open(dir / name, 0));  // 0: no vocabulary check
  }
}

// Truncated after opening (a file rewritten under a running trainer): reading the lost part is a
// DataError naming the file, where a mapped file raised SIGBUS and killed the process.
TEST(TokenFile, TruncatedWhileOpenIsAnErrorNamingTheFile) {
  ScratchDir dir;
  const auto path = dir / "shard.bin";
  write_llmc_shard(path, counting_tokens(50'000));
  const auto file = TokenFile::open(path, kVocab);
  const auto dataset = TokenDataset::open(path.string(), kVocab);
  const RandomWindowSampler random(dataset, 64, 3);
  const SequentialWindowSampler sequential(dataset, 64);
  std::filesystem::resize_file(path, 1024 + 2 * 1000);  // 1000 tokens left

  EXPECT_EQ(file.read(10, 3), (std::vector<std::uint16_t>{10, 11, 12}));  // the part still there reads
  auto message = thrown_message<DataError>([&] { (void)file.read(40'000, 10); });
  EXPECT_NE(message.find(path.string()), std::string::npos) << message;
  EXPECT_NE(message.find("shrank while in use"), std::string::npos) << message;
  EXPECT_NE(message.find("now 3024"), std::string::npos) << message;
  message = thrown_message<DataError>([&] { file.scan([](std::size_t, std::span<const std::uint16_t>) {}); });
  EXPECT_NE(message.find(path.string()), std::string::npos) << message;

  std::vector<std::int32_t> inputs(64 * 64), targets(64 * 64);
  message = thrown_message<DataError>([&] { random.fill(0, 64, inputs.data(), targets.data()); });
  EXPECT_NE(message.find(path.string()), std::string::npos) << message;
  message = thrown_message<DataError>([&] { sequential.fill(100, 1, inputs.data(), targets.data()); });
  EXPECT_NE(message.find("shrank while in use"), std::string::npos) << message;
  EXPECT_THROW((void)file.read(49'999, 2), std::out_of_range);  // past the end it had: a caller's bug
}

// Rewritten in place with ids the model has no embedding for: refused like at opening.
TEST(TokenFile, IdsAreCheckedOnEveryRead) {
  ScratchDir dir;
  const auto path = dir / "train.bin";
  write_nanogpt(path, counting_tokens(100));
  const auto file = TokenFile::open(path, 100);
  auto tokens = counting_tokens(100);
  tokens[42] = 65535;
  write_nanogpt(path, tokens);  // same size, truncated and rewritten
  std::vector<std::int32_t> window(10);
  const auto message = thrown_message<DataError>([&] { file.read(40, 10, window.data()); });
  EXPECT_NE(message.find(path.string()), std::string::npos) << message;
  EXPECT_NE(message.find("index 42 has id 65535"), std::string::npos) << message;
}

TEST(TokenFile, WritingIntoMissingDirectoryIsADataError) {
  ScratchDir dir;
  const auto message = thrown_message<DataError>([&] { write_llmc_shard(dir / "nope" / "x.bin", counting_tokens(3)); });
  EXPECT_NE(message.find("x.bin"), std::string::npos) << message;
  EXPECT_THROW(write_llmc_shard(dir / "x.bin", {}), DataError);
}

// ---- TokenDataset ------------------------------------------------------------------------

TEST(TokenDataset, DirectoryReadsSortedBinFilesOnly) {
  ScratchDir dir;
  write_llmc_shard(dir / "b.bin", counting_tokens(5, 100));
  write_nanogpt(dir / "a.bin", counting_tokens(4));
  write_bytes(dir / "notes.txt", {1, 2, 3});
  const auto dataset = TokenDataset::open(dir.path().string(), kVocab);
  ASSERT_EQ(dataset.files().size(), 2u);
  EXPECT_EQ(dataset.files()[0].path().filename(), "a.bin");
  EXPECT_EQ(dataset.files()[1].path().filename(), "b.bin");
  EXPECT_EQ(dataset.total_tokens(), 9u);

  ScratchDir empty;
  EXPECT_NE(thrown_message<DataError>([&] { TokenDataset::open(empty.path().string(), kVocab); }).find("no *.bin"),
            std::string::npos);
}

TEST(TokenDataset, GlobPatternSelectsMatchingFiles) {
  ScratchDir dir;
  write_llmc_shard(dir / "train_001.bin", counting_tokens(5));
  write_llmc_shard(dir / "train_000.bin", counting_tokens(6));
  write_llmc_shard(dir / "val_000.bin", counting_tokens(7));
  const auto dataset = TokenDataset::open((dir / "train_*.bin").string(), kVocab);
  ASSERT_EQ(dataset.files().size(), 2u);
  EXPECT_EQ(dataset.files()[0].path().filename(), "train_000.bin");
  EXPECT_EQ(dataset.total_tokens(), 11u);

  const std::string pattern = (dir / "test_*.bin").string();
  const auto message = thrown_message<DataError>([&] { TokenDataset::open(pattern, kVocab); });
  EXPECT_NE(message.find(pattern), std::string::npos) << message;
  EXPECT_THROW(TokenDataset::open((dir / "absent.bin").string(), kVocab), DataError);
}

TEST(TokenDataset, WindowsNeverCrossFiles) {
  ScratchDir dir;
  write_nanogpt(dir / "a.bin", counting_tokens(5, 0));    // 0..4
  write_nanogpt(dir / "b.bin", counting_tokens(3, 100));  // 100..102
  const auto dataset = TokenDataset::open(dir.path().string(), kVocab);
  EXPECT_EQ(dataset.window_count(3), 3u + 1u);
  EXPECT_EQ(dataset.window_count(4), 2u);
  EXPECT_EQ(dataset.window_count(6), 0u);
  std::vector<std::int32_t> window(3);
  dataset.read_window(2, 3, window.data());
  EXPECT_EQ(window, (std::vector<std::int32_t>{2, 3, 4}));
  dataset.read_window(3, 3, window.data());
  EXPECT_EQ(window, (std::vector<std::int32_t>{100, 101, 102}));
  EXPECT_THROW(dataset.read_window(4, 3, window.data()), std::out_of_range);
}

// ---- samplers ----------------------------------------------------------------------------

namespace {

// Two files with disjoint runs of consecutive ids, so a window that crossed the file
// boundary or skipped a token would show as a break in the sequence.
struct TwoFileData {
  ScratchDir dir;
  TokenDataset dataset;
  TwoFileData() {
    write_llmc_shard(dir / "a.bin", counting_tokens(100, 0));
    write_llmc_shard(dir / "b.bin", counting_tokens(40, 1000));
    dataset = TokenDataset::open(dir.path().string(), kVocab);
  }
};

}  // namespace

TEST(RandomWindowSampler, SampleIsAPureFunctionOfSeedAndIndex) {
  TwoFileData data;
  constexpr int T = 8, B = 16;
  const RandomWindowSampler sampler(data.dataset, T, 1234);
  std::vector<std::int32_t> inputs(B * T), targets(B * T), again(B * T), again_targets(B * T);
  sampler.fill(0, B, inputs.data(), targets.data());
  RandomWindowSampler(data.dataset, T, 1234).fill(0, B, again.data(), again_targets.data());
  EXPECT_EQ(inputs, again);
  EXPECT_EQ(targets, again_targets);

  // Sample 5 alone equals row 5 of the batch (ranks can split a batch by sample index).
  std::vector<std::int32_t> one(T), one_targets(T);
  sampler.fill(5, 1, one.data(), one_targets.data());
  EXPECT_TRUE(std::equal(one.begin(), one.end(), inputs.begin() + 5 * T));

  RandomWindowSampler(data.dataset, T, 1235).fill(0, B, again.data(), again_targets.data());
  EXPECT_NE(inputs, again);
}

TEST(RandomWindowSampler, WindowsStayInsideOneFileAndTargetsAreShiftedByOne) {
  TwoFileData data;
  constexpr int T = 30, B = 2000;
  std::vector<std::int32_t> inputs(B * T), targets(B * T);
  RandomWindowSampler(data.dataset, T, 7).fill(0, B, inputs.data(), targets.data());
  std::set<std::int32_t> starts;
  for (int b = 0; b < B; ++b) {
    const std::int32_t* in = inputs.data() + b * T;
    const std::int32_t* tg = targets.data() + b * T;
    for (int t = 0; t < T; ++t) {
      ASSERT_EQ(tg[t], in[t] + 1) << "sample " << b << " position " << t;
      if (t > 0) {
        ASSERT_EQ(in[t], in[t - 1] + 1) << "sample " << b << " position " << t;
      }
    }
    const bool in_a = in[0] >= 0 && in[0] + T + 1 <= 100;
    const bool in_b = in[0] >= 1000 && in[0] + T + 1 <= 1040;
    EXPECT_TRUE(in_a || in_b) << "window starting at id " << in[0];
    starts.insert(in[0]);
  }
  // 70 starts in a.bin + 10 in b.bin; 2000 uniform draws reach every one of them (the
  // chance of missing one is below 80 · (79/80)^2000 < 1e-8, and the seed is fixed).
  EXPECT_EQ(starts.size(), 80u);
}

TEST(RandomWindowSampler, DatasetTooSmallNamesFilesAndSizes) {
  TwoFileData data;
  const auto message = thrown_message<DataError>([&] { RandomWindowSampler(data.dataset, 100, 0); });
  EXPECT_NE(message.find("a.bin"), std::string::npos) << message;
  EXPECT_NE(message.find("100 tokens"), std::string::npos) << message;
  EXPECT_NE(message.find("101"), std::string::npos) << message;
  EXPECT_THROW(RandomWindowSampler(data.dataset, 0, 0), DataError);
}

TEST(SequentialWindowSampler, CoversEachFileInOrderAtStrideSeqLen) {
  ScratchDir dir;
  write_nanogpt(dir / "a.bin", counting_tokens(10, 0));   // windows at 0, 3, 6
  write_nanogpt(dir / "b.bin", counting_tokens(7, 100));  // windows at 100, 103
  const auto dataset = TokenDataset::open(dir.path().string(), kVocab);
  constexpr int T = 3;
  const SequentialWindowSampler sampler(dataset, T);
  ASSERT_EQ(sampler.window_count(), 5u);

  std::vector<std::int32_t> inputs(8 * T, -1), targets(8 * T, -1);
  ASSERT_EQ(sampler.fill(0, 8, inputs.data(), targets.data()), 5);
  const std::vector<std::int32_t> expected_inputs{0, 1, 2, 3, 4, 5, 6, 7, 8, 100, 101, 102, 103, 104, 105};
  EXPECT_TRUE(std::equal(expected_inputs.begin(), expected_inputs.end(), inputs.begin()));
  for (std::size_t i = 0; i < expected_inputs.size(); ++i) EXPECT_EQ(targets[i], inputs[i] + 1);

  // A batch starting mid-stream, cut short by the end.
  ASSERT_EQ(sampler.fill(4, 2, inputs.data(), targets.data()), 1);
  EXPECT_EQ(inputs[0], 103);
  EXPECT_EQ(sampler.fill(5, 2, inputs.data(), targets.data()), 0);
}
