// HellaSwag (the official hellaswag_val.jsonl): the query is activity_label + ": " + ctx_a + " " +
// capitalised ctx_b (or the whole ctx), each of the four endings a choice after a space, all
// cleaned up as lm-evaluation-harness does; `label` is the gold ending.
#include <fmt/format.h>

#include <cctype>

#include "eval/zero_shot/task_files.hpp"
#include "pope/zero_shot.hpp"

namespace pope {

namespace {

std::string_view trimmed(std::string_view text) {
  const auto space = [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; };
  while (!text.empty() && space(text.front())) text.remove_prefix(1);
  while (!text.empty() && space(text.back())) text.remove_suffix(1);
  return text;
}

void replace_all(std::string& text, std::string_view from, std::string_view to) {
  for (std::size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size()))
    text.replace(at, from.size(), to);
}

}  // namespace

std::string hellaswag_preprocess(std::string_view text) {
  std::string out(trimmed(text));
  replace_all(out, " [title]", ". ");
  // Drop every "[...]" span (WikiHow markup), as the regex \[.*?\] does.
  std::string kept;
  for (std::size_t i = 0; i < out.size(); ++i) {
    const std::size_t close = out[i] == '[' ? out.find(']', i) : std::string::npos;
    if (close != std::string::npos) i = close;
    else kept += out[i];
  }
  replace_all(kept, "  ", " ");
  return kept;
}

TaskData read_hellaswag(const std::filesystem::path& path) {
  TaskData data{ZeroShotTask::hellaswag, "hellaswag", {path}, {}};
  for (const zero_shot::JsonRecord& record : zero_shot::read_jsonl(path)) {
    std::string context;
    if (record.value().contains("ctx_a")) {
      // Python's str.capitalize, as the harness calls it: the first letter upper, the rest lower.
      std::string ctx_b = record.string("ctx_b");
      for (char& c : ctx_b) c = char(std::tolower(static_cast<unsigned char>(c)));
      if (!ctx_b.empty()) ctx_b[0] = char(std::toupper(static_cast<unsigned char>(ctx_b[0])));
      context = record.string("ctx_a") + " " + ctx_b;
    } else {
      context = record.string("ctx");
    }
    TaskExample example;
    example.line = record.line();
    example.context = hellaswag_preprocess(record.string("activity_label") + ": " + context);
    const nlohmann::json& endings = record.array("endings", 4);
    for (std::size_t i = 0; i < endings.size(); ++i) {
      if (!endings[i].is_string()) record.fail(fmt::format("endings[{}] is not a string", i));
      example.choices.push_back(fmt::format(" {}", hellaswag_preprocess(endings[i].get<std::string>())));
    }
    const long label = record.integer("label");
    if (label < 0 || label > 3) record.fail(fmt::format("label {} is out of range 0..3", label));
    example.gold = int(label);
    data.examples.push_back(std::move(example));
  }
  return data;
}

}  // namespace pope
