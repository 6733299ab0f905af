// Collects a split's tokens and writes them as llm.c token files: shards of a fixed number of
// tokens (documents may straddle two shards, as in llm.c), or one file.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

namespace pope {

class ShardWriter {
 public:
  // Files `dir`/`stem`_NNNNNN.bin of `shard_tokens` tokens each (the last may be shorter), or
  // `dir`/`stem`.bin when shard_tokens is 0. shard_tokens must fit an llm.c header (< 2^31).
  ShardWriter(std::filesystem::path dir, std::string stem, std::uint64_t shard_tokens);

  void append(std::span<const std::uint16_t> tokens);
  // Writes what is buffered; a split without tokens writes nothing.
  void finish();

  std::uint64_t tokens() const { return tokens_; }
  const std::vector<std::filesystem::path>& files() const { return files_; }

 private:
  void write_shard(std::span<const std::uint16_t> tokens);

  std::filesystem::path dir_;
  std::string stem_;
  std::uint64_t shard_tokens_;
  std::vector<std::uint16_t> buffer_;
  std::uint64_t tokens_ = 0;
  std::vector<std::filesystem::path> files_;
};

}  // namespace pope
