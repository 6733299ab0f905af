#include "data/shard_writer.hpp"

#include <cstdio>

#include "pope/data.hpp"

namespace pope {

ShardWriter::ShardWriter(std::filesystem::path dir, std::string stem, std::uint64_t shard_tokens)
    : dir_(std::move(dir)), stem_(std::move(stem)), shard_tokens_(shard_tokens) {
  if (shard_tokens_ > static_cast<std::uint64_t>(INT32_MAX))
    throw DataError("shard size " + std::to_string(shard_tokens_) + " tokens does not fit the llm.c header (at most " +
                    std::to_string(INT32_MAX) + ")");
}

void ShardWriter::append(std::span<const std::uint16_t> tokens) {
  tokens_ += tokens.size();
  while (!tokens.empty()) {
    const std::size_t room = shard_tokens_ == 0 ? tokens.size() : shard_tokens_ - buffer_.size();
    const std::size_t take = std::min(room, tokens.size());
    buffer_.insert(buffer_.end(), tokens.begin(), tokens.begin() + static_cast<std::ptrdiff_t>(take));
    tokens = tokens.subspan(take);
    if (shard_tokens_ != 0 && buffer_.size() == shard_tokens_) {
      write_shard(buffer_);
      buffer_.clear();
    }
  }
}

void ShardWriter::finish() {
  if (!buffer_.empty()) write_shard(buffer_);
  buffer_.clear();
  buffer_.shrink_to_fit();
}

void ShardWriter::write_shard(std::span<const std::uint16_t> tokens) {
  if (shard_tokens_ == 0 && tokens.size() > static_cast<std::size_t>(INT32_MAX))
    throw DataError(stem_ + ": " + std::to_string(tokens.size()) +
                    " tokens do not fit one llm.c file; give a shard size (--shard-tokens)");
  std::string name = stem_;
  if (shard_tokens_ != 0) {
    char index[16];
    std::snprintf(index, sizeof index, "_%06zu", files_.size());
    name += index;
  }
  files_.push_back(dir_ / (name + ".bin"));
  write_llmc_shard(files_.back(), tokens);
}

}  // namespace pope
