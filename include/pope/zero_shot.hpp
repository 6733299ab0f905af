// Zero-shot evaluation on the PoPE paper's downstream tasks (its Table 6): LAMBADA, HellaSwag,
// PIQA, ARC-Easy, BLiMP and CBT, scored as lm-evaluation-harness scores them. Every task is a
// reader of its public file format plus a rule over log-likelihoods from one scoring engine:
//   engine     score_continuations                 (src/eval/zero_shot/continuation_scorer.cpp)
//   readers    read_task and the task definitions   (src/eval/zero_shot/<task>.cpp)
//   running    evaluate_task: tokenize, score, rule (src/eval/zero_shot/task_evaluation.cpp)
//   metrics    accuracy, perplexity, stderr         (src/eval/zero_shot/task_metrics.cpp)
//   reports    table, JSON, per-example CSV         (src/eval/zero_shot/task_report.cpp)
//   suite      the files of a directory, Table 6    (src/eval/zero_shot/zero_shot_suite.cpp)
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "pope/model.hpp"

namespace pope {

// ---- the scoring engine --------------------------------------------------------------

// One log-likelihood request: log p(continuation | context), both non-empty token lists.
struct ContinuationRequest {
  std::vector<std::int32_t> context;
  std::vector<std::int32_t> continuation;
};

struct ContinuationScore {
  double log_likelihood = 0.0;  // Σ over the continuation's tokens of log p(token | all before it)
  int tokens = 0;               // continuation tokens
  bool greedy = false;          // every continuation token is the argmax (ScoringOptions::greedy only)
};

struct ScoringOptions {
  // Rows × padded length per forward at most (one request per forward when a request alone is
  // longer); activation memory grows with it, as pope-eval --max-batch-tokens.
  std::int64_t max_batch_tokens = 32768;
  // Also decide whether each continuation is the greedy one (LAMBADA). Those batches run
  // Model::logits_at over the continuation rows and take the log-softmax in double.
  bool greedy = false;
};

struct ScoringStats {
  std::int64_t forwards = 0;
  std::int64_t input_tokens = 0;   // the requests' own positions (context + continuation − 1)
  std::int64_t padded_tokens = 0;  // rows × T over all forwards, padding included
  double seconds = 0.0;            // forwards and host copies
  double tokens_per_second() const;
};

// The padded length of a request row of `length` positions: a multiple of 64 (so that a run
// reallocates the activations once per multiple, not per batch), at most model.context_length
// for rows within it; exactly `length` for an encoding whose transform depends on the call's
// length (dynamic NTK), which padding would change.
int scoring_row_length(const Model& model, int length);

// The most context + continuation tokens a request may hold: model.context_length + 1 for an
// encoding only defined up to the training length (RoPE without a scaling; the last token is
// predicted, never read), else no bound. nullopt when unbounded.
std::optional<std::int64_t> max_request_tokens(const Model& model);
// "model.position.kind rope is defined up to the training length 1024 (model.context_length),
// and WHERE needs N positions; …": the refusal of a request past max_request_tokens, in the words
// of Model::make_kv_cache.
std::string request_too_long_message(const Model& model, std::string_view where, std::int64_t tokens);

// Scores every request, forward only: sorted by length, batched into rows of
// scoring_row_length padded with masked targets, up to max_batch_tokens per forward. Results are
// in request order and do not depend on the batching (up to fp32 rounding). A request with an
// empty list or past max_request_tokens is std::invalid_argument naming its index.
std::vector<ContinuationScore> score_continuations(Model& model, std::span<const ContinuationRequest> requests,
                                                   const ScoringOptions& options, ScoringStats* stats = nullptr);

// ---- tasks and their files ---------------------------------------------------------

enum class ZeroShotTask { lambada, hellaswag, piqa, arc_easy, blimp, cbt };

// How a task turns its choices' scores into a decision.
enum class TaskRule {
  last_word,        // one continuation; correct when every token is greedy (LAMBADA); perplexity too
  multiple_choice,  // argmax log-likelihood (acc) and argmax log-likelihood per byte (acc_norm)
  minimal_pair,     // two sentences; correct when LL(choice 0, good) > LL(choice 1, bad) (BLiMP)
};

struct TaskDefinition {
  ZeroShotTask task;
  std::string_view name;    // --task value: "lambada", …
  TaskRule rule;
  bool acc_norm;            // reports acc_norm besides acc
  std::string_view layout;  // the file's format and where it comes from, for --help and README
};

const TaskDefinition& task_definition(ZeroShotTask task);
const std::vector<TaskDefinition>& task_definitions();
// The task named `name` ("lambada", …); nullopt for another name.
std::optional<ZeroShotTask> task_from_name(std::string_view name);

// One item of a task: a context and its candidate continuations (text), read from `line` of
// file `file` of its TaskData. An empty context is conditioned on the end-of-text token.
struct TaskExample {
  std::size_t file = 0;     // index into TaskData::files
  long line = 0;            // 1-based; CBT: the line of its question
  std::string context;
  std::vector<std::string> choices;
  int gold = 0;
  std::string group;        // BLiMP: its paradigm
  std::string skip_reason;  // non-empty: counted and reported as skipped, not scored
};

struct TaskData {
  ZeroShotTask task = ZeroShotTask::lambada;
  std::string name;         // the report's name: the task's, or cbt_cn / cbt_ne after the CBT file
  std::vector<std::filesystem::path> files;
  std::vector<TaskExample> examples;
};

// Reads a task's file in its public format. `path` is the file (BLiMP: one paradigm file or a
// directory of them); `labels` is PIQA's labels file (default: valid-labels.lst beside
// valid.jsonl, i.e. the name with ".jsonl" replaced by "-labels.lst"). A malformed line, a
// missing field or a label out of range is a DataError naming the file and line; so are an empty
// file and a path that is not a regular file (or, for BLiMP, a directory without *.jsonl).
TaskData read_task(ZeroShotTask task, const std::filesystem::path& path, const std::filesystem::path& labels = {});

// The readers behind read_task, one per task file.
TaskData read_lambada(const std::filesystem::path& path);
TaskData read_hellaswag(const std::filesystem::path& path);
TaskData read_piqa(const std::filesystem::path& path, const std::filesystem::path& labels);
TaskData read_arc_easy(const std::filesystem::path& path);
TaskData read_blimp(const std::filesystem::path& path);
TaskData read_cbt(const std::filesystem::path& path);
// HellaSwag's text clean-up (lm-evaluation-harness): strip, " [title]" → ". ", drop "[…]"
// spans, collapse double spaces.
std::string hellaswag_preprocess(std::string_view text);

// ---- running a task ------------------------------------------------------------------

// Text → token ids. Called from several threads at once.
using Tokenize = std::function<std::vector<std::int32_t>(std::string_view)>;

struct ZeroShotOptions {
  std::int64_t max_batch_tokens = 32768;
  bool strict = false;             // a skipped example is an error instead
  std::int32_t end_of_text = 50256;  // what an empty context is conditioned on
  int threads = 0;                 // tokenizing threads; 0: all cores
};

struct ChoiceResult {
  double log_likelihood = 0.0;
  int tokens = 0;
  std::size_t bytes = 0;   // of the choice's text without the delimiter space (acc_norm's length)
  bool greedy = false;     // last_word only
};

struct ExampleResult {
  std::size_t index = 0;   // in the task's file order
  std::size_t file = 0;
  long line = 0;
  int gold = 0;
  int chosen = 0;          // argmax LL (last_word: 0; minimal_pair: 0 when LL(good) > LL(bad), else 1)
  int chosen_norm = 0;     // argmax LL / bytes (multiple_choice)
  bool correct = false;
  bool correct_norm = false;
  std::string group;
  std::vector<ChoiceResult> choices;
};

struct SkippedExample {
  std::size_t file = 0;
  long line = 0;
  std::string reason;
};

struct MetricValue {
  std::string name;        // acc, acc_norm, ppl
  double value = 0.0;
  double standard_error = 0.0;
};

struct GroupResult {
  std::string group;
  std::size_t examples = 0;
  MetricValue acc;
};

struct TaskResult {
  std::string name;                  // TaskData::name
  ZeroShotTask task = ZeroShotTask::lambada;
  std::vector<std::filesystem::path> files;
  std::vector<ExampleResult> examples;
  std::vector<SkippedExample> skipped;
  std::vector<MetricValue> metrics;  // acc [, acc_norm] [, ppl]
  std::vector<GroupResult> groups;   // BLiMP: per paradigm, by name
  ScoringStats stats;

  // The metric named `name`; nullptr when the task has none of that name.
  const MetricValue* metric(std::string_view name) const;
};

// Tokenizes every example the way lm-evaluation-harness does (a context's trailing spaces move
// to the front of each continuation; the continuation's tokens are those of context +
// continuation after the context's own), scores them, applies the task's rule and aggregates.
// Skipped examples (a choice without tokens; a reader's skip) are counted with their reason, or
// with `strict` are a DataError naming the file and line; so is a request past
// max_request_tokens. No example left to score is a DataError too.
TaskResult evaluate_task(Model& model, const TaskData& data, const Tokenize& tokenize, const ZeroShotOptions& options);

// ---- metrics -------------------------------------------------------------------------

// correct / examples with the sample standard error √(p(1−p)/(n−1)) (NaN for n < 2).
MetricValue accuracy_metric(std::string name, std::size_t correct, std::size_t examples);
// exp(−mean LL) with the delta-method standard error ppl · se(mean LL).
MetricValue perplexity_metric(std::span<const double> log_likelihoods);
// Applies the rule to one example's choices (chosen, chosen_norm, correct, correct_norm).
void apply_rule(TaskRule rule, ExampleResult& example);
// The task's metrics and groups from its examples.
void aggregate_metrics(const TaskDefinition& definition, TaskResult& result);

// ---- reports -------------------------------------------------------------------------

// One checkpoint's result of a task.
struct TaskRun {
  std::string label;
  std::string checkpoint;  // step directory
  long step = 0;
  std::string position;    // describe_position
  TaskResult result;
};

// Console table: one row per run (examples, skipped, each metric ± stderr, tokens/s), then the
// skip reasons and, for BLiMP, the accuracy per paradigm.
std::string format_task_table(std::span<const TaskRun> runs);
// Settings, metrics and every example's result (index, file, line, gold, chosen, each choice's
// LL, tokens and bytes) per run.
nlohmann::json task_runs_to_json(std::span<const TaskRun> runs);
// One row per run × example × choice:
// label,task,index,file,line,gold,chosen,chosen_norm,correct,correct_norm,choice,log_likelihood,tokens,bytes,greedy
std::string format_task_csv(std::span<const TaskRun> runs);

// ---- the suite ----------------------------------------------------------------------

// A task file found in a suite directory; `name` is the column (cbt_cn and cbt_ne apart).
struct SuiteEntry {
  std::string name;
  ZeroShotTask task = ZeroShotTask::lambada;
  std::filesystem::path path;    // the file (BLiMP: its directory)
};

// The files that the suite reads in `dir`, in the table's column order (see suite_layout()).
// A missing task is left out; none at all is a DataError listing the names looked for.
std::vector<SuiteEntry> find_suite_files(const std::filesystem::path& dir);
// The names find_suite_files looks for, one line per column, for --help and errors.
std::string suite_layout();

// One checkpoint's row of the suite.
struct SuiteRow {
  std::string label;
  std::vector<TaskResult> results;  // in find_suite_files order
};

// The metric a suite column shows: acc for every task (acc_norm and the perplexity are in the
// per-task tables and the JSON).
inline constexpr std::string_view kSuiteMetric = "acc";

// The paper's Table 6 layout: one row per checkpoint, one column per task (accuracy in %), and
// the average over the columns.
std::string format_suite_table(std::span<const SuiteRow> rows);
nlohmann::json suite_to_json(std::span<const SuiteRow> rows);

}  // namespace pope
