// BLiMP (one jsonl per paradigm, e.g. anaphor_gender_agreement.jsonl, with "sentence_good" and
// "sentence_bad"): each sentence scored whole after the end-of-text token; correct when the good
// one is more likely. The paradigm is the record's "UID", else the file's stem.
#include <fmt/format.h>

#include <algorithm>

#include "eval/zero_shot/task_files.hpp"
#include "pope/data.hpp"
#include "pope/zero_shot.hpp"

namespace pope {

namespace {

std::vector<std::filesystem::path> paradigm_files(const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::is_directory(path, ec)) return {path};
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(path, ec))
    if (entry.path().extension() == ".jsonl") files.push_back(entry.path());
  if (ec) throw DataError(fmt::format("cannot list {}: {}", path.string(), ec.message()));
  if (files.empty()) throw DataError(fmt::format("{} holds no BLiMP paradigm files (*.jsonl)", path.string()));
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

TaskData read_blimp(const std::filesystem::path& path) {
  TaskData data{ZeroShotTask::blimp, "blimp", paradigm_files(path), {}};
  for (std::size_t f = 0; f < data.files.size(); ++f) {
    for (const zero_shot::JsonRecord& record : zero_shot::read_jsonl(data.files[f])) {
      TaskExample example;
      example.file = f;
      example.line = record.line();
      example.choices = {record.string("sentence_good"), record.string("sentence_bad")};
      example.group = record.value().contains("UID") ? record.string("UID") : data.files[f].stem().string();
      data.examples.push_back(std::move(example));
    }
  }
  return data;
}

}  // namespace pope
