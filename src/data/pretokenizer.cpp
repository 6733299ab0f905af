#include "data/pretokenizer.hpp"

#include <string>

#include "pope/tokenizer.hpp"

#ifdef POPE_HAVE_PCRE2
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#endif

namespace pope {

std::size_t utf8_sequence_length(std::string_view text) {
  if (text.empty()) return 0;
  const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char lead = byte(0);
  if (lead < 0x80) return 1;
  std::size_t length;
  unsigned char second_low = 0x80, second_high = 0xBF;  // the second byte's range depends on the lead
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) second_low = 0xA0;   // no overlong 3-byte forms
    if (lead == 0xED) second_high = 0x9F;  // no surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) second_low = 0x90;   // no overlong 4-byte forms
    if (lead == 0xF4) second_high = 0x8F;  // nothing above U+10FFFF
  } else {
    return 0;
  }
  if (text.size() < length || byte(1) < second_low || byte(1) > second_high) return 0;
  for (std::size_t i = 2; i < length; ++i)
    if (byte(i) < 0x80 || byte(i) > 0xBF) return 0;
  return length;
}

std::vector<std::string_view> split_at_safe_boundaries(std::string_view text, std::size_t target_bytes) {
  const auto printable = [&](std::size_t i) { return text[i] > ' ' && text[i] < 0x7F; };
  std::vector<std::string_view> chunks;
  std::size_t start = 0;
  while (text.size() - start > target_bytes) {
    std::size_t cut = std::string_view::npos;
    for (std::size_t newline = text.find('\n', start + target_bytes); newline != std::string_view::npos;
         newline = text.find('\n', newline + 1)) {
      if (newline > start && newline + 1 < text.size() && printable(newline - 1) && printable(newline + 1)) {
        cut = newline + 1;
        break;
      }
    }
    if (cut == std::string_view::npos) break;
    chunks.push_back(text.substr(start, cut - start));
    start = cut;
  }
  chunks.push_back(text.substr(start));
  return chunks;
}

#ifdef POPE_HAVE_PCRE2

namespace {

// Unicode White_Space, the meaning of \s in tiktoken's pattern.
#define POPE_WHITE_SPACE \
  R"(\t\n\x{0B}\f\r\x{20}\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})"

constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^)" POPE_WHITE_SPACE R"(\p{L}\p{N}]+)"
    R"(|[)" POPE_WHITE_SPACE R"(]+(?![^)" POPE_WHITE_SPACE R"(])|[)" POPE_WHITE_SPACE R"(]+)";

#undef POPE_WHITE_SPACE

std::string pcre2_message(int code) {
  PCRE2_UCHAR buffer[256];
  pcre2_get_error_message(code, buffer, sizeof buffer);
  return reinterpret_cast<const char*>(buffer);
}

}  // namespace

struct Gpt2PreTokenizer::Pattern {
  pcre2_code* code = nullptr;
  bool jit = false;  // pcre2_jit_match skips pcre2_match's per-call checks: pieces are short
  ~Pattern() { pcre2_code_free(code); }
};

Gpt2PreTokenizer::Gpt2PreTokenizer() : pattern_(std::make_unique<Pattern>()) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  pattern_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kGpt2Pattern), PCRE2_ZERO_TERMINATED,
                                 PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  if (pattern_->code == nullptr)
    throw TokenizerError("GPT-2 pre-tokenizer pattern failed to compile at offset " + std::to_string(offset) +
                         ": " + pcre2_message(error));
  // JIT is a speed-up only: where the platform lacks it, pcre2_match interprets the same pattern.
  pattern_->jit = pcre2_jit_compile(pattern_->code, PCRE2_JIT_COMPLETE) == 0;
}

void Gpt2PreTokenizer::split(std::string_view text, const std::function<void(std::string_view)>& on_piece) const {
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> match(
      pcre2_match_data_create_from_pattern(pattern_->code, nullptr), &pcre2_match_data_free);
  if (!match) throw std::bad_alloc();

  // Splits one run of valid UTF-8. Every position starts a match (the last two alternatives
  // take any whitespace, the others any other character), so pieces tile the run.
  auto split_valid = [&](std::string_view run) {
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(run.data());
    std::size_t start = 0;
    while (start < run.size()) {
      const int rc = pattern_->jit
                         ? pcre2_jit_match(pattern_->code, subject, run.size(), start, 0, match.get(), nullptr)
                         : pcre2_match(pattern_->code, subject, run.size(), start, PCRE2_NO_UTF_CHECK, match.get(), nullptr);
      const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match.get());
      if (rc < 0 || ovector[0] != start || ovector[1] <= start)
        throw TokenizerError("GPT-2 pre-tokenizer: no piece at byte " + std::to_string(start) +
                             (rc < 0 ? " (" + pcre2_message(rc) + ")" : std::string()));
      on_piece(run.substr(start, ovector[1] - start));
      start = ovector[1];
    }
  };

  std::size_t run_start = 0, position = 0;
  while (position < text.size()) {
    const std::size_t length = utf8_sequence_length(text.substr(position));
    if (length > 0) {
      position += length;
      continue;
    }
    split_valid(text.substr(run_start, position - run_start));
    on_piece(text.substr(position, 1));
    run_start = ++position;
  }
  split_valid(text.substr(run_start));
}

#else  // no PCRE2

struct Gpt2PreTokenizer::Pattern {};

Gpt2PreTokenizer::Gpt2PreTokenizer() {
  throw TokenizerError(
      "this build of pope lacks PCRE2, which the GPT-2 pre-tokenizer needs: install libpcre2-dev "
      "(scripts/setup.sh does) and reconfigure with CMake");
}

void Gpt2PreTokenizer::split(std::string_view, const std::function<void(std::string_view)>&) const {}

#endif

Gpt2PreTokenizer::~Gpt2PreTokenizer() = default;
Gpt2PreTokenizer::Gpt2PreTokenizer(Gpt2PreTokenizer&&) noexcept = default;
Gpt2PreTokenizer& Gpt2PreTokenizer::operator=(Gpt2PreTokenizer&&) noexcept = default;

}  // namespace pope
