// LAMBADA (OpenAI's processed test set, lambada_test.jsonl, one {"text": …} per line): the
// context is the text up to its last space, the continuation " " + the last word; correct when
// every token of it is the model's greedy choice. Perplexity is over the last words.
#include <fmt/format.h>

#include "eval/zero_shot/task_files.hpp"
#include "pope/zero_shot.hpp"

namespace pope {

TaskData read_lambada(const std::filesystem::path& path) {
  TaskData data{ZeroShotTask::lambada, "lambada", {path}, {}};
  for (const zero_shot::JsonRecord& record : zero_shot::read_jsonl(path)) {
    const std::string text = record.string("text");
    TaskExample example;
    example.line = record.line();
    const std::size_t space = text.rfind(' ');
    if (space == std::string::npos || space == 0) {
      example.skip_reason = "the text has no space, so no context before its last word";
    } else {
      example.context = text.substr(0, space);
      example.choices = {text.substr(space)};
    }
    data.examples.push_back(std::move(example));
  }
  return data;
}

}  // namespace pope
