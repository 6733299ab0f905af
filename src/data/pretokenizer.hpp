// GPT-2's pre-tokenizer: cuts text into the pieces that BPE encodes one at a time.
//
// Pattern (tiktoken r50k/gpt2):
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// run by PCRE2 in UTF + UCP mode with JIT. `\s` is spelled out as the Unicode White_Space
// property (what tiktoken's Rust regex means by \s), because PCRE2's own \s differs from it
// (PCRE2 adds U+180E).
//
// The input may be any bytes: it is cut into maximal runs of valid UTF-8, which the pattern
// splits, and invalid bytes, each of which is a piece by itself.
#pragma once

#include <functional>
#include <memory>
#include <string_view>
#include <vector>

namespace pope {

class Gpt2PreTokenizer {
 public:
  // Compiles the pattern. Throws TokenizerError in a build without PCRE2.
  Gpt2PreTokenizer();
  ~Gpt2PreTokenizer();
  Gpt2PreTokenizer(Gpt2PreTokenizer&&) noexcept;
  Gpt2PreTokenizer& operator=(Gpt2PreTokenizer&&) noexcept;

  // Calls `on_piece` with each piece of `text`, in order; the pieces are views into `text` and
  // cover it. Thread-safe.
  void split(std::string_view text, const std::function<void(std::string_view)>& on_piece) const;

 private:
  struct Pattern;
  std::unique_ptr<Pattern> pattern_;
};

// Cuts `text` into chunks of at least `target_bytes` (except the last) whose separate
// encodings concatenate to the encoding of the whole, so one long document can be encoded on
// several threads. A cut goes only between "X\n" and "Y" where X and Y are printable non-space
// ASCII: no piece spans the "\n" there, and "\n" before a non-space is a piece "\n" in the
// whole text just as at the end of a chunk (the lookahead of \s+(?!\S) cannot tell them apart).
// Text with no such place is one chunk. Holds for SpecialTokens::as_text.
std::vector<std::string_view> split_at_safe_boundaries(std::string_view text, std::size_t target_bytes);

// The length of the well-formed UTF-8 sequence starting at text[0] (Unicode Table 3-7: no
// overlong forms, surrogates or code points above U+10FFFF), or 0 when there is none.
std::size_t utf8_sequence_length(std::string_view text);

}  // namespace pope
