// Running one task: every example's choices tokenized as lm-evaluation-harness tokenizes
// (context, continuation) pairs, checked (skips, lengths, vocabulary) with the file and line,
// scored in one call of the engine, decided by the task's rule and aggregated.
#include <fmt/format.h>
#include <omp.h>

#include <cctype>
#include <exception>

#include "pope/data.hpp"
#include "pope/zero_shot.hpp"

namespace pope {

namespace {

struct EncodedExample {
  std::vector<ContinuationRequest> requests;  // one per choice
  std::string skip_reason;
};

// The harness's split: the context's trailing whitespace moves to the front of the
// continuation, whose tokens are those of context + continuation after the context's own; an
// empty context becomes the end-of-text token.
EncodedExample encode(const TaskExample& example, const Tokenize& tokenize, std::int32_t end_of_text) {
  EncodedExample out;
  if (!example.skip_reason.empty()) {
    out.skip_reason = example.skip_reason;
    return out;
  }
  std::string_view context = example.context;
  std::size_t kept = context.size();
  while (kept > 0 && std::isspace(static_cast<unsigned char>(context[kept - 1]))) --kept;
  const std::string_view moved = context.substr(kept);
  context = context.substr(0, kept);
  const std::vector<std::int32_t> context_tokens = context.empty() ? std::vector<std::int32_t>{end_of_text}
                                                                   : tokenize(context);
  for (std::size_t c = 0; c < example.choices.size(); ++c) {
    const std::string continuation = std::string(moved) + example.choices[c];
    ContinuationRequest request{context_tokens, {}};
    if (context.empty()) {
      request.continuation = tokenize(continuation);
    } else {
      const std::vector<std::int32_t> whole = tokenize(std::string(context) + continuation);
      if (whole.size() > context_tokens.size())
        request.continuation.assign(whole.begin() + std::ptrdiff_t(context_tokens.size()), whole.end());
    }
    if (request.continuation.empty()) {
      out.skip_reason = fmt::format("choice {} tokenizes to no tokens after the context", c);
      out.requests.clear();
      return out;
    }
    out.requests.push_back(std::move(request));
  }
  return out;
}

std::vector<EncodedExample> encode_all(const TaskData& data, const Tokenize& tokenize, const ZeroShotOptions& options) {
  const std::size_t n = data.examples.size();
  std::vector<EncodedExample> encoded(n);
  std::vector<std::exception_ptr> errors(n);
  const int threads = options.threads > 0 ? options.threads : omp_get_num_procs();
#pragma omp parallel for schedule(dynamic, 16) num_threads(threads)
  for (std::int64_t i = 0; i < std::int64_t(n); ++i) {
    try {
      encoded[std::size_t(i)] = encode(data.examples[std::size_t(i)], tokenize, options.end_of_text);
    } catch (...) {
      errors[std::size_t(i)] = std::current_exception();
    }
  }
  for (const std::exception_ptr& error : errors)
    if (error) std::rethrow_exception(error);
  return encoded;
}

std::string where(const TaskData& data, const TaskExample& example) {
  return fmt::format("{} line {}", data.files[example.file].string(), example.line);
}

void check_requests(const Model& model, const TaskData& data, const TaskExample& example,
                    const std::vector<ContinuationRequest>& requests) {
  const auto bound = max_request_tokens(model);
  const int vocab_size = model.config().vocab_size;
  for (const ContinuationRequest& r : requests) {
    const std::int64_t tokens = std::int64_t(r.context.size() + r.continuation.size());
    if (bound && tokens > *bound) throw DataError(request_too_long_message(model, where(data, example), tokens));
    for (const auto* list : {&r.context, &r.continuation})
      for (const std::int32_t id : *list)
        if (id < 0 || id >= vocab_size)
          throw DataError(fmt::format("{}: token id {} is outside the model's vocabulary of {} (is the checkpoint "
                                      "trained on GPT-2 tokens?)",
                                      where(data, example), id, vocab_size));
  }
}

}  // namespace

TaskResult evaluate_task(Model& model, const TaskData& data, const Tokenize& tokenize, const ZeroShotOptions& options) {
  const TaskDefinition& definition = task_definition(data.task);
  TaskResult result;
  result.name = data.name;
  result.task = data.task;
  result.files = data.files;
  const std::vector<EncodedExample> encoded = encode_all(data, tokenize, options);

  std::vector<ContinuationRequest> requests;
  std::vector<std::size_t> first_request;  // per scored example
  for (std::size_t i = 0; i < data.examples.size(); ++i) {
    const TaskExample& example = data.examples[i];
    if (!encoded[i].skip_reason.empty()) {
      if (options.strict)
        throw DataError(fmt::format("{}: {} (--strict refuses skipping it)", where(data, example),
                                    encoded[i].skip_reason));
      result.skipped.push_back({example.file, example.line, encoded[i].skip_reason});
      continue;
    }
    check_requests(model, data, example, encoded[i].requests);
    ExampleResult r;
    r.index = i;
    r.file = example.file;
    r.line = example.line;
    r.gold = example.gold;
    r.group = example.group;
    result.examples.push_back(std::move(r));
    first_request.push_back(requests.size());
    requests.insert(requests.end(), encoded[i].requests.begin(), encoded[i].requests.end());
  }
  if (result.examples.empty())
    throw DataError(fmt::format("{}: no example to score ({} skipped)", data.files.front().string(),
                                result.skipped.size()));

  ScoringOptions scoring{options.max_batch_tokens, definition.rule == TaskRule::last_word};
  const std::vector<ContinuationScore> scores = score_continuations(model, requests, scoring, &result.stats);
  for (std::size_t e = 0; e < result.examples.size(); ++e) {
    ExampleResult& r = result.examples[e];
    const TaskExample& example = data.examples[r.index];
    for (std::size_t c = 0; c < example.choices.size(); ++c) {
      const ContinuationScore& s = scores[first_request[e] + c];
      // acc_norm's length is the choice's text without the delimiter space, as the harness counts it.
      const std::string& text = example.choices[c];
      const std::size_t bytes = text.size() - (text.starts_with(' ') ? 1 : 0);
      r.choices.push_back({s.log_likelihood, s.tokens, bytes, s.greedy});
    }
    apply_rule(definition.rule, r);
  }
  aggregate_metrics(definition, result);
  return result;
}

}  // namespace pope
