// The incomplete marker of a token directory that pope-data tokenize has not finished: every
// way of naming the data refuses it, naming the directory and what to do.
#include <gtest/gtest.h>

#include <numeric>

#include "data/dataset_marker.hpp"
#include "pope/data.hpp"
#include "scratch_dir.hpp"

using namespace pope;
using pope::testing::ScratchDir;
using pope::testing::thrown_message;

namespace {

constexpr int kVocab = 50257;

std::vector<std::uint16_t> some_tokens() {
  std::vector<std::uint16_t> tokens(64);
  std::iota(tokens.begin(), tokens.end(), std::uint16_t{1});
  return tokens;
}

}  // namespace

TEST(DatasetMarker, EveryWayOfNamingAnIncompleteDatasetIsRefused) {
  ScratchDir dir;
  mark_dataset_incomplete(dir.path());
  write_llmc_shard(dir / "train_000000.bin", some_tokens());
  for (const std::string spec : {dir.path().string(), (dir / "train_000000.bin").string(), (dir / "train_*.bin").string()}) {
    const std::string message = thrown_message<DataError>([&] { TokenDataset::open(spec, kVocab); });
    EXPECT_NE(message.find("is incomplete"), std::string::npos) << spec << ": " << message;
    EXPECT_NE(message.find((dir / "tokenize.incomplete").string()), std::string::npos) << message;
    EXPECT_NE(message.find("run pope-data tokenize again"), std::string::npos) << message;
  }
  mark_dataset_complete(dir.path());
  EXPECT_FALSE(std::filesystem::exists(dir / "tokenize.incomplete"));
  EXPECT_EQ(TokenDataset::open(dir.path().string(), kVocab).total_tokens(), 64u);
}

TEST(DatasetMarker, RunStoppedBeforeItsFirstShardIsIncompleteNotEmpty) {
  ScratchDir dir;
  mark_dataset_incomplete(dir.path());
  const std::string message = thrown_message<DataError>([&] { TokenDataset::open(dir.path().string(), kVocab); });
  EXPECT_NE(message.find("is incomplete"), std::string::npos) << message;
}

TEST(DatasetMarker, FilesWrittenByOtherToolsCarryNoMarkerAndStayReadable) {
  ScratchDir dir;
  write_llmc_shard(dir / "val.bin", some_tokens());
  EXPECT_NO_THROW(check_dataset_complete(dir.path()));
  EXPECT_EQ(TokenDataset::open((dir / "val.bin").string(), kVocab).total_tokens(), 64u);
}
