#include <algorithm>
#include <new>

#include <nlohmann/json.hpp>

#include "config/bounded_json.hpp"
#include "data/corpus_reader_sources.hpp"
#include "data/corpus_reader_tar.hpp"
#include "data/regular_file.hpp"
#include "pope/corpus.hpp"
#include "pope/data.hpp"

namespace pope {
namespace fs = std::filesystem;

namespace {

constexpr std::size_t kMaxDocumentBytes = std::size_t{1} << 30;
constexpr int kMaxNesting = 8;  // archives inside archives; more is surely not a corpus

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

std::string without_suffix(const std::string& name, std::string_view suffix) {
  return ends_with(name, suffix) ? name.substr(0, name.size() - suffix.size()) : name;
}

class CorpusWalker {
 public:
  CorpusWalker(const CorpusReadOptions& options, const std::function<void(Document&&)>& on_document)
      : options_(options), on_document_(on_document) {}

  // Recognises the stream by its first bytes, then by `name`, and emits its documents.
  void read_stream(ByteSource& source, const std::string& name, int depth) {
    if (depth > kMaxNesting) throw DataError(name + ": archives nested more than " + std::to_string(kMaxNesting) + " deep");
    PeekableSource in(source);
    const std::string_view head = in.peek(512);
    if (const Compression compression = detect_compression(head); compression != Compression::none) {
      auto decompressed = open_decompressor(compression, in, name);
      read_stream(*decompressed, without_suffix(without_suffix(name, ".xz"), ".gz"), depth + 1);
    } else if (looks_like_tar(head)) {
      for_each_tar_member(in, name, [&](ByteSource& member, const std::string& member_name) {
        read_stream(member, member_name, depth + 1);
      });
    } else if (ends_with(name, ".jsonl")) {
      read_jsonl(in, name);
    } else {
      emit(Document{name, in.read_all(name, kMaxDocumentBytes)});
    }
  }

 private:
  void read_jsonl(ByteSource& in, const std::string& name) {
    std::string pending;
    char chunk[1 << 16];
    std::uint64_t line_number = 0;
    auto take_line = [&](std::string_view line) {
      ++line_number;
      if (line.find_first_not_of(" \t\r") == std::string_view::npos) return;
      const std::string where = name + ":" + std::to_string(line_number);
      nlohmann::json object;
      try {
        object = parse_json(line);
      } catch (const nlohmann::json::exception& e) {
        throw DataError(where + ": not valid JSON (" + e.what() + ")");
      }
      const auto field = object.is_object() ? object.find(options_.text_field) : object.end();
      if (!object.is_object() || field == object.end() || !field->is_string())
        throw DataError(where + ": expected a JSON object with a string field '" + options_.text_field +
                        "' (choose the field with --text-field)");
      emit(Document{where, field->get<std::string>()});
    };
    for (std::size_t got; (got = in.read(chunk, sizeof chunk)) > 0;) {
      pending.append(chunk, got);
      std::size_t start = 0;
      for (std::size_t end; (end = pending.find('\n', start)) != std::string::npos; start = end + 1)
        take_line(std::string_view(pending).substr(start, end - start));
      pending.erase(0, start);
      if (pending.size() > kMaxDocumentBytes) throw DataError(name + ": a line longer than 1 GiB");
    }
    take_line(pending);
  }

  void emit(Document&& document) {
    if (document.text.empty()) return;
    if (const std::size_t nul = document.text.find('\0'); nul != std::string::npos)
      throw DataError(document.name + ": NUL byte at byte " + std::to_string(nul) +
                      "; this is not a text file (pass text, .jsonl, .xz/.gz or tar inputs)");
    on_document_(std::move(document));
  }

  const CorpusReadOptions& options_;
  const std::function<void(Document&&)>& on_document_;
};

bool is_hidden(const fs::path& path) {
  const std::string name = path.filename().string();
  return !name.empty() && name[0] == '.';
}

// The files an input stands for: itself, or a directory's regular files, recursively and sorted.
std::vector<fs::path> input_files(const fs::path& input) {
  std::error_code ec;
  if (fs::is_regular_file(input, ec)) return {input};
  if (!fs::is_directory(input, ec)) throw DataError(input.string() + ": " + why_not_regular_file(input));
  std::vector<fs::path> files;
  for (auto it = fs::recursive_directory_iterator(input, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    if (is_hidden(it->path())) {
      if (it->is_directory()) it.disable_recursion_pending();
      continue;
    }
    if (it->is_regular_file()) files.push_back(it->path());
  }
  if (ec) throw DataError(input.string() + ": cannot list the directory: " + ec.message());
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

void read_corpus(const std::vector<fs::path>& inputs, const CorpusReadOptions& options,
                 const std::function<void(Document&&)>& on_document, std::atomic<std::uint64_t>* input_bytes_read) {
  CorpusWalker walker(options, on_document);
  for (const fs::path& input : inputs) {
    for (const fs::path& file : input_files(input)) {
      try {
        FileSource source(file, input_bytes_read);
        walker.read_stream(source, file.string(), 0);
      } catch (const std::bad_alloc&) {
        throw OutOfMemoryError("out of host memory while reading " + file.string() +
                               " (each document, or JSONL line, is held in memory whole)");
      }
    }
  }
}

std::uint64_t corpus_input_bytes(const std::vector<fs::path>& inputs) {
  std::uint64_t total = 0;
  for (const fs::path& input : inputs)
    for (const fs::path& file : input_files(input)) total += fs::file_size(file);
  return total;
}

}  // namespace pope
