// pope-eval's reports: a console table, CSV (one row per curve × length, read back by
// read_curves_csv for plotting elsewhere) and JSON (the same numbers plus the run's settings).
#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <fstream>
#include <map>

#include "data/regular_file.hpp"
#include "pope/eval.hpp"

namespace pope {

namespace {

constexpr const char* kCsvHeader =
    "label,checkpoint,step,position,train_length,length,windows,tokens,nll,perplexity,tail_tokens,tail_nll,"
    "tail_perplexity,batch,seconds,tokens_per_second";
constexpr std::size_t kCsvColumns = 16;

// JSON has no NaN: a length without windows reports null.
nlohmann::json number_or_null(double value) { return std::isfinite(value) ? nlohmann::json(value) : nlohmann::json(); }

std::vector<std::string> split_csv_line(const std::string& line) {
  std::vector<std::string> fields;
  std::size_t start = 0;
  for (std::size_t comma = line.find(','); comma != std::string::npos; comma = line.find(',', start)) {
    fields.push_back(line.substr(start, comma - start));
    start = comma + 1;
  }
  fields.push_back(line.substr(start));
  return fields;
}

template <class Number>
Number parse_number(const std::string& text, const std::string& file, int line, const char* column) {
  Number value{};
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc() || end != text.data() + text.size())
    throw DataError(fmt::format("{} line {}: column {} is '{}', expected a number", file, line, column, text));
  return value;
}

}  // namespace

std::string format_table(const EvalReport& report) {
  std::string out = fmt::format("data: {} ({} file(s), {} tokens) | device: {} | tail: last {} positions\n",
                                report.data, report.files, report.data_tokens, report.device, report.options.tail);
  for (const EvalCurve& curve : report.curves) {
    out += fmt::format("\n{} | {} | trained at {} | step {} | {}\n", curve.label, curve.position, curve.train_length,
                       curve.step, curve.checkpoint);
    out += fmt::format("{:>8} {:>8} {:>12} {:>10} {:>12} {:>6} {:>12}\n", "length", "windows", "tokens", "ppl",
                       "tail ppl", "batch", "tokens/s");
    for (const LengthResult& r : curve.results)
      out += fmt::format("{:>8} {:>8} {:>12} {:>10.3f} {:>12.3f} {:>6} {:>12.0f}\n", r.length, r.windows, r.tokens,
                         r.perplexity(), r.tail_perplexity(), r.batch, r.tokens_per_second());
  }
  return out;
}

std::string format_csv(const EvalReport& report) {
  std::string out = std::string(kCsvHeader) + "\n";
  for (const EvalCurve& c : report.curves)
    for (const LengthResult& r : c.results)
      out += fmt::format("{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}\n", c.label, c.checkpoint, c.step, c.position,
                         c.train_length, r.length, r.windows, r.tokens, r.mean_nll(), r.perplexity(), r.tail_tokens,
                         r.tail_mean_nll(), r.tail_perplexity(), r.batch, r.seconds, r.tokens_per_second());
  return out;
}

nlohmann::json report_to_json(const EvalReport& report) {
  nlohmann::json curves = nlohmann::json::array();
  for (const EvalCurve& c : report.curves) {
    nlohmann::json results = nlohmann::json::array();
    for (const LengthResult& r : c.results)
      results.push_back({{"length", r.length},
                         {"windows", r.windows},
                         {"tokens", r.tokens},
                         {"nll", number_or_null(r.mean_nll())},
                         {"perplexity", number_or_null(r.perplexity())},
                         {"tail_tokens", r.tail_tokens},
                         {"tail_nll", number_or_null(r.tail_mean_nll())},
                         {"tail_perplexity", number_or_null(r.tail_perplexity())},
                         {"batch", r.batch},
                         {"seconds", r.seconds},
                         {"tokens_per_second", number_or_null(r.tokens_per_second())}});
    curves.push_back({{"label", c.label},
                      {"checkpoint", c.checkpoint},
                      {"step", c.step},
                      {"position", c.position},
                      {"train_length", c.train_length},
                      {"results", results}});
  }
  return {{"data", report.data},
          {"files", report.files},
          {"data_tokens", report.data_tokens},
          {"device", report.device},
          {"tail", report.options.tail},
          {"max_batch_tokens", report.options.max_batch_tokens},
          {"max_windows", report.options.max_windows},
          {"curves", curves}};
}

std::vector<EvalCurve> read_curves_csv(const std::filesystem::path& csv_path) {
  const std::string path = csv_path.string();  // unquoted in messages: "FILE line N: …"
  // A FIFO or a device would block or never end: refused for what it is.
  if (const std::string why = why_not_regular_file(csv_path); !why.empty())
    throw DataError(fmt::format("{}: {}", path, why));
  std::ifstream in(csv_path);
  if (!in) throw DataError(fmt::format("cannot read {}", path));
  std::string line;
  if (!std::getline(in, line) || line != kCsvHeader)
    throw DataError(fmt::format("{} line 1: expected the pope-eval CSV header '{}'", path, kCsvHeader));
  std::vector<EvalCurve> curves;
  std::map<std::string, std::size_t> index;  // label → position in curves (first-seen order)
  for (int number = 2; std::getline(in, line); ++number) {
    if (line.empty()) continue;
    const auto f = split_csv_line(line);
    if (f.size() != kCsvColumns)
      throw DataError(fmt::format("{} line {}: {} columns, expected {}", path, number, f.size(), kCsvColumns));
    auto [it, added] = index.try_emplace(f[0], curves.size());
    if (added) {
      EvalCurve curve;
      curve.label = f[0];
      curve.checkpoint = f[1];
      curve.step = parse_number<long>(f[2], path, number, "step");
      curve.position = f[3];
      curve.train_length = parse_number<int>(f[4], path, number, "train_length");
      curves.push_back(std::move(curve));
    }
    LengthResult r;
    r.length = parse_number<int>(f[5], path, number, "length");
    r.windows = parse_number<std::uint64_t>(f[6], path, number, "windows");
    r.tokens = parse_number<std::int64_t>(f[7], path, number, "tokens");
    r.tail_tokens = parse_number<std::int64_t>(f[10], path, number, "tail_tokens");
    if (r.tokens > 0) r.nll_sum = parse_number<double>(f[8], path, number, "nll") * double(r.tokens);
    if (r.tail_tokens > 0) r.tail_nll_sum = parse_number<double>(f[11], path, number, "tail_nll") * double(r.tail_tokens);
    r.batch = parse_number<int>(f[13], path, number, "batch");
    r.seconds = parse_number<double>(f[14], path, number, "seconds");
    curves[it->second].results.push_back(r);
  }
  if (curves.empty()) throw DataError(fmt::format("{} holds no result rows", path));
  return curves;
}

}  // namespace pope
