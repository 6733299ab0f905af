// ARC-Easy (AI2's ARC-Easy-{Train,Dev,Test}.jsonl): {"question": {"stem", "choices": [{"text",
// "label"}, …]}, "answerKey"}; "Question: {stem}\nAnswer:" with " " + each choice's text. The
// answer key is a choice's label, a letter or (in a few questions) a digit.
#include <fmt/format.h>

#include "eval/zero_shot/task_files.hpp"
#include "pope/zero_shot.hpp"

namespace pope {

TaskData read_arc_easy(const std::filesystem::path& path) {
  TaskData data{ZeroShotTask::arc_easy, "arc_easy", {path}, {}};
  for (const zero_shot::JsonRecord& record : zero_shot::read_jsonl(path)) {
    const nlohmann::json& question = record.member("question");
    TaskExample example;
    example.line = record.line();
    example.context = "Question: " + record.string("stem", &question, "question.stem") + "\nAnswer:";
    const nlohmann::json& choices = record.array("choices", -1, &question, "question.choices");
    if (choices.size() < 2) record.fail(fmt::format("question.choices has {} choices, expected at least 2",
                                                    choices.size()));
    const std::string key = record.string("answerKey");
    example.gold = -1;
    for (std::size_t i = 0; i < choices.size(); ++i) {
      const std::string name = fmt::format("question.choices[{}]", i);
      example.choices.push_back(fmt::format(" {}", record.string("text", &choices[i], name + ".text")));
      if (record.string("label", &choices[i], name + ".label") == key) example.gold = int(i);
    }
    if (example.gold < 0) record.fail(fmt::format("answerKey '{}' is not the label of any choice", key));
    data.examples.push_back(std::move(example));
  }
  return data;
}

}  // namespace pope
