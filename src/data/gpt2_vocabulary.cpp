#include "data/gpt2_vocabulary.hpp"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "config/bounded_json.hpp"
#include "data/gpt2_byte_unicode.hpp"
#include "data/gpt2_sha256.hpp"
#include "data/regular_file.hpp"
#include "pope/tokenizer.hpp"

namespace pope {
namespace {

// tiktoken pins the same digests for gpt-2/encodings/main.
constexpr const char* kEncoderJsonSha256 = "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783";
constexpr const char* kVocabBpeSha256 = "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5";
constexpr int kMergeCount = 50000;
constexpr const char* kFetchHint = "run scripts/fetch_tokenizer.sh to download the GPT-2 tokenizer files";

std::string read_verified(const std::filesystem::path& path, const char* expected_sha256) {
  if (const std::string why = why_not_regular_file(path); !why.empty())
    throw TokenizerError(path.string() + " " + why + " (" + kFetchHint + ")");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw TokenizerError(path.string() + ": cannot open (" + kFetchHint + ")");
  std::ostringstream buffer;
  buffer << in.rdbuf();
  std::string bytes = std::move(buffer).str();
  const std::string actual = sha256_hex(bytes);
  if (actual != expected_sha256)
    throw TokenizerError(path.string() + ": sha256 is " + actual + ", expected " + expected_sha256 +
                         " (the file is corrupt or a different version; delete it and " + kFetchHint + ")");
  return bytes;
}

// Single bytes rank in the code point order of the characters that spell them.
void add_byte_ranks(BpeRanks& ranks) {
  std::array<unsigned, 256> bytes;
  for (unsigned b = 0; b < 256; ++b) bytes[b] = b;
  std::sort(bytes.begin(), bytes.end(),
            [](unsigned a, unsigned b) { return gpt2_byte_to_char(a) < gpt2_byte_to_char(b); });
  for (std::uint32_t rank = 0; rank < 256; ++rank) ranks.add(std::string(1, static_cast<char>(bytes[rank])), rank);
}

void add_merge_ranks(BpeRanks& ranks, const std::string& vocab_bpe, const std::filesystem::path& path) {
  std::istringstream lines(vocab_bpe);
  std::string line;
  std::getline(lines, line);
  if (line.rfind("#version", 0) != 0)
    throw TokenizerError(path.string() + ": line 1 should be the '#version' header, found '" + line + "'");
  int merges = 0;
  for (int line_number = 2; std::getline(lines, line); ++line_number) {
    if (line.empty()) continue;
    const std::size_t space = line.find(' ');
    if (space == std::string::npos || space == 0 || space + 1 == line.size() ||
        line.find(' ', space + 1) != std::string::npos)
      throw TokenizerError(path.string() + ":" + std::to_string(line_number) +
                           ": expected two tokens separated by one space, found '" + line + "'");
    try {
      ranks.add(gpt2_token_text_to_bytes(line.substr(0, space)) + gpt2_token_text_to_bytes(line.substr(space + 1)),
                static_cast<std::uint32_t>(256 + merges));
    } catch (const std::invalid_argument& e) {
      throw TokenizerError(path.string() + ":" + std::to_string(line_number) + ": " + e.what());
    }
    ++merges;
  }
  if (merges != kMergeCount)
    throw TokenizerError(path.string() + ": " + std::to_string(merges) + " merges, expected " +
                         std::to_string(kMergeCount));
}

// Checks that encoder.json gives every token the id that vocab.bpe ranks it at, and fills id → bytes.
std::vector<std::string> token_bytes_from_encoder(const BpeRanks& ranks, const std::string& encoder_json,
                                                  const std::filesystem::path& path) {
  nlohmann::json encoder;
  try {
    encoder = parse_json(encoder_json);
  } catch (const nlohmann::json::exception& e) {
    throw TokenizerError(path.string() + ": not valid JSON: " + e.what());
  }
  if (!encoder.is_object() || encoder.size() != static_cast<std::size_t>(kGpt2VocabSize))
    throw TokenizerError(path.string() + ": expected an object of " + std::to_string(kGpt2VocabSize) + " tokens");
  std::vector<std::string> token_bytes(kGpt2VocabSize);
  std::vector<bool> seen(kGpt2VocabSize, false);
  for (const auto& [text, id_json] : encoder.items()) {
    const int id = id_json.is_number_integer() ? id_json.get<int>() : -1;
    if (id < 0 || id >= kGpt2VocabSize || seen[id])
      throw TokenizerError(path.string() + ": token '" + text + "' has id " + id_json.dump() +
                           ", expected a distinct integer below " + std::to_string(kGpt2VocabSize));
    seen[id] = true;
    if (text == kGpt2EndOfTextText) {
      if (id != kGpt2EndOfText)
        throw TokenizerError(path.string() + ": <|endoftext|> has id " + std::to_string(id) + ", expected 50256");
      token_bytes[id] = text;
      continue;
    }
    try {
      token_bytes[id] = gpt2_token_text_to_bytes(text);
    } catch (const std::invalid_argument& e) {
      throw TokenizerError(path.string() + ": token '" + text + "': " + e.what());
    }
    if (ranks.find(token_bytes[id]) != static_cast<std::uint32_t>(id))
      throw TokenizerError(path.string() + ": token '" + text + "' has id " + std::to_string(id) +
                           " but vocab.bpe ranks it " + std::to_string(ranks.find(token_bytes[id])));
  }
  return token_bytes;
}

bool holds_tokenizer_files(const std::filesystem::path& dir) {
  std::error_code ec;
  return std::filesystem::is_regular_file(dir / "encoder.json", ec) &&
         std::filesystem::is_regular_file(dir / "vocab.bpe", ec);
}

}  // namespace

Gpt2Vocabulary load_gpt2_vocabulary(const std::filesystem::path& dir) {
  const std::string encoder_json = read_verified(dir / "encoder.json", kEncoderJsonSha256);
  const std::string vocab_bpe = read_verified(dir / "vocab.bpe", kVocabBpeSha256);
  Gpt2Vocabulary vocabulary;
  add_byte_ranks(vocabulary.ranks);
  add_merge_ranks(vocabulary.ranks, vocab_bpe, dir / "vocab.bpe");
  vocabulary.token_bytes = token_bytes_from_encoder(vocabulary.ranks, encoder_json, dir / "encoder.json");
  return vocabulary;
}

std::filesystem::path find_tokenizer_dir(const std::filesystem::path& explicit_dir) {
  if (!explicit_dir.empty()) {
    if (!holds_tokenizer_files(explicit_dir))
      throw TokenizerError("tokenizer directory " + explicit_dir.string() + " lacks encoder.json and vocab.bpe; " +
                           kFetchHint + " (scripts/fetch_tokenizer.sh DIR fetches into DIR)");
    return explicit_dir;
  }
  if (const char* env = std::getenv("POPE_TOKENIZER_DIR"); env != nullptr && *env != '\0') {
    if (!holds_tokenizer_files(env))
      throw TokenizerError(std::string("POPE_TOKENIZER_DIR=") + env + " lacks encoder.json and vocab.bpe; " +
                           kFetchHint + " (scripts/fetch_tokenizer.sh DIR fetches into DIR)");
    return env;
  }
  std::error_code ec;
  const std::filesystem::path cwd = std::filesystem::current_path(ec);
  // Linux names the running binary here; elsewhere (or when it is gone) only cwd is searched.
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  const std::vector<std::filesystem::path> dirs = tokenizer_search_dirs(cwd, ec ? std::filesystem::path() : exe.parent_path());
  for (const auto& dir : dirs)
    if (holds_tokenizer_files(dir)) return dir;
  std::string looked;
  for (const auto& dir : dirs) looked += (looked.empty() ? "" : ", ") + dir.string();
  throw TokenizerError("GPT-2 tokenizer files (encoder.json and vocab.bpe) not found: neither --tokenizer-dir nor "
                       "POPE_TOKENIZER_DIR was given, and none of these holds them: " + looked + "; " + kFetchHint);
}

std::vector<std::filesystem::path> tokenizer_search_dirs(const std::filesystem::path& cwd,
                                                         const std::filesystem::path& exe_dir) {
  std::vector<std::filesystem::path> dirs;
  const auto add = [&](const std::filesystem::path& dir) {
    const std::filesystem::path normal = dir.lexically_normal();
    if (std::find(dirs.begin(), dirs.end(), normal) == dirs.end()) dirs.push_back(normal);
  };
  const auto add_data_tokenizer_upward = [&](const std::filesystem::path& start) {
    for (std::filesystem::path dir = start; !dir.empty(); dir = dir.parent_path()) {
      add(dir / "data" / "tokenizer");
      if (dir == dir.parent_path()) break;
    }
  };
  add_data_tokenizer_upward(cwd);
  if (!exe_dir.empty()) {
    add(exe_dir / ".." / "share" / "pope" / "tokenizer");
    add_data_tokenizer_upward(exe_dir);
  }
  return dirs;
}

}  // namespace pope
