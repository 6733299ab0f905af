// OpenAI's GPT-2 vocabulary files, verified and turned into the tables the tokenizer uses.
//
// vocab.bpe is the source of the ranks, as in tiktoken: the 256 single bytes first (in the code
// point order of their GPT-2 characters), then merge i of the file has rank 256 + i. encoder.json
// must agree (every token's id equals its rank) and adds <|endoftext|> = 50256.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "data/bpe_merge.hpp"

namespace pope {

struct Gpt2Vocabulary {
  BpeRanks ranks;                        // token bytes → id (without <|endoftext|>)
  std::vector<std::string> token_bytes;  // id → bytes, all 50257 ids
};

// Reads `dir`/encoder.json and `dir`/vocab.bpe, checks their pinned sha256 and their agreement.
// Throws TokenizerError naming the file and what was expected.
Gpt2Vocabulary load_gpt2_vocabulary(const std::filesystem::path& dir);

// Where find_tokenizer_dir looks when neither a directory nor $POPE_TOKENIZER_DIR is given, in
// order, without repeats: data/tokenizer in `cwd` and every directory above it; then, when
// `exe_dir` (the running binary's directory) is known, `exe_dir`/../share/pope/tokenizer (an
// installed prefix) and data/tokenizer in `exe_dir` and every directory above it (a build tree
// inside the checkout, run from anywhere).
std::vector<std::filesystem::path> tokenizer_search_dirs(const std::filesystem::path& cwd,
                                                         const std::filesystem::path& exe_dir);

}  // namespace pope
