// The parts of `pope-data tokenize` below the CLI: safe cut points for parallel encoding, the
// shard writer, the corpus reader's formats and errors, and the pipeline's determinism.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "data/corpus_reader_sources.hpp"
#include "data/corpus_reader_tar.hpp"
#include "data/pretokenizer.hpp"
#include "data/shard_writer.hpp"
#include "pope/corpus.hpp"
#include "pope/data.hpp"

using namespace pope;
namespace fs = std::filesystem;

namespace {

class TempDir {
 public:
  TempDir() : path_(fs::temp_directory_path() / ("pope_corpus_test_" + std::to_string(::getpid()) + "_" +
                                                 std::to_string(counter_++))) {
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }
  fs::path write(const std::string& name, const std::string& bytes) const {
    const fs::path file = path_ / name;
    fs::create_directories(file.parent_path());
    std::ofstream(file, std::ios::binary) << bytes;
    return file;
  }

 private:
  static inline int counter_ = 0;
  fs::path path_;
};

std::vector<Document> read_all(const std::vector<fs::path>& inputs, CorpusReadOptions options = {}) {
  std::vector<Document> documents;
  read_corpus(inputs, options, [&](Document&& d) { documents.push_back(std::move(d)); });
  return documents;
}

std::string data_error_of(const std::function<void()>& action) {
  try {
    action();
  } catch (const DataError& e) {
    return e.what();
  }
  return "no DataError";
}

[[maybe_unused]] fs::path tokenizer_dir() { return fs::path(POPE_SOURCE_DIR) / "data" / "tokenizer"; }

}  // namespace

TEST(SafeBoundaries, CutOnlyBetweenPrintableNewlinePrintable) {
  const std::string text = "aaaa\nbbbb\n\ncccc \ndddd\neeee";
  const auto chunks = split_at_safe_boundaries(text, 3);
  std::string joined;
  for (auto c : chunks) joined += c;
  EXPECT_EQ(joined, text);
  // Allowed cuts: after "aaaa\n" and after "dddd\n"; not inside "\n\n" nor after " \n".
  ASSERT_EQ(chunks.size(), 3u);
  EXPECT_EQ(chunks[0], "aaaa\n");
  EXPECT_EQ(chunks[1], "bbbb\n\ncccc \ndddd\n");
  EXPECT_EQ(chunks[2], "eeee");
  EXPECT_EQ(split_at_safe_boundaries("no newline at all", 2).size(), 1u);
  EXPECT_EQ(split_at_safe_boundaries("short\ntext", 100).size(), 1u);
}

#ifdef POPE_HAVE_PCRE2
TEST(SafeBoundaries, ChunkEncodingsConcatenateToTheWholeEncoding) {
  if (!fs::exists(tokenizer_dir() / "encoder.json")) GTEST_SKIP() << "run scripts/fetch_tokenizer.sh";
  const Gpt2Tokenizer tokenizer = Gpt2Tokenizer::load(tokenizer_dir());
  // Text that tempts every rule near newlines: runs of spaces/newlines, contractions, digits,
  // non-ASCII letters, CRLF.
  std::string text;
  const char* lines[] = {"It's here\n", "  indented\n", "'ll do\n", "\n\n", "x\r\n", "123\n", "caf\xC3\xA9\n",
                         " lead\n", "end.\n", "\xE6\x97\xA5\xE6\x9C\xAC\n", "'s\n", "A\n", "\t tab\n"};
  for (int i = 0; i < 2000; ++i) text += lines[(i * 7) % 13];
  for (std::size_t target : {1, 5, 64, 1000}) {
    std::vector<std::uint16_t> chunked;
    const auto chunks = split_at_safe_boundaries(text, target);
    EXPECT_GT(chunks.size(), 10u) << target;
    for (auto chunk : chunks) tokenizer.encode(chunk, chunked);
    EXPECT_EQ(chunked, tokenizer.encode(text)) << "target " << target;
  }
}
#endif

TEST(ShardWriter, FillsShardsInOrderAndNamesThem) {
  TempDir dir;
  ShardWriter writer(dir.path(), "train", 5);
  std::vector<std::uint16_t> tokens(12);
  for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<std::uint16_t>(i);
  writer.append(std::span(tokens).first(3));
  writer.append(std::span(tokens).subspan(3));
  writer.finish();
  ASSERT_EQ(writer.files().size(), 3u);
  EXPECT_EQ(writer.files()[2].filename(), "train_000002.bin");
  EXPECT_EQ(writer.tokens(), 12u);
  std::vector<std::uint16_t> read_back;
  for (const auto& file : writer.files()) {
    const TokenFile token_file = TokenFile::open(file, 0);
    const auto shard = token_file.read(0, token_file.size());
    EXPECT_LE(shard.size(), 5u);
    read_back.insert(read_back.end(), shard.begin(), shard.end());
  }
  EXPECT_EQ(read_back, tokens);

  ShardWriter single(dir.path(), "val", 0);
  single.append(tokens);
  single.finish();
  ASSERT_EQ(single.files().size(), 1u);
  EXPECT_EQ(single.files()[0].filename(), "val.bin");
  EXPECT_THROW(ShardWriter(dir.path(), "x", std::uint64_t{1} << 31), DataError);
}

TEST(CorpusReader, WalksDirectoriesSortedAndReadsJsonl) {
  TempDir dir;
  dir.write("b.txt", "bee");
  dir.write("a/z.txt", "zed");
  dir.write("a/.hidden", "never");
  dir.write("empty.txt", "");
  dir.write("c.jsonl", "{\"text\": \"one\"}\n\n{\"text\": \"two\", \"id\": 3}");
  const auto documents = read_all({dir.path()});
  ASSERT_EQ(documents.size(), 4u);
  EXPECT_EQ(documents[0].text, "zed");
  EXPECT_EQ(documents[1].text, "bee");
  EXPECT_EQ(documents[2].text, "one");
  EXPECT_EQ(documents[2].name, (dir.path() / "c.jsonl").string() + ":1");
  EXPECT_EQ(documents[3].name, (dir.path() / "c.jsonl").string() + ":3");
}

TEST(CorpusReader, BadInputsNameTheFileAndLine) {
  TempDir dir;
  const auto bad_json = dir.write("bad.jsonl", "{\"text\": \"ok\"}\n{not json}\n");
  EXPECT_NE(data_error_of([&] { read_all({bad_json}); }).find("bad.jsonl:2: not valid JSON"), std::string::npos);
  const auto no_field = dir.write("nofield.jsonl", "{\"body\": \"x\"}\n");
  EXPECT_NE(data_error_of([&] { read_all({no_field}); }).find("nofield.jsonl:1: expected a JSON object with a string field 'text'"),
            std::string::npos);
  const auto binary = dir.write("bin.txt", std::string("ab\0cd", 5));
  EXPECT_NE(data_error_of([&] { read_all({binary}); }).find("bin.txt: NUL byte at byte 2"), std::string::npos);
  EXPECT_NE(data_error_of([&] { read_all({dir.path() / "missing"}); }).find("does not exist"),
            std::string::npos);
  // A gzip header followed by garbage; a tar block with the ustar magic but a wrong checksum.
  const auto bad_gzip = dir.write("bad.txt.gz", std::string("\x1F\x8B\x08\x00garbage-garbage", 19));
  EXPECT_NE(data_error_of([&] { read_all({bad_gzip}); }).find("bad.txt.gz"), std::string::npos);
  std::string tar_block(512, '\0');
  tar_block.replace(0, 5, "a.txt");
  tar_block.replace(124, 11, "00000000001");
  tar_block.replace(148, 7, "0000001");
  tar_block.replace(257, 6, std::string("ustar\0", 6));
  const auto bad_tar = dir.write("bad.tar", tar_block);
  EXPECT_NE(data_error_of([&] { read_all({bad_tar}); }).find("bad.tar (tar header at byte 0): corrupt tar header (checksum mismatch)"),
            std::string::npos);
}

#ifdef POPE_HAVE_PCRE2
TEST(TokenizeCorpus, SameFilesOnOneAndTwoThreadsAndRefusesToOverwrite) {
  if (!fs::exists(tokenizer_dir() / "encoder.json")) GTEST_SKIP() << "run scripts/fetch_tokenizer.sh";
  const Gpt2Tokenizer tokenizer = Gpt2Tokenizer::load(tokenizer_dir());
  TempDir dir;
  std::string lines;
  for (int i = 0; i < 200; ++i) lines += "{\"text\": \"Document number " + std::to_string(i) + ".\\nSecond line.\"}\n";
  const auto input = dir.write("docs.jsonl", lines);
  std::vector<std::vector<std::uint16_t>> outputs;
  for (int threads : {1, 2}) {
    TokenizeOptions options;
    options.out_dir = dir.path() / ("out" + std::to_string(threads));
    options.val_fraction = 0.25;
    options.shard_tokens = 0;
    options.threads = threads;
    options.progress = false;
    const TokenizeSummary summary = tokenize_corpus(tokenizer, {input}, options);
    EXPECT_EQ(summary.documents, 200u);
    EXPECT_EQ(summary.train_documents + summary.val_documents, 200u);
    EXPECT_GT(summary.val_documents, 25u);  // ≈ 50 expected; far below is a broken split
    EXPECT_LT(summary.val_documents, 80u);
    for (const char* split : {"train.bin", "val.bin"}) {
      const TokenFile token_file = TokenFile::open(options.out_dir / split, kGpt2VocabSize);
      const auto tokens = token_file.read(0, token_file.size());
      outputs.emplace_back(tokens.begin(), tokens.end());
      EXPECT_EQ(tokens.back(), kGpt2EndOfText);
    }
    EXPECT_NE(data_error_of([&] { tokenize_corpus(tokenizer, {input}, options); }).find("already exists"),
              std::string::npos);
  }
  EXPECT_EQ(outputs[0], outputs[2]);  // train, 1 vs 2 threads
  EXPECT_EQ(outputs[1], outputs[3]);  // val
}

// One book as the whole corpus: a document split gives val nothing (or everything), so its last
// ⌈fraction · tokens⌉ tokens go to val; a second document restores the document split.
TEST(TokenizeCorpus, LoneDocumentIsSplitByTokens) {
  if (!fs::exists(tokenizer_dir() / "encoder.json")) GTEST_SKIP() << "run scripts/fetch_tokenizer.sh";
  const Gpt2Tokenizer tokenizer = Gpt2Tokenizer::load(tokenizer_dir());
  TempDir dir;
  std::string text;
  for (int i = 0; i < 300; ++i) text += "Sentence " + std::to_string(i) + " of the only book.\n";
  const auto book = dir.write("book.txt", text);
  auto whole = tokenizer.encode(text);
  whole.push_back(kGpt2EndOfText);
  const auto read_tokens = [](const fs::path& path) {
    const TokenFile file = TokenFile::open(path, kGpt2VocabSize);
    return file.read(0, file.size());
  };

  TokenizeOptions options;
  options.out_dir = dir.path() / "one";
  options.val_fraction = 0.1;
  options.shard_tokens = 0;
  options.progress = false;
  const TokenizeSummary summary = tokenize_corpus(tokenizer, {book}, options);
  EXPECT_TRUE(summary.split_by_tokens);
  const auto train = read_tokens(options.out_dir / "train.bin");
  const auto val = read_tokens(options.out_dir / "val.bin");
  EXPECT_EQ(val.size(), (whole.size() + 9) / 10);  // ⌈0.1 · tokens⌉
  EXPECT_EQ(summary.val_tokens, val.size());
  EXPECT_EQ(summary.train_tokens, train.size());
  std::vector<std::uint16_t> joined = train;
  joined.insert(joined.end(), val.begin(), val.end());
  EXPECT_EQ(joined, whole);  // train is the head, val the tail, nothing lost or repeated

  options.out_dir = dir.path() / "no_val";
  options.val_fraction = 0;
  EXPECT_FALSE(tokenize_corpus(tokenizer, {book}, options).split_by_tokens);
  EXPECT_EQ(read_tokens(options.out_dir / "train.bin"), whole);
  EXPECT_FALSE(fs::exists(options.out_dir / "val.bin"));

  options.out_dir = dir.path() / "two";
  options.val_fraction = 0.5;
  const auto second = dir.write("more/second.txt", "Another document.");
  const TokenizeSummary two = tokenize_corpus(tokenizer, {book, second}, options);
  EXPECT_FALSE(two.split_by_tokens);
  EXPECT_EQ(two.train_documents + two.val_documents, 2u);
  EXPECT_EQ(two.train_tokens + two.val_tokens, whole.size() + tokenizer.encode("Another document.").size() + 1);
}
#endif

namespace {

// A ustar header block for a regular file (checksum filled in), to build archives in tests.
std::string tar_header(const std::string& name, std::size_t size) {
  std::string block(512, '\0');
  block.replace(0, name.size(), name);
  char octal[16];
  std::snprintf(octal, sizeof octal, "%011zo", size);
  block.replace(124, 11, octal);
  block[156] = '0';
  block.replace(257, 6, std::string("ustar\0", 6));
  block.replace(263, 2, "00");
  block.replace(148, 8, "        ");
  unsigned sum = 0;
  for (unsigned char c : block) sum += c;
  std::snprintf(octal, sizeof octal, "%06o", sum);
  block.replace(148, 7, std::string(octal, 6) + '\0');
  return block;
}

std::string tar_archive(const std::vector<std::pair<std::string, std::string>>& members) {
  std::string archive;
  for (const auto& [name, contents] : members) {
    archive += tar_header(name, contents.size()) + contents;
    archive.append((512 - contents.size() % 512) % 512, '\0');
  }
  return archive + std::string(1024, '\0');
}

}  // namespace

TEST(CorpusReader, ReadsTarMembersInOrder) {
  TempDir dir;
  const auto tar = dir.write("docs.tar", tar_archive({{"b.txt", "bee"}, {"a.jsonl", "{\"text\": \"jay\"}\n"}}));
  const auto documents = read_all({tar});
  ASSERT_EQ(documents.size(), 2u);
  EXPECT_EQ(documents[0].text, "bee");
  EXPECT_EQ(documents[0].name, tar.string() + "/b.txt");
  EXPECT_EQ(documents[1].text, "jay");
}

TEST(CorpusReader, DamagedArchivesGiveDataErrorsNeverCrashes) {
  // Every truncation and many single-byte changes of a valid archive: each read either succeeds
  // or throws DataError (the sanitizer build also checks for memory errors).
  TempDir dir;
  const std::string archive = tar_archive({{"one.txt", std::string(700, 'x')}, {"two.jsonl", "{\"text\": \"t\"}\n"}});
  std::mt19937 rng(11);
  int errors = 0;
  for (int trial = 0; trial < 300; ++trial) {
    std::string damaged = archive;
    if (trial % 2 == 0) {
      damaged.resize(rng() % archive.size());
    } else {
      damaged[rng() % damaged.size()] = static_cast<char>(rng());
    }
    const auto file = dir.write("damaged.tar", damaged);
    try {
      read_all({file});
    } catch (const DataError&) {
      ++errors;
    }
  }
  EXPECT_GT(errors, 30);  // truncations inside a member must be reported, not read as shorter text
}
