// Text corpora → GPT-2 token files (the engine of `pope-data tokenize`).
//
// Inputs are files or directories (walked recursively, in sorted order, hidden entries
// skipped). Each file is recognised by content, then by name:
//   xz or gzip (magic bytes)  → decompressed and recognised again (name without .xz/.gz);
//   tar (ustar magic)         → each regular member recognised again (the OpenWebText release is
//                               a tar.xz whose members are tar.xz subsets of .txt documents);
//   name ending in .jsonl     → one document per non-blank line: that JSON object's text field;
//   anything else             → one document: the file's bytes.
// Empty documents are skipped; documents containing NUL bytes are rejected as not text.
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "pope/tokenizer.hpp"

namespace pope {

// Host memory ran out while reading or tokenizing a corpus (std::bad_alloc says nothing by
// itself): the message names the stage and the file or documents.
class OutOfMemoryError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct Document {
  std::string name;  // where it came from: path, then "/member" inside archives, ":line" in JSONL
  std::string text;
};

struct CorpusReadOptions {
  std::string text_field = "text";  // the JSONL field holding a document's text
};

// Calls `on_document` for every document of `inputs`, in a fixed order. When given,
// `input_bytes_read` counts the bytes read from the input files (compressed size), for
// progress. Throws DataError naming the file (member, line) and what was expected, and
// OutOfMemoryError naming the file being read (a document is held in memory whole).
void read_corpus(const std::vector<std::filesystem::path>& inputs, const CorpusReadOptions& options,
                 const std::function<void(Document&&)>& on_document,
                 std::atomic<std::uint64_t>* input_bytes_read = nullptr);

// The total size of the files read_corpus would open (the denominator of the progress bar).
std::uint64_t corpus_input_bytes(const std::vector<std::filesystem::path>& inputs);

struct TokenizeOptions {
  std::filesystem::path out_dir;
  // Document-level split: document i (in read order) goes to val when a hash of (seed, i) falls
  // below val_fraction, so the split is fixed by (corpus, seed) whatever the thread count. A
  // corpus of one document is split by tokens instead: its last ⌈val_fraction · tokens⌉ tokens
  // (the <|endoftext|> after it included) go to val, the rest to train.
  double val_fraction = 0.0005;
  std::uint64_t seed = 2357;
  // Tokens per llm.c shard: out_dir/{train,val}_NNNNNN.bin; 0: one file per split,
  // out_dir/train.bin and out_dir/val.bin.
  std::uint64_t shard_tokens = 100'000'000;
  // One file per document instead, out_dir/<document's file name without extensions>.bin, no split.
  bool per_document = false;
  bool overwrite = false;  // otherwise existing output files are an error
  int threads = 0;         // 0: every core
  bool progress = true;    // a progress bar on stderr when it is a terminal
  CorpusReadOptions read;
};

struct TokenizeSummary {
  std::uint64_t documents = 0, train_documents = 0, val_documents = 0;
  std::uint64_t train_tokens = 0, val_tokens = 0;
  bool split_by_tokens = false;  // one document, split by tokens (it counts in train and in val)
  std::uint64_t text_bytes = 0;  // uncompressed document bytes
  double seconds = 0;      // wall clock
  double cpu_seconds = 0;  // CPU time of all threads: throughput per core even on a busy machine
  std::vector<std::filesystem::path> files;  // written, in order
};

// Tokenizes every document (<|endoftext|> in a document is plain text) and appends
// <|endoftext|> after each; writes llm.c token files. Throws DataError / TokenizerError, and
// OutOfMemoryError naming the file being read or the documents being encoded.
TokenizeSummary tokenize_corpus(const Gpt2Tokenizer& tokenizer, const std::vector<std::filesystem::path>& inputs,
                                const TokenizeOptions& options);

}  // namespace pope
