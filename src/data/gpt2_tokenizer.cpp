#include <utility>

#include "data/bpe_merge.hpp"
#include "data/gpt2_vocabulary.hpp"
#include "data/pretokenizer.hpp"
#include "pope/tokenizer.hpp"

namespace pope {

struct Gpt2Tokenizer::Impl {
  Gpt2Vocabulary vocabulary;
  Gpt2PreTokenizer pre_tokenizer;

  // Text without special tokens: pre-tokenize, then each piece is one id when it is a whole
  // token (tiktoken's shortcut, which BPE need not reproduce) or else its BPE parts.
  void encode_ordinary(std::string_view text, std::vector<std::uint16_t>& out) const {
    out.reserve(out.size() + text.size() / 4);  // English averages over 4 bytes per token
    pre_tokenizer.split(text, [&](std::string_view piece) {
      const std::uint32_t id = vocabulary.ranks.find(piece);
      if (id != BpeRanks::kNone)
        out.push_back(static_cast<std::uint16_t>(id));
      else
        bpe_merge_bounded(piece, vocabulary.ranks, out);
    });
  }
};

Gpt2Tokenizer::Gpt2Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Gpt2Tokenizer::Gpt2Tokenizer(Gpt2Tokenizer&&) noexcept = default;
Gpt2Tokenizer& Gpt2Tokenizer::operator=(Gpt2Tokenizer&&) noexcept = default;
Gpt2Tokenizer::~Gpt2Tokenizer() = default;

Gpt2Tokenizer Gpt2Tokenizer::load(const std::filesystem::path& dir) {
  // The pre-tokenizer first: without PCRE2 that error is the one worth seeing.
  Gpt2PreTokenizer pre_tokenizer;
  return Gpt2Tokenizer(std::make_unique<Impl>(Impl{load_gpt2_vocabulary(dir), std::move(pre_tokenizer)}));
}

Gpt2Tokenizer Gpt2Tokenizer::load_default(const std::filesystem::path& explicit_dir) {
  return load(find_tokenizer_dir(explicit_dir));
}

void Gpt2Tokenizer::encode(std::string_view text, std::vector<std::uint16_t>& out, SpecialTokens special) const {
  if (special == SpecialTokens::allowed) {
    for (std::size_t at = text.find(kGpt2EndOfTextText); at != std::string_view::npos;
         at = text.find(kGpt2EndOfTextText)) {
      impl_->encode_ordinary(text.substr(0, at), out);
      out.push_back(kGpt2EndOfText);
      text.remove_prefix(at + kGpt2EndOfTextText.size());
    }
  }
  impl_->encode_ordinary(text, out);
}

std::vector<std::uint16_t> Gpt2Tokenizer::encode(std::string_view text, SpecialTokens special) const {
  std::vector<std::uint16_t> ids;
  encode(text, ids, special);
  return ids;
}

std::string_view Gpt2Tokenizer::token_bytes(std::uint16_t id) const {
  if (id >= kGpt2VocabSize)
    throw TokenizerError("token id " + std::to_string(id) + " is outside the GPT-2 vocabulary (ids 0.." +
                         std::to_string(kGpt2VocabSize - 1) + ")");
  return impl_->vocabulary.token_bytes[id];
}

std::string Gpt2Tokenizer::decode(std::span<const std::uint16_t> ids) const {
  std::string bytes;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] >= kGpt2VocabSize)
      throw TokenizerError("token " + std::to_string(i) + " has id " + std::to_string(ids[i]) +
                           ", outside the GPT-2 vocabulary (ids 0.." + std::to_string(kGpt2VocabSize - 1) + ")");
    bytes += impl_->vocabulary.token_bytes[ids[i]];
  }
  return bytes;
}

}  // namespace pope
