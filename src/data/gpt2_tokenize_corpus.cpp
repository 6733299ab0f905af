// tokenize_corpus: one reader thread walks and decompresses the inputs into batches of
// documents; the calling thread encodes each batch on every core (OpenMP; long documents are
// cut at safe boundaries so one book also uses all cores) and then appends the documents, in
// read order, to their split's writer. Output depends only on the inputs and options, never
// on the thread count.
#include <omp.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <chrono>
#include <cmath>
#include <ctime>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <new>
#include <optional>
#include <thread>
#include <utility>

#include "data/dataset_marker.hpp"
#include "data/pretokenizer.hpp"
#include "data/shard_writer.hpp"
#include "pope/corpus.hpp"
#include "pope/data.hpp"
#include "pope/rng.hpp"

namespace pope {
namespace fs = std::filesystem;

namespace {

constexpr std::size_t kBatchBytes = 16 << 20;      // text per batch: enough work for every core
constexpr std::size_t kChunkBytes = 256 << 10;      // long documents are encoded in chunks of this
constexpr std::size_t kQueuedBatches = 2;           // the reader runs this far ahead

using Batch = std::vector<Document>;

// A bounded hand-off from the reader thread; close() ends it (normally or on error), cancel()
// makes the reader's next push throw so that it stops when the consumer has failed.
class BatchQueue {
 public:
  struct Cancelled {};

  void push(Batch&& batch) {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return cancelled_ || queue_.size() < kQueuedBatches; });
    if (cancelled_) throw Cancelled{};
    queue_.push_back(std::move(batch));
    changed_.notify_all();
  }
  // The next batch, or nothing once the queue is closed and empty.
  std::optional<Batch> pop() {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return closed_ || !queue_.empty(); });
    if (queue_.empty()) return std::nullopt;
    Batch batch = std::move(queue_.front());
    queue_.pop_front();
    changed_.notify_all();
    return batch;
  }
  void close(std::exception_ptr error = nullptr) {
    std::lock_guard lock(mutex_);
    closed_ = true;
    error_ = error;
    changed_.notify_all();
  }
  void cancel() {
    std::lock_guard lock(mutex_);
    cancelled_ = true;
    changed_.notify_all();
  }
  std::exception_ptr error() {
    std::lock_guard lock(mutex_);
    return error_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Batch> queue_;
  bool closed_ = false, cancelled_ = false;
  std::exception_ptr error_;
};

// One line on stderr, redrawn at most every 0.2 s, only when stderr is a terminal.
class ProgressBar {
 public:
  ProgressBar(bool enabled, std::uint64_t total_bytes)
      : enabled_(enabled && ::isatty(STDERR_FILENO)), total_bytes_(total_bytes) {}

  void update(std::uint64_t input_bytes, std::uint64_t documents, std::uint64_t tokens, double seconds) {
    if (!enabled_ || seconds - last_draw_ < 0.2) return;
    last_draw_ = seconds;
    const double fraction = total_bytes_ == 0 ? 1.0 : std::min(1.0, double(input_bytes) / double(total_bytes_));
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(fraction * kWidth);
    std::fprintf(stderr, "\r[%.*s%*s] %3.0f%%  %llu documents  %.1fM tokens  %.1f MB/s input ", filled,
                 "##############################", kWidth - filled, "", 100 * fraction,
                 static_cast<unsigned long long>(documents), double(tokens) / 1e6,
                 double(input_bytes) / 1e6 / std::max(seconds, 1e-9));
    drawn_ = true;
  }
  void finish() {
    if (drawn_) std::fputc('\n', stderr);
  }

 private:
  bool enabled_;
  std::uint64_t total_bytes_;
  double last_draw_ = -1;
  bool drawn_ = false;
};

void validate(const TokenizeOptions& options) {
  if (options.out_dir.empty()) throw DataError("tokenize: no output directory given");
  if (!(options.val_fraction >= 0.0 && options.val_fraction <= 1.0))
    throw DataError("tokenize: val fraction " + std::to_string(options.val_fraction) + " is outside [0, 1]");
  if (options.threads < 0) throw DataError("tokenize: thread count must be 0 (all cores) or positive");
}

bool is_output_name(const std::string& name) {
  for (const char* stem : {"train", "val"}) {
    const std::string s = stem;
    if (name == s + ".bin") return true;
    if (name.size() == s.size() + 11 && name.rfind(s + "_", 0) == 0 && name.ends_with(".bin")) return true;
  }
  return false;
}

// ".<output>.XXXXXX": write_bytes_atomic's temporary file, left behind when a run was killed mid-write.
bool is_temp_name(const std::string& name, bool per_document) {
  constexpr std::size_t kSuffix = 7;  // ".XXXXXX" of mkstemp
  if (name.size() <= 1 + kSuffix || name.front() != '.' || name[name.size() - kSuffix] != '.') return false;
  const std::string output = name.substr(1, name.size() - 1 - kSuffix);
  return per_document ? output.ends_with(".bin") : is_output_name(output);
}

// Existing outputs of an earlier run (or what a stopped run left: shards, temporary files, the
// incomplete marker) would mix with the new ones: an error, or removed with overwrite. The
// marker goes in first, so that from here until tokenize_corpus ends readers refuse the directory.
void prepare_out_dir(const TokenizeOptions& options) {
  std::error_code ec;
  fs::create_directories(options.out_dir, ec);
  if (ec) throw DataError(options.out_dir.string() + ": cannot create the output directory: " + ec.message());
  std::vector<fs::path> stale;
  for (const auto& entry : fs::directory_iterator(options.out_dir)) {
    const std::string name = entry.path().filename().string();
    // per-document names are checked as they are written
    if (name == kIncompleteMarkerName || is_temp_name(name, options.per_document) ||
        (!options.per_document && is_output_name(name)))
      stale.push_back(entry.path());
  }
  if (!stale.empty() && !options.overwrite) {
    const bool stopped = fs::exists(options.out_dir / kIncompleteMarkerName);
    throw DataError(stale.front().string() + " already exists" +
                    (stopped ? " (an earlier pope-data tokenize into this directory did not finish)" : "") +
                    "; pass --overwrite to replace this directory's token files");
  }
  mark_dataset_incomplete(options.out_dir);
  for (const auto& path : stale)
    if (path.filename() != kIncompleteMarkerName) fs::remove(path);
}

// out_dir/<file name without its last extension>.bin for a per-document run.
fs::path per_document_path(const TokenizeOptions& options, const std::string& document_name) {
  std::string stem = fs::path(document_name).stem().string();
  for (char& c : stem)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') c = '_';
  return options.out_dir / (stem + ".bin");
}

bool goes_to_val(const TokenizeOptions& options, std::uint64_t document_index) {
  const double u = static_cast<double>(mix64(options.seed, document_index) >> 11) * 0x1.0p-53;
  return u < options.val_fraction;
}

// The val share of a lone document's tokens: ⌈fraction · count⌉, so any fraction above 0 gives val a token.
std::size_t val_tokens_of_lone_document(double val_fraction, std::size_t count) {
  return std::min(count, static_cast<std::size_t>(std::ceil(val_fraction * static_cast<double>(count))));
}

// Encodes every document of the batch on all threads; returns each document's ids.
std::vector<std::vector<std::uint16_t>> encode_batch(const Gpt2Tokenizer& tokenizer, const Batch& batch,
                                                     int threads) {
  struct Piece {
    std::size_t document;
    std::string_view text;
  };
  std::vector<Piece> pieces;
  std::vector<std::size_t> first_piece(batch.size() + 1);
  for (std::size_t d = 0; d < batch.size(); ++d) {
    first_piece[d] = pieces.size();
    for (std::string_view chunk : split_at_safe_boundaries(batch[d].text, kChunkBytes)) pieces.push_back({d, chunk});
  }
  first_piece[batch.size()] = pieces.size();

  std::vector<std::vector<std::uint16_t>> piece_ids(pieces.size());
  std::exception_ptr error;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    try {
      tokenizer.encode(pieces[i].text, piece_ids[i]);
    } catch (...) {
#pragma omp critical
      error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);

  std::vector<std::vector<std::uint16_t>> document_ids(batch.size());
  for (std::size_t d = 0; d < batch.size(); ++d) {
    document_ids[d] = std::move(piece_ids[first_piece[d]]);
    for (std::size_t i = first_piece[d] + 1; i < first_piece[d + 1]; ++i)
      document_ids[d].insert(document_ids[d].end(), piece_ids[i].begin(), piece_ids[i].end());
    document_ids[d].push_back(kGpt2EndOfText);
  }
  return document_ids;
}

// Names the documents of a batch for an error: the first and the last, and how many.
std::string batch_names(const Batch& batch) {
  if (batch.size() == 1) return batch.front().name;
  return std::to_string(batch.size()) + " documents, " + batch.front().name + " to " + batch.back().name;
}

// Rethrows the exception being handled, a std::bad_alloc as an OutOfMemoryError naming `stage`.
[[noreturn]] void rethrow_naming_memory_stage(const std::string& stage) {
  try {
    throw;
  } catch (const std::bad_alloc&) {
    throw OutOfMemoryError("out of host memory while " + stage);
  }
}

}  // namespace

TokenizeSummary tokenize_corpus(const Gpt2Tokenizer& tokenizer, const std::vector<fs::path>& inputs,
                                const TokenizeOptions& options) {
  validate(options);
  const std::uint64_t total_input_bytes = corpus_input_bytes(inputs);  // also checks that every input exists
  prepare_out_dir(options);
  const int threads = options.threads > 0 ? options.threads : omp_get_num_procs();

  BatchQueue queue;
  std::atomic<std::uint64_t> input_bytes_read{0};
  std::thread reader([&] {
    try {
      Batch batch;
      std::size_t batch_bytes = 0;
      read_corpus(inputs, options.read, [&](Document&& document) {
        batch_bytes += document.text.size();
        batch.push_back(std::move(document));
        if (batch_bytes >= kBatchBytes) {
          queue.push(std::move(batch));
          batch.clear();
          batch_bytes = 0;
        }
      }, &input_bytes_read);
      if (!batch.empty()) queue.push(std::move(batch));
      queue.close();
    } catch (const BatchQueue::Cancelled&) {
      queue.close();
    } catch (...) {
      queue.close(std::current_exception());
    }
  });

  TokenizeSummary summary;
  ShardWriter train(options.out_dir, "train", options.shard_tokens);
  ShardWriter val(options.out_dir, "val", options.shard_tokens);
  std::map<fs::path, std::string> per_document_sources;  // output → document, to report clashes
  ProgressBar progress(options.progress, total_input_bytes);
  const auto start = std::chrono::steady_clock::now();
  const std::clock_t cpu_start = std::clock();  // CPU time of the whole process, all threads
  const auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };

  // A document split cannot give a lone document's corpus a val part, so document 0 waits until a
  // second one shows that the split is by documents; alone, it is split by tokens at the end.
  std::optional<std::vector<std::uint16_t>> first_document;
  const auto route = [&](std::uint64_t index, std::span<const std::uint16_t> ids) {
    if (goes_to_val(options, index)) {
      val.append(ids);
      ++summary.val_documents;
    } else {
      train.append(ids);
      ++summary.train_documents;
    }
  };

  std::string stage;  // what the loop does, for an out-of-memory error
  try {
    while (std::optional<Batch> batch = queue.pop()) {
      stage = "encoding " + batch_names(*batch);
      auto document_ids = encode_batch(tokenizer, *batch, threads);
      stage = "collecting the tokens of " + batch_names(*batch) +
              (options.shard_tokens == 0 ? " (--shard-tokens 0 holds each split in memory whole)" : "");
      for (std::size_t d = 0; d < batch->size(); ++d) {
        const std::uint64_t index = summary.documents++;
        summary.text_bytes += (*batch)[d].text.size();
        if (options.per_document) {
          const fs::path path = per_document_path(options, (*batch)[d].name);
          if (auto [it, fresh] = per_document_sources.emplace(path, (*batch)[d].name); !fresh)
            throw DataError((*batch)[d].name + " and " + it->second + " both map to " + path.string() +
                            " (per-document output is named after the file)");
          if (fs::exists(path) && !options.overwrite)
            throw DataError(path.string() + " already exists; pass --overwrite to replace it");
          write_llmc_shard(path, document_ids[d]);
          summary.files.push_back(path);
          ++summary.train_documents;
          summary.train_tokens += document_ids[d].size();
        } else if (index == 0) {
          first_document = std::move(document_ids[d]);
        } else {
          if (first_document) route(0, *std::exchange(first_document, std::nullopt));
          route(index, document_ids[d]);
        }
      }
      progress.update(input_bytes_read, summary.documents, summary.train_tokens + train.tokens() + val.tokens(),
                      elapsed());
    }
  } catch (...) {
    queue.cancel();
    reader.join();
    progress.finish();
    rethrow_naming_memory_stage(stage);
  }
  reader.join();
  progress.finish();
  if (std::exception_ptr error = queue.error()) std::rethrow_exception(error);
  if (summary.documents == 0) throw DataError("tokenize: the inputs hold no (non-empty) documents");

  if (first_document && options.val_fraction > 0) {
    const std::span<const std::uint16_t> ids(*first_document);
    const std::size_t val_count = val_tokens_of_lone_document(options.val_fraction, ids.size());
    train.append(ids.first(ids.size() - val_count));
    val.append(ids.last(val_count));
    summary.train_documents = val_count < ids.size() ? 1 : 0;
    summary.val_documents = 1;
    summary.split_by_tokens = true;
  } else if (first_document) {
    route(0, *first_document);
  }
  if (!options.per_document) {
    train.finish();
    val.finish();
    summary.train_tokens = train.tokens();
    summary.val_tokens = val.tokens();
    summary.files = train.files();
    summary.files.insert(summary.files.end(), val.files().begin(), val.files().end());
  }
  mark_dataset_complete(options.out_dir);
  summary.seconds = elapsed();
  summary.cpu_seconds = double(std::clock() - cpu_start) / CLOCKS_PER_SEC;
  return summary;
}

}  // namespace pope
