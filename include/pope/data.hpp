// Token files and batch samplers.
//
// Two on-disk formats, detected automatically:
//   llm.c shard: 256 × int32 header (magic 20240520, version 1, token count, rest 0) then
//                the tokens as uint16 little-endian;
//   nanoGPT:     headerless uint16 little-endian tokens (train.bin / val.bin).
// Files are validated when opened (size, header, every id < vocab) and then read with pread(2)
// from a descriptor kept open: a file truncated while in use is a DataError naming it, never the
// SIGBUS that reading a mapping past the file's new end gives.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace pope {

// A malformed or unreadable data file; the message names the file and what was expected.
class DataError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class TokenFileFormat { llmc, nanogpt };

constexpr std::int32_t kLlmcMagic = 20240520;
constexpr std::int32_t kLlmcVersion = 1;
constexpr std::size_t kLlmcHeaderInts = 256;

class TokenFile {
 public:
  // Opens and validates; vocab_size > 0 checks every id (an id ≥ vocab_size is an error
  // naming its index). Throws DataError.
  static TokenFile open(const std::filesystem::path& path, int vocab_size);

  // Copies tokens [first, first + count) to `out` (first + count ≤ size()). Throws DataError
  // naming the file when it has shrunk since it was opened or now holds an id ≥ vocab_size.
  // Thread-safe: copies of a TokenFile share one descriptor, and pread has no file position.
  void read(std::size_t first, std::size_t count, std::uint16_t* out) const;
  void read(std::size_t first, std::size_t count, std::int32_t* out) const;
  std::vector<std::uint16_t> read(std::size_t first, std::size_t count) const;
  // Calls on_chunk(first, tokens) for consecutive chunks covering every token (bounded memory
  // for files of any size). Throws as read does.
  void scan(const std::function<void(std::size_t first, std::span<const std::uint16_t>)>& on_chunk) const;

  std::size_t size() const { return count_; }
  TokenFileFormat format() const { return format_; }
  const std::filesystem::path& path() const { return path_; }

 private:
  void read_checked(std::size_t first, std::size_t count, std::uint16_t* out) const;

  std::filesystem::path path_;
  TokenFileFormat format_ = TokenFileFormat::nanogpt;
  std::shared_ptr<const int> fd_;  // closed when the last copy goes away
  std::uint64_t file_bytes_ = 0;   // the size when opened
  std::uint64_t offset_ = 0;       // bytes before the first token (the llm.c header)
  std::size_t count_ = 0;
  int vocab_size_ = 0;
};

// Writes an llm.c shard atomically (temp file, fsync, rename). Throws DataError.
void write_llmc_shard(const std::filesystem::path& path, std::span<const std::uint16_t> tokens);

// One or more token files read as one stream: `spec` is a file, a directory (every *.bin
// inside, sorted) or a glob pattern over file names ("data/owt/train_*.bin").
class TokenDataset {
 public:
  static TokenDataset open(const std::string& spec, int vocab_size);
  const std::vector<TokenFile>& files() const { return files_; }
  std::size_t total_tokens() const;

  // Number of distinct windows of `length` tokens that fit inside single files.
  std::uint64_t window_count(int length) const;
  // Copies the window whose start is the `index`-th valid start (in file order).
  void read_window(std::uint64_t start_index, int length, std::int32_t* out) const;

 private:
  std::vector<TokenFile> files_;
};

// Training windows at random offsets. Sample i of the run is a pure function of (seed, i),
// so the sampler's state is one counter: resume restores it exactly, and ranks can take
// disjoint sample indices of the same global batch.
class RandomWindowSampler {
 public:
  RandomWindowSampler(const TokenDataset& dataset, int seq_len, std::uint64_t seed);
  // Fills inputs/targets [batch × seq_len] with samples first_sample .. first_sample+batch−1.
  void fill(std::uint64_t first_sample, int batch, std::int32_t* inputs, std::int32_t* targets) const;

 private:
  const TokenDataset* dataset_;
  int seq_len_;
  std::uint64_t seed_;
};

// Validation windows in order: window w covers tokens [w·T, w·T + T + 1) of the stream
// (within one file).
class SequentialWindowSampler {
 public:
  SequentialWindowSampler(const TokenDataset& dataset, int seq_len);
  std::uint64_t window_count() const;
  // Fills up to `batch` windows starting at window `first`; returns how many were filled.
  int fill(std::uint64_t first, int batch, std::int32_t* inputs, std::int32_t* targets) const;

 private:
  const TokenDataset* dataset_;
  int seq_len_;
  std::vector<std::uint64_t> windows_per_file_;
};

// The i-th of `wanted` window indices spread evenly over `windows` (i < wanted ≤ windows):
// ⌊i·windows/wanted⌋. The trainer's validation windows, and pope-eval --max-windows, which
// must pick the same ones.
std::uint64_t spread_window_index(std::uint64_t i, std::uint64_t wanted, std::uint64_t windows);

}  // namespace pope
