// GPT-2's reversible byte ↔ character mapping. encoder.json and vocab.bpe spell every token's
// bytes as printable characters: the 188 bytes that are printable Latin-1 ('!'..'~', '¡'..'¬',
// '®'..'ÿ') stand for themselves, and the other 68 bytes (controls, space, DEL, NBSP, soft
// hyphen) are shifted to U+0100, U+0101, … in byte order — so ' ' (0x20) is written 'Ġ' (U+0120).
#pragma once

#include <string>
#include <string_view>

namespace pope {

// The character (code point) that stands for `byte`.
char32_t gpt2_byte_to_char(unsigned char byte);

// Turns a token as spelled in encoder.json / vocab.bpe (UTF-8 text of mapped characters) back
// into its bytes. Throws std::invalid_argument naming the offending character position.
std::string gpt2_token_text_to_bytes(std::string_view token_text);

}  // namespace pope
