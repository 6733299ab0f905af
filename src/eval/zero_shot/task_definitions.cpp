// The six tasks by name: each one's rule, its metrics and its file's format and source (the
// text pope-eval --help and the README give), and read_task's dispatch to the readers.
#include <fmt/format.h>

#include <algorithm>

#include "pope/zero_shot.hpp"

namespace pope {

const std::vector<TaskDefinition>& task_definitions() {
  static const std::vector<TaskDefinition> definitions{
      {ZeroShotTask::lambada, "lambada", TaskRule::last_word, false,
       "OpenAI's LAMBADA test set, one {\"text\": ...} per line: "
       "https://openaipublic.blob.core.windows.net/gpt-2/data/lambada_test.jsonl"},
      {ZeroShotTask::hellaswag, "hellaswag", TaskRule::multiple_choice, true,
       "HellaSwag's jsonl (ctx_a/ctx_b or ctx, activity_label, endings[4], label): "
       "https://raw.githubusercontent.com/rowanz/hellaswag/master/data/hellaswag_val.jsonl"},
      {ZeroShotTask::piqa, "piqa", TaskRule::multiple_choice, true,
       "PIQA's valid.jsonl (goal, sol1, sol2) with valid-labels.lst beside it (one 0/1 per line; --labels "
       "names another): https://yonatanbisk.com/piqa/data/"},
      {ZeroShotTask::arc_easy, "arc_easy", TaskRule::multiple_choice, true,
       "ARC-Easy-Test.jsonl (question.stem, question.choices[{text,label}], answerKey) from "
       "https://ai2-public-datasets.s3.amazonaws.com/arc/ARC-V1-Feb2018.zip"},
      {ZeroShotTask::blimp, "blimp", TaskRule::minimal_pair, false,
       "a BLiMP paradigm jsonl (sentence_good, sentence_bad, UID) or a directory of them: data/*.jsonl of "
       "https://github.com/alexwarstadt/blimp"},
      {ZeroShotTask::cbt, "cbt", TaskRule::multiple_choice, false,
       "a CBT text file, e.g. cbtest_CN_test_2500ex.txt or cbtest_NE_test_2500ex.txt (20 numbered sentences, "
       "then '21 question<TAB>answer<TAB><TAB>cand1|...|cand10'): "
       "http://www.thespermwhale.com/jaseweston/babi/CBTest.tgz"},
  };
  return definitions;
}

const TaskDefinition& task_definition(ZeroShotTask task) {
  const auto& all = task_definitions();
  return *std::find_if(all.begin(), all.end(), [&](const TaskDefinition& d) { return d.task == task; });
}

std::optional<ZeroShotTask> task_from_name(std::string_view name) {
  for (const TaskDefinition& d : task_definitions())
    if (d.name == name) return d.task;
  return std::nullopt;
}

TaskData read_task(ZeroShotTask task, const std::filesystem::path& path, const std::filesystem::path& labels) {
  switch (task) {
    case ZeroShotTask::lambada: return read_lambada(path);
    case ZeroShotTask::hellaswag: return read_hellaswag(path);
    case ZeroShotTask::piqa: return read_piqa(path, labels);
    case ZeroShotTask::arc_easy: return read_arc_easy(path);
    case ZeroShotTask::blimp: return read_blimp(path);
    case ZeroShotTask::cbt: return read_cbt(path);
  }
  throw std::invalid_argument("read_task: unknown task");
}

}  // namespace pope
