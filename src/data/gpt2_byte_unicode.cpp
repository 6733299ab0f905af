#include "data/gpt2_byte_unicode.hpp"

#include <array>
#include <stdexcept>

#include "data/pretokenizer.hpp"

namespace pope {
namespace {

bool stands_for_itself(unsigned byte) {
  return (byte >= '!' && byte <= '~') || (byte >= 0xA1 && byte <= 0xAC) || (byte >= 0xAE && byte <= 0xFF);
}

struct ByteCharTable {
  std::array<char32_t, 256> char_of_byte{};
  std::array<int, 512> byte_of_char{};  // every mapped character is below U+0200; -1: none

  ByteCharTable() {
    byte_of_char.fill(-1);
    char32_t next_shifted = 0x100;
    for (unsigned byte = 0; byte < 256; ++byte) {
      char_of_byte[byte] = stands_for_itself(byte) ? char32_t(byte) : next_shifted++;
      byte_of_char[char_of_byte[byte]] = static_cast<int>(byte);
    }
  }
};

const ByteCharTable& table() {
  static const ByteCharTable instance;
  return instance;
}

// Decodes one well-formed UTF-8 sequence of `length` bytes.
char32_t decode_code_point(std::string_view sequence) {
  const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(sequence[i]); };
  if (sequence.size() == 1) return byte(0);
  char32_t cp = byte(0) & (0xFF >> (sequence.size() + 1));
  for (std::size_t i = 1; i < sequence.size(); ++i) cp = (cp << 6) | (byte(i) & 0x3F);
  return cp;
}

}  // namespace

char32_t gpt2_byte_to_char(unsigned char byte) { return table().char_of_byte[byte]; }

std::string gpt2_token_text_to_bytes(std::string_view token_text) {
  std::string bytes;
  std::size_t position = 0;
  while (position < token_text.size()) {
    const std::size_t length = utf8_sequence_length(token_text.substr(position));
    const char32_t cp = length == 0 ? 0x110000 : decode_code_point(token_text.substr(position, length));
    if (cp >= table().byte_of_char.size() || table().byte_of_char[cp] < 0)
      throw std::invalid_argument("byte " + std::to_string(position) +
                                  " is not a character of GPT-2's byte alphabet (invalid UTF-8 or outside "
                                  "the 256 mapped characters)");
    bytes.push_back(static_cast<char>(table().byte_of_char[cp]));
    position += length;
  }
  return bytes;
}

}  // namespace pope
