// What the task readers share: opening a task file (regular files only, so that a FIFO cannot
// hang a run), its lines, and JSON Lines records whose field errors name the file and line.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace pope::zero_shot {

// DataError unless `path` is a regular file (after symbolic links).
void require_regular_file(const std::filesystem::path& path);

// The file's lines without their line ends ("\n" or "\r\n"); line i is number i + 1. A file
// without a single non-blank line is a DataError.
std::vector<std::string> read_lines(const std::filesystem::path& path);

// One record of a JSON Lines file.
class JsonRecord {
 public:
  JsonRecord(std::filesystem::path file, long line, nlohmann::json value)
      : file_(std::move(file)), line_(line), value_(std::move(value)) {}

  long line() const { return line_; }
  const nlohmann::json& value() const { return value_; }

  // DataError "<file> line <n>: <message>".
  [[noreturn]] void fail(std::string_view message) const;
  // Member `key` of `object` (the record itself by default); `name` spells it in errors
  // ("question.stem"), default `key`. Missing → fail.
  const nlohmann::json& member(std::string_view key, const nlohmann::json* object = nullptr,
                               std::string_view name = {}) const;
  std::string string(std::string_view key, const nlohmann::json* object = nullptr, std::string_view name = {}) const;
  long integer(std::string_view key, const nlohmann::json* object = nullptr, std::string_view name = {}) const;
  // An array member with exactly `size` elements (any size when size < 0).
  const nlohmann::json& array(std::string_view key, long size = -1, const nlohmann::json* object = nullptr,
                              std::string_view name = {}) const;

 private:
  std::filesystem::path file_;
  long line_;
  nlohmann::json value_;
};

// Every non-blank line of a JSON Lines file as an object. A line that is not a JSON object is
// a DataError naming the line; so is a file without records.
std::vector<JsonRecord> read_jsonl(const std::filesystem::path& path);

}  // namespace pope::zero_shot
