// The zero-shot tasks (pope/zero_shot.hpp): each reader on the hand-written files of
// tests/data/zero_shot, each rule against log-likelihoods computed independently on a tiny CPU
// model (a byte-level toy tokenizer), independence from the batching, the row lengths, the
// refusal of requests past a RoPE model's training length, skips, bad input with its file and
// line, the metrics, the suite's files and the reports.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <mutex>

#include <fmt/format.h>

#include "pope/data.hpp"
#include "pope/zero_shot.hpp"
#include "scratch_dir.hpp"
#include "unit/model_shape.hpp"

using namespace pope;
using pope::testing::ScratchDir;
using pope::testing::thrown_message;

namespace {

const std::filesystem::path kFixtures = std::filesystem::path(POPE_SOURCE_DIR) / "tests/data/zero_shot";
constexpr std::int32_t kToyEndOfText = 0;  // no fixture holds a NUL byte

// One token per byte: the fixtures are ASCII, so every id is below 128.
std::vector<std::int32_t> byte_tokens(std::string_view text) {
  return std::vector<std::int32_t>(text.begin(), text.end());
}

ModelConfig toy_config(const std::string& kind, int context_length = 32) {
  return pope::testing::model_config({.vocab_size = 128, .padded_vocab_size = 128, .n_layer = 2, .n_head = 2,
                                      .n_embd = 16, .context_length = context_length},
                                     kind);
}

struct ToyModel {
  explicit ToyModel(const std::string& kind = "pope", int context_length = 32)
      : backend(make_backend(DeviceChoice::cpu, "float", 1)), model(toy_config(kind, context_length), *backend) {
    model.initialize(5);
  }
  std::unique_ptr<Backend> backend;
  Model model;
};

ZeroShotOptions toy_options(std::int64_t budget = 32768) {
  ZeroShotOptions o;
  o.max_batch_tokens = budget;
  o.end_of_text = kToyEndOfText;
  o.threads = 2;
  return o;
}

void write_text(const std::filesystem::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// log p(continuation | context) the plain way: one B = 1 forward over the exact sequence
// through the other code path than the engine's (logits_at and a double log-softmax for the
// loss path, per-token losses for the greedy path), and whether each token is the argmax.
struct Reference {
  double log_likelihood = 0.0;
  bool greedy = true;
};
Reference reference_score(Model& model, const std::vector<std::int32_t>& context,
                          const std::vector<std::int32_t>& continuation, bool via_losses) {
  std::vector<std::int32_t> tokens = context;
  tokens.insert(tokens.end(), continuation.begin(), continuation.end() - 1);
  const int T = int(tokens.size());
  Reference ref;
  if (via_losses) {
    std::vector<std::int32_t> targets(tokens.size(), -1);
    std::copy(continuation.begin(), continuation.end(), targets.begin() + std::ptrdiff_t(context.size()) - 1);
    std::vector<float> losses(tokens.size());
    ref.log_likelihood = -model.forward(tokens.data(), targets.data(), 1, T, losses.data()).sum;
  }
  std::vector<std::int64_t> rows;
  for (std::size_t i = 0; i < continuation.size(); ++i) rows.push_back(std::int64_t(context.size() - 1 + i));
  const std::vector<float> logits = model.logits_at(tokens.data(), 1, T, rows);
  const int V = model.config().vocab_size;
  double log_likelihood = 0.0;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const float* z = logits.data() + i * std::size_t(V);
    const double top = *std::max_element(z, z + V);
    double sum = 0.0;
    for (int j = 0; j < V; ++j) sum += std::exp(double(z[j]) - top);
    log_likelihood += double(z[continuation[i]]) - top - std::log(sum);
    ref.greedy = ref.greedy && std::max_element(z, z + V) - z == continuation[i];
  }
  if (!via_losses) ref.log_likelihood = log_likelihood;
  return ref;
}

// The harness's split with one token per byte: the context's trailing spaces go to the
// continuation; an empty context is the end-of-text token.
std::pair<std::vector<std::int32_t>, std::vector<std::int32_t>> toy_split(const std::string& context,
                                                                          const std::string& choice) {
  std::size_t kept = context.size();
  while (kept > 0 && context[kept - 1] == ' ') --kept;
  const std::string continuation = context.substr(kept) + choice;
  if (kept == 0) return {{kToyEndOfText}, byte_tokens(continuation)};
  return {byte_tokens(context.substr(0, kept)), byte_tokens(continuation)};
}

// Evaluates the task on the toy model and checks every choice's LL, the decisions and the
// accuracies against the reference computed here.
void check_rule_against_reference(const TaskData& data) {
  ToyModel toy;
  const TaskResult result = evaluate_task(toy.model, data, byte_tokens, toy_options());
  const TaskDefinition& definition = task_definition(data.task);
  ASSERT_EQ(result.examples.size(), data.examples.size());
  std::size_t correct = 0, correct_norm = 0;
  for (const ExampleResult& e : result.examples) {
    const TaskExample& example = data.examples[e.index];
    ASSERT_EQ(e.choices.size(), example.choices.size());
    std::vector<double> ll;
    for (std::size_t c = 0; c < example.choices.size(); ++c) {
      const auto [context, continuation] = toy_split(example.context, example.choices[c]);
      const Reference ref =
          reference_score(toy.model, context, continuation, definition.rule == TaskRule::last_word);
      EXPECT_NEAR(e.choices[c].log_likelihood, ref.log_likelihood, 2e-4 * std::max(1.0, std::abs(ref.log_likelihood)))
          << data.name << " example " << e.index << " choice " << c;
      EXPECT_EQ(e.choices[c].tokens, int(continuation.size()));
      if (definition.rule == TaskRule::last_word) {
        EXPECT_EQ(e.choices[c].greedy, ref.greedy);
      }
      ll.push_back(ref.log_likelihood);
    }
    bool expect_correct = false, expect_norm = false;
    switch (definition.rule) {
      case TaskRule::last_word: expect_correct = expect_norm = e.choices[0].greedy; break;
      case TaskRule::minimal_pair: expect_correct = expect_norm = ll[0] > ll[1]; break;
      case TaskRule::multiple_choice: {
        const int best = int(std::max_element(ll.begin(), ll.end()) - ll.begin());
        std::vector<double> per_byte;
        for (std::size_t c = 0; c < ll.size(); ++c) {
          const std::string& text = example.choices[c];
          per_byte.push_back(ll[c] / double(text.size() - (text[0] == ' ' ? 1 : 0)));
        }
        const int best_norm = int(std::max_element(per_byte.begin(), per_byte.end()) - per_byte.begin());
        expect_correct = best == example.gold;
        expect_norm = best_norm == example.gold;
        EXPECT_EQ(e.chosen, best);
        EXPECT_EQ(e.chosen_norm, best_norm);
        break;
      }
    }
    EXPECT_EQ(e.correct, expect_correct) << data.name << " example " << e.index;
    EXPECT_EQ(e.correct_norm, expect_norm) << data.name << " example " << e.index;
    correct += expect_correct ? 1 : 0;
    correct_norm += expect_norm ? 1 : 0;
  }
  const double n = double(data.examples.size());
  ASSERT_NE(result.metric("acc"), nullptr);
  EXPECT_DOUBLE_EQ(result.metric("acc")->value, double(correct) / n);
  if (definition.acc_norm) {
    EXPECT_DOUBLE_EQ(result.metric("acc_norm")->value, double(correct_norm) / n);
  } else {
    EXPECT_EQ(result.metric("acc_norm"), nullptr);
  }
  EXPECT_GT(result.stats.tokens_per_second(), 0.0);
}

}  // namespace

// ---- readers -------------------------------------------------------------------------

TEST(ZeroShotReaders, LambadaSplitsAtTheLastSpace) {
  const TaskData data = read_task(ZeroShotTask::lambada, kFixtures / "lambada_test.jsonl");
  ASSERT_EQ(data.examples.size(), 3u);
  EXPECT_EQ(data.examples[0].context, "The cat sat on the mat and the dog sat on the rug. Then the cat looked at the");
  EXPECT_EQ(data.examples[0].choices, std::vector<std::string>{" dog"});
  EXPECT_EQ(data.examples[1].choices, std::vector<std::string>{" Tom"});
  EXPECT_EQ(data.examples[2].line, 3);
}

TEST(ZeroShotReaders, HellaswagBuildsTheQueryAndCleansTheText) {
  const TaskData data = read_task(ZeroShotTask::hellaswag, kFixtures / "hellaswag_val.jsonl");
  ASSERT_EQ(data.examples.size(), 3u);
  EXPECT_EQ(data.examples[0].context, "Removing ice from car: Then, the man writes over the snow covering the window "
                                      "of a car, and a woman wearing winter clothes smiles. Then");
  EXPECT_EQ(data.examples[0].choices[3], " , the man continues removing the snow on his car.");
  EXPECT_EQ(data.examples[1].context, "Baking cookies: How to bake cookies. Preheat the oven. You should");
  EXPECT_EQ(data.examples[1].choices[0], " set it to a moderate temperature before mixing the dough.");
  EXPECT_EQ(data.examples[1].choices[1], " paint the oven blue.");
  EXPECT_EQ((std::vector<int>{data.examples[0].gold, data.examples[1].gold, data.examples[2].gold}),
            (std::vector<int>{3, 0, 1}));
  EXPECT_EQ(hellaswag_preprocess("  a [title] b [x] c  d "), "a. b c d");
  EXPECT_EQ(hellaswag_preprocess("keep [unclosed"), "keep [unclosed");
}

TEST(ZeroShotReaders, PiqaPairsRecordsWithTheLabelsFile) {
  const TaskData data = read_task(ZeroShotTask::piqa, kFixtures / "piqa/valid.jsonl");
  ASSERT_EQ(data.examples.size(), 3u);
  EXPECT_EQ(data.examples[0].context, "Question: How do I keep bread fresh for longer?\nAnswer:");
  EXPECT_EQ(data.examples[0].choices[0], " Store it in a sealed bag in a cool, dry place.");
  EXPECT_EQ((std::vector<int>{data.examples[0].gold, data.examples[1].gold, data.examples[2].gold}),
            (std::vector<int>{0, 0, 1}));
  EXPECT_EQ(data.files.back(), kFixtures / "piqa/valid-labels.lst");
}

TEST(ZeroShotReaders, ArcEasyTakesLetterAndDigitAnswerKeys) {
  const TaskData data = read_task(ZeroShotTask::arc_easy, kFixtures / "ARC-Easy-Test.jsonl");
  ASSERT_EQ(data.examples.size(), 3u);
  EXPECT_EQ(data.examples[1].context, "Question: What do plants need to make their food?\nAnswer:");
  EXPECT_EQ(data.examples[1].choices, (std::vector<std::string>{" sand", " sunlight", " plastic"}));
  EXPECT_EQ((std::vector<int>{data.examples[0].gold, data.examples[1].gold, data.examples[2].gold}),
            (std::vector<int>{0, 1, 1}));
}

TEST(ZeroShotReaders, BlimpReadsAFileOrADirectoryOfParadigms) {
  const TaskData all = read_task(ZeroShotTask::blimp, kFixtures / "blimp");
  ASSERT_EQ(all.files.size(), 2u);
  ASSERT_EQ(all.examples.size(), 5u);
  EXPECT_EQ(all.examples[0].group, "anaphor_gender_agreement");
  EXPECT_EQ(all.examples[4].group, "determiner_noun_agreement_1");
  EXPECT_EQ(all.examples[4].file, 1u);
  EXPECT_TRUE(all.examples[0].context.empty());
  EXPECT_EQ(all.examples[0].choices,
            (std::vector<std::string>{"Katherine can't help herself.", "Katherine can't help himself."}));
  const TaskData one = read_task(ZeroShotTask::blimp, kFixtures / "blimp/determiner_noun_agreement_1.jsonl");
  EXPECT_EQ(one.examples.size(), 2u);
  // Without a UID the paradigm is the file's stem.
  ScratchDir dir;
  write_text(dir / "my_paradigm.jsonl", "{\"sentence_good\": \"A b.\", \"sentence_bad\": \"A c.\"}\n");
  EXPECT_EQ(read_task(ZeroShotTask::blimp, dir / "my_paradigm.jsonl").examples[0].group, "my_paradigm");
}

TEST(ZeroShotReaders, CbtJoinsThePassageAndSplitsTheQuestionAtTheBlank) {
  const TaskData cn = read_task(ZeroShotTask::cbt, kFixtures / "cbtest_CN_test_2500ex.txt");
  EXPECT_EQ(cn.name, "cbt_cn");
  ASSERT_EQ(cn.examples.size(), 2u);
  const TaskExample& first = cn.examples[0];
  EXPECT_EQ(first.line, 21);
  EXPECT_EQ(first.context.rfind("Once there was a little boat that lived by the sea . Every day", 0), 0u);
  EXPECT_TRUE(first.context.ends_with("went out with the fishermen . And the old gull never laughed at the little "));
  ASSERT_EQ(first.choices.size(), 10u);
  EXPECT_EQ(first.choices[0], "boat again .");
  EXPECT_EQ(first.gold, 0);
  EXPECT_EQ(cn.examples[1].line, 43);
  EXPECT_EQ(cn.examples[1].gold, 7);
  const TaskData ne = read_task(ZeroShotTask::cbt, kFixtures / "cbtest_NE_test_2500ex.txt");
  EXPECT_EQ(ne.name, "cbt_ne");
  EXPECT_EQ(ne.examples[0].choices[3], "Mrs. Brown a cake from the baker .");
  EXPECT_EQ(ne.examples[0].gold, 3);
}

// ---- bad input ---------------------------------------------------------------------

TEST(ZeroShotReaders, BadInputNamesTheFileAndLine) {
  ScratchDir dir;
  const std::string good_hellaswag =
      R"({"activity_label": "a", "ctx_a": "b", "ctx_b": "c", "endings": ["1", "2", "3", "4"], "label": 0})";
  struct Case {
    ZeroShotTask task;
    std::string file, text, expected;
  };
  const std::vector<Case> cases{
      {ZeroShotTask::lambada, "bad_json.jsonl", "{\"text\": \"a b\"}\n{\"text\": \"a b\"\n", "line 2: not valid JSON"},
      {ZeroShotTask::lambada, "array.jsonl", "[1, 2]\n", "line 1: an array where a JSON object was expected"},
      {ZeroShotTask::lambada, "no_text.jsonl", "\n{\"txt\": \"a b\"}\n", "line 2: missing field 'text'"},
      {ZeroShotTask::lambada, "number.jsonl", "{\"text\": 5}\n", "line 1: field 'text' is an integer, expected a "
                                                                  "string"},
      {ZeroShotTask::hellaswag, "no_endings.jsonl", R"({"activity_label": "a", "ctx": "b", "label": 0})" "\n",
       "line 1: missing field 'endings'"},
      {ZeroShotTask::hellaswag, "three_endings.jsonl",
       R"({"activity_label": "a", "ctx": "b", "endings": ["1", "2", "3"], "label": 0})" "\n",
       "line 1: field 'endings' has 3 elements, expected 4"},
      {ZeroShotTask::hellaswag, "label.jsonl",
       good_hellaswag + "\n" + R"({"activity_label": "a", "ctx": "b", "endings": ["1", "2", "3", "4"], "label": 4})",
       "line 2: label 4 is out of range 0..3"},
      {ZeroShotTask::arc_easy, "key.jsonl",
       R"({"question": {"stem": "q", "choices": [{"text": "x", "label": "A"}, {"text": "y", "label": "B"}]}, "answerKey": "E"})",
       "line 1: answerKey 'E' is not the label of any choice"},
      {ZeroShotTask::arc_easy, "stem.jsonl", R"({"question": {"choices": []}, "answerKey": "A"})",
       "line 1: missing field 'question.stem'"},
      {ZeroShotTask::blimp, "pair.jsonl", "{\"sentence_good\": \"a\"}\n", "line 1: missing field 'sentence_bad'"},
      {ZeroShotTask::lambada, "empty.jsonl", "", "is empty"},
      {ZeroShotTask::hellaswag, "blank.jsonl", "\n  \n", "is empty"},
  };
  for (const Case& c : cases) {
    write_text(dir / c.file, c.text);
    const std::string message = thrown_message<DataError>([&] { read_task(c.task, dir / c.file); });
    EXPECT_NE(message.find((dir / c.file).string()), std::string::npos) << message;
    EXPECT_NE(message.find(c.expected), std::string::npos) << c.file << ": " << message;
  }
}

TEST(ZeroShotReaders, PiqaLabelsOutOfRangeOrMiscountedAreErrors) {
  ScratchDir dir;
  write_text(dir / "valid.jsonl", R"({"goal": "g", "sol1": "a", "sol2": "b"})" "\n"
                                  R"({"goal": "g", "sol1": "a", "sol2": "b"})" "\n");
  write_text(dir / "valid-labels.lst", "0\n2\n");
  std::string message = thrown_message<DataError>([&] { read_task(ZeroShotTask::piqa, dir / "valid.jsonl"); });
  EXPECT_NE(message.find((dir / "valid-labels.lst").string() + " line 2: label '2' is not 0 or 1"), std::string::npos)
      << message;
  write_text(dir / "short.lst", "0\n");
  message = thrown_message<DataError>([&] { read_task(ZeroShotTask::piqa, dir / "valid.jsonl", dir / "short.lst"); });
  EXPECT_NE(message.find("holds 1 labels for the 2 records"), std::string::npos) << message;
  message = thrown_message<DataError>([&] { read_task(ZeroShotTask::piqa, dir / "valid.jsonl", dir / "none.lst"); });
  EXPECT_NE(message.find("none.lst does not exist"), std::string::npos) << message;
}

TEST(ZeroShotReaders, MalformedCbtExamplesNameTheirLine) {
  ScratchDir dir;
  std::string passage;
  for (int n = 1; n <= 20; ++n) passage += std::to_string(n) + " Sentence " + std::to_string(n) + " .\n";
  const std::string good = passage + "21 The XXXXX ran .\tdog\t\tcat|dog\n";
  struct Case {
    std::string text, expected;
  };
  const std::vector<Case> cases{
      {good + "\n" + passage + "21 The dog ran .\tdog\t\tcat|dog\n", "line 43: the question has no XXXXX blank"},
      {passage + "21 The XXXXX ran .\tcow\t\tcat|dog\n", "line 21: the answer 'cow' is not among the candidates"},
      {passage + "21 The XXXXX ran .\tdog\tcat|dog\n", "line 21: expected 'question<TAB>answer<TAB><TAB>"},
      {good + "\n1 Only one line .\n", "ends inside an example that begins on line 23"},
      {"2 Starts at two .\n" + good, "line 1: expected line 1 of an example to start with '1 '"},
      {good + "1 No blank line between .\n", "line 22: expected a blank line after line 21"},
      {passage + "21 The XXXXX ran .\tdog\t\tdog\n", "line 21: 1 candidates, expected at least 2"},
  };
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const auto path = dir / ("cbt_" + std::to_string(i) + ".txt");
    write_text(path, cases[i].text);
    const std::string message = thrown_message<DataError>([&] { read_task(ZeroShotTask::cbt, path); });
    EXPECT_NE(message.find(path.string()), std::string::npos) << message;
    EXPECT_NE(message.find(cases[i].expected), std::string::npos) << i << ": " << message;
  }
  write_text(dir / "good.txt", good);
  EXPECT_EQ(read_task(ZeroShotTask::cbt, dir / "good.txt").examples.size(), 1u);
}

TEST(ZeroShotReaders, OnlyRegularFilesAreRead) {
  ScratchDir dir;
  ASSERT_EQ(::mkfifo((dir / "fifo.jsonl").c_str(), 0600), 0);
  std::string message = thrown_message<DataError>([&] { read_task(ZeroShotTask::lambada, dir / "fifo.jsonl"); });
  EXPECT_NE(message.find("is not a regular file"), std::string::npos) << message;
  message = thrown_message<DataError>([&] { read_task(ZeroShotTask::hellaswag, dir.path()); });
  EXPECT_NE(message.find("is not a regular file"), std::string::npos) << message;
  message = thrown_message<DataError>([&] { read_task(ZeroShotTask::arc_easy, dir / "missing.jsonl"); });
  EXPECT_NE(message.find("missing.jsonl does not exist"), std::string::npos) << message;
  std::filesystem::create_directory(dir / "no_paradigms");
  message = thrown_message<DataError>([&] { read_task(ZeroShotTask::blimp, dir / "no_paradigms"); });
  EXPECT_NE(message.find("holds no BLiMP paradigm files"), std::string::npos) << message;
}

// ---- rules against independent log-likelihoods ----------------------------------------

TEST(ZeroShotRules, LambadaGreedyAndPerplexityMatchTheReference) {
  const TaskData data = read_task(ZeroShotTask::lambada, kFixtures / "lambada_test.jsonl");
  check_rule_against_reference(data);
  ToyModel toy;
  const TaskResult result = evaluate_task(toy.model, data, byte_tokens, toy_options());
  double mean = 0.0;
  for (const ExampleResult& e : result.examples) mean += e.choices[0].log_likelihood / 3.0;
  ASSERT_NE(result.metric("ppl"), nullptr);
  EXPECT_NEAR(result.metric("ppl")->value, std::exp(-mean), 1e-9 * std::exp(-mean));
}

TEST(ZeroShotRules, MultipleChoiceTasksMatchTheReference) {
  check_rule_against_reference(read_task(ZeroShotTask::hellaswag, kFixtures / "hellaswag_val.jsonl"));
  check_rule_against_reference(read_task(ZeroShotTask::piqa, kFixtures / "piqa/valid.jsonl"));
  check_rule_against_reference(read_task(ZeroShotTask::arc_easy, kFixtures / "ARC-Easy-Test.jsonl"));
  check_rule_against_reference(read_task(ZeroShotTask::cbt, kFixtures / "cbtest_CN_test_2500ex.txt"));
  check_rule_against_reference(read_task(ZeroShotTask::cbt, kFixtures / "cbtest_NE_test_2500ex.txt"));
}

TEST(ZeroShotRules, BlimpComparesWholeSentencesAfterEndOfTextPerParadigm) {
  const TaskData data = read_task(ZeroShotTask::blimp, kFixtures / "blimp");
  check_rule_against_reference(data);
  ToyModel toy;
  const TaskResult result = evaluate_task(toy.model, data, byte_tokens, toy_options());
  ASSERT_EQ(result.groups.size(), 2u);
  EXPECT_EQ(result.groups[0].group, "anaphor_gender_agreement");
  EXPECT_EQ(result.groups[0].examples, 3u);
  std::size_t correct = 0;
  for (std::size_t i = 0; i < 3; ++i) correct += result.examples[i].correct ? 1 : 0;
  EXPECT_DOUBLE_EQ(result.groups[0].acc.value, double(correct) / 3.0);
}

TEST(ZeroShotRules, TheHarnessSplitMovesTrailingSpacesToTheContinuation) {
  // A tokenizer that keeps " x" words together shows the split: the context's trailing space
  // must reach the continuation, and the continuation's tokens come from the whole text.
  TaskData data{ZeroShotTask::cbt, "cbt", {"mem.txt"}, {}};
  data.examples.push_back({0, 1, "a b ", {"c", "d"}, 0, {}, {}});
  std::vector<std::string> seen;
  std::mutex mutex;
  const Tokenize tokenize = [&](std::string_view text) {
    std::lock_guard lock(mutex);
    seen.emplace_back(text);
    return byte_tokens(text);
  };
  ToyModel toy;
  const TaskResult result = evaluate_task(toy.model, data, tokenize, toy_options());
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(seen, (std::vector<std::string>{"a b", "a b c", "a b d"}));
  EXPECT_EQ(result.examples[0].choices[0].tokens, 2);  // " c"
  EXPECT_EQ(result.examples[0].choices[0].bytes, 1u);
}

// ---- the engine --------------------------------------------------------------------

TEST(ZeroShotScorer, ScoresDoNotDependOnTheBatching) {
  ToyModel toy;
  std::vector<ContinuationRequest> requests;
  for (const auto& path : {"hellaswag_val.jsonl", "cbtest_CN_test_2500ex.txt"}) {
    const TaskData data = read_task(path[0] == 'h' ? ZeroShotTask::hellaswag : ZeroShotTask::cbt, kFixtures / path);
    for (const TaskExample& e : data.examples)
      for (const std::string& choice : e.choices) {
        auto [context, continuation] = toy_split(e.context, choice);
        requests.push_back({context, continuation});
      }
  }
  for (const bool greedy : {false, true}) {
    ScoringStats one_stats, many_stats;
    const auto one = score_continuations(toy.model, requests, {1, greedy}, &one_stats);
    const auto many = score_continuations(toy.model, requests, {1 << 20, greedy}, &many_stats);
    EXPECT_EQ(one_stats.forwards, std::int64_t(requests.size()));
    EXPECT_LT(many_stats.forwards, 10);
    EXPECT_EQ(one_stats.input_tokens, many_stats.input_tokens);
    for (std::size_t i = 0; i < requests.size(); ++i) {
      EXPECT_NEAR(one[i].log_likelihood, many[i].log_likelihood, 1e-5 * std::abs(many[i].log_likelihood)) << i;
      EXPECT_EQ(one[i].tokens, many[i].tokens);
      EXPECT_EQ(one[i].greedy, many[i].greedy);
    }
  }
}

TEST(ZeroShotScorer, RowsArePaddedToMultiplesOf64WithinTheTrainingLength) {
  ToyModel pope("pope", 100);
  EXPECT_EQ(scoring_row_length(pope.model, 1), 64);
  EXPECT_EQ(scoring_row_length(pope.model, 64), 64);
  EXPECT_EQ(scoring_row_length(pope.model, 65), 100);  // not past the training length
  EXPECT_EQ(scoring_row_length(pope.model, 101), 128);
  ModelConfig dynamic = toy_config("rope", 100);
  dynamic.position.rope.scaling.kind = RopeScalingKind::dynamic_ntk;
  auto backend = make_backend(DeviceChoice::cpu, "float", 1);
  Model dynamic_model(dynamic, *backend);
  EXPECT_EQ(scoring_row_length(dynamic_model, 37), 37);  // its transform depends on the length
  EXPECT_FALSE(max_request_tokens(pope.model).has_value());
  ToyModel rope("rope", 100);
  EXPECT_EQ(max_request_tokens(rope.model), 101);
}

TEST(ZeroShotScorer, ActivationsAreReallocatedOncePerRowLength) {
  ToyModel toy("pope", 256);
  std::vector<ContinuationRequest> requests;
  for (int length : {10, 70, 20, 130, 30, 75, 12}) requests.push_back({std::vector<std::int32_t>(length, 3), {4, 5}});
  const std::uint64_t before = toy.model.activation_generation();
  score_continuations(toy.model, requests, {64 * 3, false});
  EXPECT_EQ(toy.model.activation_generation() - before, 3u);  // rows of 64, 128 and 192
}

TEST(ZeroShotScorer, RefusesBadRequests) {
  ToyModel rope("rope", 8);
  const std::vector<ContinuationRequest> empty{{{}, {1}}};
  EXPECT_THROW(score_continuations(rope.model, empty, {}), std::invalid_argument);
  const std::vector<ContinuationRequest> fits{{{1, 2, 3, 4, 5}, {6, 7, 8, 9}}};  // 9 tokens, 8 positions
  EXPECT_EQ(score_continuations(rope.model, fits, {}).size(), 1u);
  const std::vector<ContinuationRequest> too_long{{{1, 2, 3, 4, 5}, {6, 7, 8, 9, 10}}};
  const std::string message = thrown_message<std::invalid_argument>([&] {
    score_continuations(rope.model, too_long, {});
  });
  EXPECT_NE(message.find("request 0 needs 9 positions"), std::string::npos) << message;
}

TEST(ZeroShotScorer, RopeRefusesAnExamplePastItsTrainingLengthNamingIt) {
  ToyModel rope("rope", 32);
  const TaskData data = read_task(ZeroShotTask::cbt, kFixtures / "cbtest_CN_test_2500ex.txt");
  const std::string message = thrown_message<DataError>([&] {
    evaluate_task(rope.model, data, byte_tokens, toy_options());
  });
  EXPECT_NE(message.find("cbtest_CN_test_2500ex.txt line 21"), std::string::npos) << message;
  EXPECT_NE(message.find("training length 32"), std::string::npos) << message;
  // PoPE evaluates the same examples past its training length.
  ToyModel pope("pope", 32);
  EXPECT_EQ(evaluate_task(pope.model, data, byte_tokens, toy_options()).examples.size(), 2u);
}

TEST(ZeroShotScorer, TokensOutsideTheVocabularyNameTheExample) {
  ToyModel toy;
  const TaskData data = read_task(ZeroShotTask::lambada, kFixtures / "lambada_test.jsonl");
  const Tokenize wide = [](std::string_view text) {
    std::vector<std::int32_t> ids = byte_tokens(text);
    ids.push_back(500);
    return ids;
  };
  const std::string message = thrown_message<DataError>([&] { evaluate_task(toy.model, data, wide, toy_options()); });
  EXPECT_NE(message.find("lambada_test.jsonl line 1: token id 500 is outside the model's vocabulary of 128"),
            std::string::npos)
      << message;
}

// ---- skips ---------------------------------------------------------------------------

TEST(ZeroShotSkips, AreCountedWithTheirReasonOrRefusedWhenStrict) {
  ScratchDir dir;
  write_text(dir / "lambada.jsonl", "{\"text\": \"one two\"}\n{\"text\": \"nospace\"}\n{\"text\": \"three four\"}\n");
  write_text(dir / "blimp.jsonl", "{\"sentence_good\": \"A b.\", \"sentence_bad\": \"\"}\n"
                                  "{\"sentence_good\": \"A b.\", \"sentence_bad\": \"A c.\"}\n");
  ToyModel toy;
  struct Case {
    ZeroShotTask task;
    std::string file, reason;
    long line;
  };
  for (const Case& c : {Case{ZeroShotTask::lambada, "lambada.jsonl", "no context before its last word", 2},
                        Case{ZeroShotTask::blimp, "blimp.jsonl", "choice 1 tokenizes to no tokens", 1}}) {
    const TaskData data = read_task(c.task, dir / c.file);
    const TaskResult result = evaluate_task(toy.model, data, byte_tokens, toy_options());
    EXPECT_EQ(result.examples.size(), data.examples.size() - 1);
    ASSERT_EQ(result.skipped.size(), 1u);
    EXPECT_EQ(result.skipped[0].line, c.line);
    EXPECT_NE(result.skipped[0].reason.find(c.reason), std::string::npos) << result.skipped[0].reason;
    ZeroShotOptions strict = toy_options();
    strict.strict = true;
    const std::string message = thrown_message<DataError>([&] { evaluate_task(toy.model, data, byte_tokens, strict); });
    EXPECT_NE(message.find(fmt::format("{} line {}: ", (dir / c.file).string(), c.line)), std::string::npos) << message;
    EXPECT_NE(message.find("--strict"), std::string::npos) << message;
  }
  write_text(dir / "all_skipped.jsonl", "{\"text\": \"nospace\"}\n");
  const std::string message = thrown_message<DataError>([&] {
    evaluate_task(toy.model, read_task(ZeroShotTask::lambada, dir / "all_skipped.jsonl"), byte_tokens, toy_options());
  });
  EXPECT_NE(message.find("no example to score (1 skipped)"), std::string::npos) << message;
}

// ---- metrics -------------------------------------------------------------------------

TEST(ZeroShotMetrics, AccuracyAndPerplexityWithTheirStandardErrors) {
  const MetricValue acc = accuracy_metric("acc", 1, 4);
  EXPECT_DOUBLE_EQ(acc.value, 0.25);
  EXPECT_DOUBLE_EQ(acc.standard_error, std::sqrt(0.25 * 0.75 / 3));
  EXPECT_TRUE(std::isnan(accuracy_metric("acc", 1, 1).standard_error));
  const std::vector<double> ll{-1.0, -2.0, -3.0};
  const MetricValue ppl = perplexity_metric(ll);
  EXPECT_DOUBLE_EQ(ppl.value, std::exp(2.0));
  EXPECT_NEAR(ppl.standard_error, std::exp(2.0) * std::sqrt(1.0 / 3.0), 1e-12);  // sd 1, n 3
}

// ---- the suite and the reports ------------------------------------------------------

TEST(ZeroShotSuite, FindsEveryTaskOfTheFixtureDirectoryInTableOrder) {
  const std::vector<SuiteEntry> entries = find_suite_files(kFixtures);
  std::vector<std::string> names;
  for (const SuiteEntry& e : entries) names.push_back(e.name);
  EXPECT_EQ(names, (std::vector<std::string>{"lambada", "blimp", "cbt_cn", "cbt_ne", "hellaswag", "piqa", "arc_easy"}));
  EXPECT_EQ(entries[5].path, kFixtures / "piqa/valid.jsonl");
  ScratchDir dir;
  const std::string message = thrown_message<DataError>([&] { find_suite_files(dir.path()); });
  EXPECT_NE(message.find("holds none of the suite's task files"), std::string::npos) << message;
  EXPECT_NE(message.find("hellaswag_val.jsonl"), std::string::npos) << message;
  EXPECT_THROW(find_suite_files(dir / "missing"), DataError);
}

TEST(ZeroShotSuite, TableAndReportsHoldEveryTaskAndExample) {
  ToyModel toy;
  SuiteRow row{"toy", {}};
  std::vector<TaskRun> runs;
  for (const SuiteEntry& e : find_suite_files(kFixtures)) {
    TaskData data = read_task(e.task, e.path);
    data.name = e.name;
    row.results.push_back(evaluate_task(toy.model, data, byte_tokens, toy_options()));
  }
  // The average is over the paper's six tasks: CBT's two files count once, as their mean.
  ASSERT_EQ(row.results.size(), 7u);
  double sum = 0.0, cbt = 0.0;
  for (const TaskResult& r : row.results) (r.task == ZeroShotTask::cbt ? cbt : sum) += 100.0 * r.metric("acc")->value;
  const double average = (sum + cbt / 2.0) / 6.0;
  const std::string table = format_suite_table(std::vector<SuiteRow>{row});
  EXPECT_NE(table.find("lambada"), std::string::npos) << table;
  EXPECT_NE(table.find("arc_easy"), std::string::npos) << table;
  EXPECT_NE(table.find(fmt::format("{:.2f}\n", average)), std::string::npos) << table;
  const nlohmann::json j = suite_to_json(std::vector<SuiteRow>{row});
  EXPECT_NEAR(j["rows"][0]["average"].get<double>(), average, 1e-9);
  EXPECT_EQ(j["rows"][0]["tasks"]["blimp"]["examples"], 5);

  const TaskResult& hellaswag = row.results[4];
  runs.push_back({"a,b", "ckpt", 7, "pope", hellaswag});
  const std::string csv = format_task_csv(runs);
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 1 + 3 * 4);
  EXPECT_EQ(csv.find("\"a,b\",hellaswag,0,"), csv.find('\n') + 1) << csv;
  const nlohmann::json tj = task_runs_to_json(runs);
  EXPECT_EQ(tj["runs"][0]["examples"].size(), 3u);
  EXPECT_EQ(tj["runs"][0]["examples"][1]["line"], 2);
  EXPECT_EQ(tj["runs"][0]["examples"][0]["choices"].size(), 4u);
  EXPECT_TRUE(tj["runs"][0]["metrics"].contains("acc_norm"));
  const std::string task_table = format_task_table(runs);
  EXPECT_NE(task_table.find("acc_norm"), std::string::npos) << task_table;
  EXPECT_NE(task_table.find(" ± "), std::string::npos) << task_table;
  runs[0].result = row.results[1];
  EXPECT_NE(format_task_table(runs).find("determiner_noun_agreement_1"), std::string::npos);
}
