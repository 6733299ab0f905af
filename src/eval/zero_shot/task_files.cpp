// Reading task files: regular-file checks, lines, JSON Lines records with file:line errors.
#include "eval/zero_shot/task_files.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>

#include "config/bounded_json.hpp"
#include "pope/data.hpp"

namespace pope::zero_shot {

namespace {

bool blank(const std::string& line) {
  return std::all_of(line.begin(), line.end(), [](unsigned char c) { return c == ' ' || c == '\t' || c == '\r'; });
}

std::string_view type_name(const nlohmann::json& value) {
  return value.is_number_integer() ? "an integer" : value.is_number() ? "a number" : value.is_string() ? "a string"
         : value.is_array()        ? "an array"   : value.is_object() ? "an object" : value.is_boolean() ? "a boolean"
                                                                                                 : "null";
}

}  // namespace

void require_regular_file(const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) throw DataError(fmt::format("{} does not exist", path.string()));
  if (!std::filesystem::is_regular_file(path, ec))
    throw DataError(fmt::format("{} is not a regular file (a directory, FIFO or device); expected a task file",
                                path.string()));
}

std::vector<std::string> read_lines(const std::filesystem::path& path) {
  require_regular_file(path);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(fmt::format("cannot read {}", path.string()));
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    lines.push_back(std::move(line));
  }
  if (in.bad()) throw DataError(fmt::format("cannot read {}", path.string()));
  if (std::all_of(lines.begin(), lines.end(), blank))
    throw DataError(fmt::format("{} is empty: it holds no examples", path.string()));
  return lines;
}

void JsonRecord::fail(std::string_view message) const {
  throw DataError(fmt::format("{} line {}: {}", file_.string(), line_, message));
}

const nlohmann::json& JsonRecord::member(std::string_view key, const nlohmann::json* object,
                                         std::string_view name) const {
  const nlohmann::json& parent = object ? *object : value_;
  const std::string_view spelled = name.empty() ? key : name;
  if (!parent.is_object()) fail(fmt::format("expected an object holding '{}'", spelled));
  const auto it = parent.find(key);
  if (it == parent.end()) fail(fmt::format("missing field '{}'", spelled));
  return *it;
}

std::string JsonRecord::string(std::string_view key, const nlohmann::json* object, std::string_view name) const {
  const nlohmann::json& value = member(key, object, name);
  if (!value.is_string())
    fail(fmt::format("field '{}' is {}, expected a string", name.empty() ? key : name, type_name(value)));
  return value.get<std::string>();
}

long JsonRecord::integer(std::string_view key, const nlohmann::json* object, std::string_view name) const {
  const nlohmann::json& value = member(key, object, name);
  const std::string_view spelled = name.empty() ? key : name;
  // HellaSwag's labels are integers; some copies hold them as strings of digits.
  if (value.is_string()) {
    const std::string text = value.get<std::string>();
    if (!text.empty() && text.size() < 10 && std::all_of(text.begin(), text.end(), [](unsigned char c) { return c >= '0' && c <= '9'; })) return std::stol(text);
  }
  if (!value.is_number_integer()) fail(fmt::format("field '{}' is {}, expected an integer", spelled, type_name(value)));
  return value.get<long>();
}

const nlohmann::json& JsonRecord::array(std::string_view key, long size, const nlohmann::json* object,
                                        std::string_view name) const {
  const nlohmann::json& value = member(key, object, name);
  const std::string_view spelled = name.empty() ? key : name;
  if (!value.is_array()) fail(fmt::format("field '{}' is {}, expected an array", spelled, type_name(value)));
  if (size >= 0 && long(value.size()) != size)
    fail(fmt::format("field '{}' has {} elements, expected {}", spelled, value.size(), size));
  return value;
}

std::vector<JsonRecord> read_jsonl(const std::filesystem::path& path) {
  const std::vector<std::string> lines = read_lines(path);
  std::vector<JsonRecord> records;
  for (std::size_t i = 0; i < lines.size(); ++i) {
    if (blank(lines[i])) continue;
    JsonRecord record(path, long(i) + 1, parse_json(lines[i], nullptr, false));
    if (record.value().is_discarded()) record.fail("not valid JSON (expected one JSON object per line)");
    if (!record.value().is_object()) record.fail(fmt::format("{} where a JSON object was expected",
                                                             type_name(record.value())));
    records.push_back(std::move(record));
  }
  return records;
}

}  // namespace pope::zero_shot
