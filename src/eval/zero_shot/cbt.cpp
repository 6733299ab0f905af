// The Children's Book Test (cbtest_{CN,NE,V,P}_{train,valid_2000ex,test_2500ex}.txt): examples
// of 20 numbered context lines "N sentence" and a line "21 question with XXXXX<TAB>answer<TAB>
// <TAB>cand1|…|cand10", a blank line between examples. As in the GPT-2 paper, the context is
// the 20 sentences and the question up to XXXXX; each choice is a candidate and the rest of the
// question, scored together; the answer is one of the candidates.
#include <fmt/format.h>

#include <algorithm>
#include <cctype>

#include "eval/split_text.hpp"
#include "eval/zero_shot/task_files.hpp"
#include "pope/data.hpp"
#include "pope/zero_shot.hpp"

namespace pope {

namespace {

constexpr int kContextLines = 20;

// "cbt_cn" for cbtest_CN_test_2500ex.txt: the word class names the report.
std::string cbt_name(const std::filesystem::path& path) {
  const std::string stem = path.stem().string();
  if (stem.rfind("cbtest_", 0) != 0) return "cbt";
  const std::size_t end = stem.find('_', 7);
  std::string kind = stem.substr(7, end == std::string::npos ? std::string::npos : end - 7);
  std::transform(kind.begin(), kind.end(), kind.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  return kind.empty() ? "cbt" : "cbt_" + kind;
}

class CbtParser {
 public:
  explicit CbtParser(const std::filesystem::path& path) : path_(path) {}

  [[noreturn]] void fail(std::size_t line, std::string_view message) const {
    throw DataError(fmt::format("{} line {}: {}", path_.string(), line, message));
  }

  // The text after "N " on `line`, checking that N is `number`.
  std::string numbered(const std::string& text, std::size_t line, int number) const {
    const std::string prefix = std::to_string(number) + " ";
    if (text.rfind(prefix, 0) != 0)
      fail(line, fmt::format("expected line {} of an example to start with '{}' (20 numbered sentences, then the "
                             "question as line 21, a blank line between examples)",
                             number, prefix));
    return text.substr(prefix.size());
  }

  // Lines [first, first + 21) hold one example.
  TaskExample example(const std::vector<std::string>& lines, std::size_t first) const {
    std::string passage;
    for (int n = 1; n <= kContextLines; ++n) {
      if (n > 1) passage += ' ';
      passage += numbered(lines[first + std::size_t(n) - 1], first + std::size_t(n), n);
    }
    const std::size_t line = first + kContextLines + 1;
    const std::vector<std::string> fields = split_text(numbered(lines[line - 1], line, kContextLines + 1), '\t');
    if (fields.size() != 4 || !fields[2].empty())
      fail(line, "expected 'question<TAB>answer<TAB><TAB>cand1|cand2|…' on the question line");
    const std::string& question = fields[0];
    const std::size_t blank = question.find("XXXXX");
    if (blank == std::string::npos) fail(line, "the question has no XXXXX blank");
    TaskExample example;
    example.line = long(line);
    example.context = passage + " " + question.substr(0, blank);
    const std::string rest = question.substr(blank + 5);
    const std::vector<std::string> candidates = split_text(fields[3], '|');
    if (candidates.size() < 2) fail(line, fmt::format("{} candidates, expected at least 2", candidates.size()));
    example.gold = -1;
    for (std::size_t i = 0; i < candidates.size(); ++i) {
      if (candidates[i].empty()) fail(line, fmt::format("candidate {} is empty", i + 1));
      example.choices.push_back(candidates[i] + rest);
      if (candidates[i] == fields[1]) example.gold = int(i);
    }
    if (example.gold < 0) fail(line, fmt::format("the answer '{}' is not among the candidates", fields[1]));
    return example;
  }

 private:
  const std::filesystem::path& path_;
};

}  // namespace

TaskData read_cbt(const std::filesystem::path& path) {
  TaskData data{ZeroShotTask::cbt, cbt_name(path), {path}, {}};
  const std::vector<std::string> lines = zero_shot::read_lines(path);
  const CbtParser parser(path);
  for (std::size_t i = 0; i < lines.size();) {
    if (lines[i].empty()) {
      ++i;
      continue;
    }
    if (lines.size() - i < kContextLines + 1)
      parser.fail(lines.size(), fmt::format("the file ends inside an example that begins on line {} (an example has "
                                            "21 lines)",
                                            i + 1));
    data.examples.push_back(parser.example(lines, i));
    i += kContextLines + 1;
    if (i < lines.size() && !lines[i].empty()) parser.fail(i + 1, "expected a blank line after line 21 of an example");
  }
  return data;
}

}  // namespace pope
