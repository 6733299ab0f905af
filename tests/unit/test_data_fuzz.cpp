// Robustness of the file parsers: random byte flips, truncations and appended junk applied
// to valid token files and safetensors files must end in the parser's own exception type
// (DataError, CheckpointError) or in a consistent result, never in a crash or another
// exception. The generator is seeded, so a failure reproduces.
#include <gtest/gtest.h>

#include <cstring>

#include "pope/checkpoint.hpp"
#include "pope/data.hpp"
#include "pope/rng.hpp"
#include "scratch_dir.hpp"

using namespace pope;
using pope::testing::read_bytes;
using pope::testing::ScratchDir;
using pope::testing::write_bytes;

namespace {

constexpr int kIterations = 300;

enum class Damage { flip, truncate, append };

struct Mutation {
  Damage damage;
  std::vector<std::uint8_t> bytes;
};

// Flips up to 8 random bytes (within the first `focus` bytes half of the time, where the
// headers live), truncates to a random shorter length, or appends 1–16 random bytes.
Mutation mutate(const std::vector<std::uint8_t>& original, std::size_t focus, Rng& rng) {
  Mutation m{static_cast<Damage>(rng.below(3)), original};
  switch (m.damage) {
    case Damage::flip: {
      const std::size_t range = rng.below(2) == 0 ? std::min(focus, original.size()) : original.size();
      const auto flips = 1 + rng.below(8);
      for (std::uint64_t i = 0; i < flips; ++i)
        m.bytes[rng.below(range)] ^= static_cast<std::uint8_t>(1 + rng.below(255));
      break;
    }
    case Damage::truncate: m.bytes.resize(rng.below(original.size())); break;
    case Damage::append: {
      const auto extra = 1 + rng.below(16);
      for (std::uint64_t i = 0; i < extra; ++i) m.bytes.push_back(static_cast<std::uint8_t>(rng.below(256)));
      break;
    }
  }
  return m;
}

}  // namespace

TEST(Fuzz, DamagedTokenFilesThrowDataErrorOrStayValid) {
  ScratchDir dir;
  constexpr int kVocab = 1000;
  std::vector<std::uint16_t> tokens(300);
  for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<std::uint16_t>(i * 7 % kVocab);
  write_llmc_shard(dir / "valid.bin", tokens);
  const auto llmc = read_bytes(dir / "valid.bin");

  Rng rng(2024);
  int rejected = 0;
  for (int iteration = 0; iteration < kIterations; ++iteration) {
    const auto m = mutate(llmc, 1024, rng);
    write_bytes(dir / "damaged.bin", m.bytes);
    try {
      const auto file = TokenFile::open(dir / "damaged.bin", kVocab);
      // Accepted: the result must still be a consistent token file.
      EXPECT_EQ(m.damage, Damage::flip) << "iteration " << iteration << ": a resized shard was accepted";
      for (auto id : file.read(0, file.size())) ASSERT_LT(id, kVocab) << "iteration " << iteration;
    } catch (const DataError&) {
      ++rejected;
    }
  }
  EXPECT_GT(rejected, kIterations / 2);  // every truncation and append, most header flips
}

// Flips confined to an llm.c header are always reported as a broken llm.c file, never read
// as headerless tokens (whose first bad id would be the message).
TEST(Fuzz, FlipsInsideTheLlmcHeaderAreReportedAsHeaderDamage) {
  ScratchDir dir;
  write_llmc_shard(dir / "valid.bin", std::vector<std::uint16_t>(300, 42));
  const auto llmc = read_bytes(dir / "valid.bin");
  Rng rng(35);
  for (int iteration = 0; iteration < kIterations; ++iteration) {
    auto bytes = llmc;
    const auto flips = 1 + rng.below(8);
    for (std::uint64_t i = 0; i < flips; ++i) bytes[rng.below(1024)] ^= static_cast<std::uint8_t>(1 + rng.below(255));
    write_bytes(dir / "damaged.bin", bytes);
    try {
      TokenFile::open(dir / "damaged.bin", 50257);
      ADD_FAILURE() << "iteration " << iteration << ": a damaged header was accepted";
    } catch (const DataError& error) {
      const std::string message = error.what();
      EXPECT_NE(message.find("llm.c"), std::string::npos) << "iteration " << iteration << ": " << message;
      EXPECT_EQ(message.find("token at index"), std::string::npos) << "iteration " << iteration << ": " << message;
    }
  }
}

TEST(Fuzz, DamagedSafetensorsThrowCheckpointErrorOrStayConsistent) {
  ScratchDir dir;
  std::vector<SafetensorsTensor> tensors;
  for (int i = 0; i < 4; ++i) {
    const DType dtype = i % 2 == 0 ? DType::f32 : DType::bf16;
    SafetensorsTensor t{"layers." + std::to_string(i) + ".weight", dtype, {3, i + 1}, {}};
    t.bytes.assign(static_cast<std::size_t>(shape_numel(t.shape)) * dtype_size(dtype), static_cast<std::uint8_t>(i));
    tensors.push_back(std::move(t));
  }
  write_safetensors(dir / "valid.safetensors", tensors, {{"format", "pope"}});
  const auto valid = read_bytes(dir / "valid.safetensors");
  std::uint64_t header_end = 0;
  std::memcpy(&header_end, valid.data(), 8);
  header_end += 8;

  Rng rng(7);
  int rejected = 0;
  for (int iteration = 0; iteration < kIterations; ++iteration) {
    const auto m = mutate(valid, header_end, rng);
    write_bytes(dir / "damaged.safetensors", m.bytes);
    try {
      const auto contents = read_safetensors(dir / "damaged.safetensors");
      EXPECT_EQ(m.damage, Damage::flip) << "iteration " << iteration << ": a resized file was accepted";
      for (const auto& t : contents.tensors)
        ASSERT_EQ(t.bytes.size(), static_cast<std::size_t>(shape_numel(t.shape)) * dtype_size(t.dtype))
            << "iteration " << iteration << ", tensor " << t.name;
    } catch (const CheckpointError& error) {
      EXPECT_NE(std::string(error.what()).find("damaged.safetensors"), std::string::npos) << error.what();
      ++rejected;
    }
  }
  EXPECT_GT(rejected, kIterations / 2);  // every truncation and append, most header flips
}
