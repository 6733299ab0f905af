// pope-data: GPT-2 token files from text corpora, and a look inside them.
//
//   pope-data tokenize --input PATH... --out DIR [--val-fraction F --seed S --shard-tokens N …]
//   pope-data inspect FILE [--count N]
//   pope-data decode FILE [--start I --count N]      |  pope-data decode --ids 15496,995
//   pope-data encode TEXT | --file PATH [--allow-special]   (ids as a JSON array)
//
// Exit codes: 0 success, 1 data errors (unreadable or malformed input, missing tokenizer
// files, input too large for the host's memory), 2 usage errors (unknown options, missing input paths).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <optional>
#include <sstream>

#include "data/regular_file.hpp"
#include "pope/corpus.hpp"
#include "pope/data.hpp"
#include "pope/tokenizer.hpp"
#include "tools/console_log.hpp"
#include "tools/number_checks.hpp"
#include "tools/version.hpp"

namespace {

using namespace pope;
namespace fs = std::filesystem;

constexpr int kExitDataError = 1;
constexpr int kExitUsage = 2;

void print_summary(const TokenizeSummary& s, const fs::path& out_dir) {
  std::printf("pope-data: %llu documents (%llu train, %llu val), %llu train + %llu val tokens; "
              "%.1f MB of text in %.2f s = %.1f MB/s (%.1f MB per CPU-second); %zu files in %s\n",
              static_cast<unsigned long long>(s.documents), static_cast<unsigned long long>(s.train_documents),
              static_cast<unsigned long long>(s.val_documents), static_cast<unsigned long long>(s.train_tokens),
              static_cast<unsigned long long>(s.val_tokens), double(s.text_bytes) / 1e6, s.seconds,
              double(s.text_bytes) / 1e6 / std::max(s.seconds, 1e-9),
              double(s.text_bytes) / 1e6 / std::max(s.cpu_seconds, 1e-9), s.files.size(), out_dir.c_str());
  if (s.split_by_tokens)
    std::printf("pope-data: the corpus is one document, so it was split by tokens: its last %llu tokens are val\n",
                static_cast<unsigned long long>(s.val_tokens));
}

std::string read_text_file(const std::string& path) {
  // A FIFO or a device would block or never end: refused for what it is.
  if (const std::string why = pope::why_not_regular_file(path); !why.empty()) throw pope::DataError(path + ": " + why);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(path + ": cannot open");
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return std::move(buffer).str();
}

// "15496, 995" or "[15496,995]" → `ids`. Returns why the text is not such a list, or "" (the
// contract of a CLI11 validator, which --ids runs it as, so that a bad list is a usage error
// found before the tokenizer files are read).
std::string parse_id_list(std::string text, std::vector<std::uint16_t>& ids) {
  ids.clear();
  const std::string expected = " (expected token ids 0.." + std::to_string(kGpt2VocabSize - 1) +
                               " separated by commas, e.g. 15496,995)";
  if (text.size() >= 2 && text.front() == '[' && text.back() == ']') text = text.substr(1, text.size() - 2);
  // getline drops a trailing empty element ("1,"), which must be refused like an inner one.
  if (!text.empty() && text.back() == ',') return "'" + text + "' ends with an empty element" + expected;
  std::istringstream in(text);
  std::string element;
  while (std::getline(in, element, ',')) {
    const auto first = element.find_first_not_of(" \t");
    if (first == std::string::npos) return "'" + text + "' has an empty element" + expected;
    const std::string word = element.substr(first, element.find_last_not_of(" \t") + 1 - first);
    std::size_t used = 0;
    unsigned long id = 0;
    try {
      id = std::stoul(word, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    // stoul takes a sign ("-1" as 2^64 − 1, "+5" as 5); an id is digits only.
    if (used != word.size() || word.find_first_not_of("0123456789") != std::string::npos ||
        id >= static_cast<unsigned long>(kGpt2VocabSize))
      return "'" + word + "' is not a token id" + expected;
    ids.push_back(static_cast<std::uint16_t>(id));
  }
  if (ids.empty()) return "no ids in '" + text + "'" + expected;
  return {};
}

std::string joined_list(const std::vector<std::string>& items) {
  std::string joined;
  for (const auto& item : items) joined += (joined.empty() ? "" : ", ") + item;
  return joined;
}

// A token's bytes for display: printable ASCII as is, other bytes escaped.
std::string printable(std::string_view bytes) {
  std::string out;
  for (unsigned char c : bytes) {
    if (c == '\n') {
      out += "\\n";
    } else if (c >= 0x20 && c < 0x7F && c != '\\') {
      out.push_back(static_cast<char>(c));
    } else {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\x%02X", c);
      out += escaped;
    }
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  pope::tools::log_to_stderr("pope-data");  // and a result lost on stdout (a full disk) fails the tool
  CLI::App app{"pope-data: GPT-2 token files (llm.c format) from text corpora"};
  app.require_subcommand(1);
  app.fallthrough();  // --tokenizer-dir may also follow the subcommand
  std::string tokenizer_dir;
  app.add_option("--tokenizer-dir", tokenizer_dir,
                 "directory with encoder.json and vocab.bpe (default: $POPE_TOKENIZER_DIR, else data/tokenizer "
                 "in or above the current directory, else PREFIX/share/pope/tokenizer of an installed "
                 "PREFIX/bin/pope-data, else data/tokenizer in or above the binary's directory)");

  auto* tokenize = app.add_subcommand("tokenize", "tokenize files, directories, .jsonl, .xz/.gz and tar archives");
  std::vector<std::string> inputs;
  TokenizeOptions options;
  bool quiet = false;
  tokenize->add_option("-i,--input", inputs, "input files or directories (repeatable)")
      ->required()
      ->check(CLI::ExistingPath);
  tokenize->add_option("-o,--out", options.out_dir, "output directory")->required();
  tokenize->add_option("--val-fraction", options.val_fraction,
                       "share of documents for val (a corpus of one document: share of its tokens, the last ones)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  tokenize->add_option("--seed", options.seed, "seed of the document-level split")
      ->capture_default_str()
      ->check(pope::tools::integer_check(options.seed));
  tokenize->add_option("--shard-tokens", options.shard_tokens,
                       "tokens per llm.c shard ({train,val}_NNNNNN.bin); 0: one train.bin and one val.bin")
      ->capture_default_str()
      ->check(pope::tools::integer_check(options.shard_tokens, 0, 2147483647));
  tokenize->add_flag("--per-document", options.per_document,
                     "one token file per document, named after its file, no split (e.g. evaluation books)");
  tokenize->add_option("--text-field", options.read.text_field, "JSONL field holding the text")->capture_default_str();
  tokenize->add_option("-j,--threads", options.threads,
                       "threads (at most " + std::to_string(pope::kMaxThreads) + "; 0: every core)")
      ->capture_default_str()
      ->check(pope::tools::threads_check(options.threads));
  tokenize->add_flag("--overwrite", options.overwrite, "replace token files already in the output directory");
  tokenize->add_flag("-q,--quiet", quiet, "no progress bar and no summary");

  auto* inspect = app.add_subcommand("inspect", "format, token count and first tokens of a token file");
  std::string inspect_file;
  std::size_t inspect_count = 32;
  inspect->add_option("file", inspect_file, "llm.c or nanoGPT token file")->required()->check(CLI::ExistingFile);
  inspect->add_option("-n,--count", inspect_count, "tokens to show")
      ->capture_default_str()
      ->check(pope::tools::integer_check(inspect_count));

  auto* decode = app.add_subcommand("decode", "write the text of a token file (or of --ids) to stdout");
  std::string decode_file;
  std::vector<std::uint16_t> decode_id_values;
  std::size_t decode_start = 0, decode_count = SIZE_MAX;
  decode->add_option("file", decode_file, "llm.c or nanoGPT token file")->check(CLI::ExistingFile);
  auto* ids_option =
      decode->add_option("--ids", "ids to decode instead, e.g. 15496,995")
          ->type_name("ID,ID,...")
          ->check(CLI::Validator([&](std::string& text) { return parse_id_list(text, decode_id_values); }, ""));
  decode->add_option("--start", decode_start, "first token")
      ->capture_default_str()
      ->check(pope::tools::integer_check(decode_start));
  decode->add_option("-n,--count", decode_count, "number of tokens (default: all)")
      ->check(pope::tools::integer_check(decode_count));

  auto* encode = app.add_subcommand("encode", "print the GPT-2 ids of a text as a JSON array");
  std::string encode_text, encode_file;
  bool allow_special = false;
  auto* text_option = encode->add_option("text", encode_text, "text to encode");
  encode->add_option("-f,--file", encode_file, "encode this file's bytes instead")
      ->check(CLI::ExistingFile)
      ->excludes(text_option);
  encode->add_flag("--allow-special", allow_special, "read <|endoftext|> as the special token 50256");
  pope::tools::finish_cli(app, "pope-data");

  try {
    app.parse(argc, argv);
    if (*decode && decode_file.empty() == (ids_option->count() == 0))
      throw CLI::ValidationError("decode", "give exactly one of FILE and --ids");
    if (*encode && encode_file.empty() && text_option->count() == 0)
      throw CLI::ValidationError("encode", "give TEXT or --file");
  } catch (const CLI::ParseError& e) {
    // A first word that is no subcommand (or no option of pope-data itself) is left unparsed, and
    // CLI11 says only "A subcommand is required", not which word it did not know.
    const std::vector<std::string> unknown = app.remaining();
    if (app.get_subcommands().empty() && !unknown.empty()) {
      std::string names;
      for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; }))
        names += (names.empty() ? "" : ", ") + sub->get_name();
      const bool option = unknown.front().rfind('-', 0) == 0;
      app.exit(CLI::ValidationError("pope-data", "'" + unknown.front() + "' is not " +
                                                     (option ? "an option before the subcommand (expected "
                                                               "--tokenizer-dir, then one of "
                                                             : "a subcommand (expected one of ") +
                                                     names + ")"));
      return kExitUsage;
    }
    const int rc = app.exit(e);
    return rc == 0 ? 0 : kExitUsage;
  }

  std::string doing = "loading the tokenizer files";  // for an out-of-memory error: what ran out
  try {
    const Gpt2Tokenizer tokenizer = Gpt2Tokenizer::load_default(tokenizer_dir);
    doing = *tokenize  ? "tokenizing " + joined_list(inputs)
            : *inspect ? "inspecting " + inspect_file
            : *decode  ? (*ids_option ? std::string("decoding --ids") : "decoding " + decode_file)
                       : (encode_file.empty() ? std::string("encoding the text") : "encoding " + encode_file);
    if (*tokenize) {
      options.progress = !quiet;
      const std::vector<fs::path> input_paths(inputs.begin(), inputs.end());
      const TokenizeSummary summary = tokenize_corpus(tokenizer, input_paths, options);
      if (!quiet) print_summary(summary, options.out_dir);
      if (!options.per_document && options.val_fraction > 0 && summary.val_documents == 0)
        std::fprintf(stderr, "pope-data: warning: no document fell into val at --val-fraction %g (%llu documents); "
                             "no val file was written\n",
                     options.val_fraction, static_cast<unsigned long long>(summary.documents));
    } else if (*inspect) {
      const TokenFile file = TokenFile::open(inspect_file, kGpt2VocabSize);
      std::size_t documents = 0;
      file.scan([&](std::size_t, std::span<const std::uint16_t> chunk) {
        documents += static_cast<std::size_t>(std::count(chunk.begin(), chunk.end(), kGpt2EndOfText));
      });
      const std::vector<std::uint16_t> head = file.read(0, std::min(inspect_count, file.size()));
      std::printf("%s\n  format: %s\n  tokens: %zu\n  <|endoftext|>: %zu (documents)\n  first %zu tokens:\n",
                  inspect_file.c_str(), file.format() == TokenFileFormat::llmc ? "llm.c (header + uint16)" : "nanoGPT (uint16)",
                  file.size(), documents, head.size());
      for (std::size_t i = 0; i < head.size(); ++i)
        std::printf("  %8zu  %5u  \"%s\"\n", i, head[i], printable(tokenizer.token_bytes(head[i])).c_str());
      std::printf("  text: \"%s\"\n", printable(tokenizer.decode(head)).c_str());
    } else if (*decode) {
      std::optional<TokenFile> file;
      if (!*ids_option) file = TokenFile::open(decode_file, kGpt2VocabSize);
      const std::size_t available = file ? file->size() : decode_id_values.size();
      if (decode_start > available)
        throw CLI::ValidationError("--start", std::to_string(decode_start) + " is past the last token (" +
                                                  std::to_string(available) + " tokens)");
      const std::size_t count = std::min(decode_count, available - decode_start);
      const std::string text =
          tokenizer.decode(file ? file->read(decode_start, count)
                                : std::vector<std::uint16_t>(decode_id_values.begin() + std::ptrdiff_t(decode_start),
                                                             decode_id_values.begin() + std::ptrdiff_t(decode_start + count)));
      std::fwrite(text.data(), 1, text.size(), stdout);
    } else if (*encode) {
      const std::string text = encode_file.empty() ? encode_text : read_text_file(encode_file);
      const auto ids = tokenizer.encode(text, allow_special ? SpecialTokens::allowed : SpecialTokens::as_text);
      std::string json = "[";
      for (std::size_t i = 0; i < ids.size(); ++i) json += (i ? "," : "") + std::to_string(ids[i]);
      std::printf("%s]\n", json.c_str());
    }
  } catch (const CLI::ValidationError& e) {
    std::fprintf(stderr, "pope-data: %s\n", e.what());
    return kExitUsage;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "pope-data: error: out of host memory while %s: it needs more memory than this machine "
                         "gives the process\n",
                 doing.c_str());
    return kExitDataError;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pope-data: error: %s\n", e.what());
    return kExitDataError;
  }
  return 0;
}
