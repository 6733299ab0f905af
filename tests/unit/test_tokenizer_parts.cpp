// The tokenizer's building blocks, without the downloaded vocabulary: SHA-256, UTF-8
// validation, GPT-2's byte alphabet, BPE merging and the pre-tokenizer.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "data/bpe_merge.hpp"
#include "data/gpt2_byte_unicode.hpp"
#include "data/gpt2_sha256.hpp"
#include "data/pretokenizer.hpp"
#include "pope/tokenizer.hpp"

using namespace pope;

TEST(Sha256, MatchesPublishedAndPythonDigests) {
  // FIPS 180-4 examples ("", "abc", a million 'a') and hashlib digests around the padding edges.
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex(std::string(55, 'a')), "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318");
  EXPECT_EQ(sha256_hex(std::string(56, 'a')), "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a");
  EXPECT_EQ(sha256_hex(std::string(64, 'a')), "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb");
  EXPECT_EQ(sha256_hex(std::string(1000000, 'a')),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256, IncrementalUpdatesEqualOneShot) {
  std::string message;
  for (int i = 0; i < 300; ++i) message.push_back(static_cast<char>(i * 37));
  for (std::size_t cut : {0, 1, 63, 64, 65, 200}) {
    Sha256 hash;
    hash.update(std::string_view(message).substr(0, cut));
    hash.update(std::string_view(message).substr(cut));
    EXPECT_EQ(hash.hex_digest(), sha256_hex(message)) << "cut at " << cut;
  }
}

TEST(Utf8, SequenceLengthFollowsUnicodeTable3_7) {
  EXPECT_EQ(utf8_sequence_length("a"), 1u);
  EXPECT_EQ(utf8_sequence_length("\xC3\xA9"), 2u);          // é
  EXPECT_EQ(utf8_sequence_length("\xE6\x97\xA5"), 3u);      // 日
  EXPECT_EQ(utf8_sequence_length("\xF0\x9F\x91\x8B"), 4u);  // 👋
  EXPECT_EQ(utf8_sequence_length(""), 0u);
  EXPECT_EQ(utf8_sequence_length("\x80"), 0u);              // lone continuation
  EXPECT_EQ(utf8_sequence_length("\xC0\xAF"), 0u);          // overlong '/'
  EXPECT_EQ(utf8_sequence_length("\xE0\x80\xAF"), 0u);      // overlong 3-byte
  EXPECT_EQ(utf8_sequence_length("\xED\xA0\x80"), 0u);      // surrogate U+D800
  EXPECT_EQ(utf8_sequence_length("\xF4\x90\x80\x80"), 0u);  // above U+10FFFF
  EXPECT_EQ(utf8_sequence_length("\xE6\x97"), 0u);          // truncated
  EXPECT_EQ(utf8_sequence_length("\xE6\x97" "a"), 0u);      // bad continuation
  EXPECT_EQ(utf8_sequence_length("\xFF"), 0u);
}

TEST(Gpt2ByteAlphabet, SpaceIsGDotAndEveryByteRoundTrips) {
  EXPECT_EQ(gpt2_byte_to_char(' '), U'\u0120');
  EXPECT_EQ(gpt2_byte_to_char('\n'), U'\u010A');
  EXPECT_EQ(gpt2_byte_to_char('A'), U'A');
  EXPECT_EQ(gpt2_byte_to_char(0xE9), U'\u00E9');
  EXPECT_EQ(gpt2_byte_to_char(0xAD), U'\u0143');  // soft hyphen: the last shifted byte
  EXPECT_EQ(gpt2_token_text_to_bytes("\xC4\xA0the"), " the");
  for (unsigned byte = 0; byte < 256; ++byte) {
    const char32_t c = gpt2_byte_to_char(static_cast<unsigned char>(byte));
    std::string utf8;  // all mapped characters are below U+0800: one or two bytes
    if (c < 0x80) {
      utf8.push_back(static_cast<char>(c));
    } else {
      utf8.push_back(static_cast<char>(0xC0 | (c >> 6)));
      utf8.push_back(static_cast<char>(0x80 | (c & 0x3F)));
    }
    EXPECT_EQ(gpt2_token_text_to_bytes(utf8), std::string(1, static_cast<char>(byte))) << byte;
  }
  EXPECT_THROW(gpt2_token_text_to_bytes(" "), std::invalid_argument);      // space is spelled Ġ
  EXPECT_THROW(gpt2_token_text_to_bytes("\xE6\x97\xA5"), std::invalid_argument);
  EXPECT_THROW(gpt2_token_text_to_bytes("\xFF"), std::invalid_argument);
}

namespace {

// tiktoken's rule written the slow, obvious way: rescan all adjacent pairs after every merge.
std::vector<std::uint16_t> reference_bpe(std::string_view piece, const BpeRanks& ranks) {
  std::vector<std::string> parts;
  for (char c : piece) parts.emplace_back(1, c);
  while (parts.size() > 1) {
    std::uint32_t best = BpeRanks::kNone;
    std::size_t best_index = 0;
    for (std::size_t i = 0; i + 1 < parts.size(); ++i) {
      const std::uint32_t rank = ranks.find(parts[i] + parts[i + 1]);
      if (rank < best) {
        best = rank;
        best_index = i;
      }
    }
    if (best == BpeRanks::kNone) break;
    parts[best_index] += parts[best_index + 1];
    parts.erase(parts.begin() + static_cast<std::ptrdiff_t>(best_index) + 1);
  }
  std::vector<std::uint16_t> ids;
  for (const auto& part : parts) ids.push_back(static_cast<std::uint16_t>(ranks.find(part)));
  return ids;
}

}  // namespace

TEST(BpeMerge, LowestRankFirstAndLeftmostAmongEqual) {
  BpeRanks ranks;
  ranks.add("a", 0);
  ranks.add("b", 1);
  ranks.add("aa", 2);
  ranks.add("ab", 3);
  ranks.add("aab", 4);
  std::vector<std::uint16_t> out;
  bpe_merge("aaa", ranks, out);  // the leftmost "aa" merges first: [aa][a]
  EXPECT_EQ(out, (std::vector<std::uint16_t>{2, 0}));
  out.clear();
  bpe_merge("aab", ranks, out);  // "aa" (2) before "ab" (3), then "aa"+"b" = "aab" (4)
  EXPECT_EQ(out, (std::vector<std::uint16_t>{4}));
  out.clear();
  bpe_merge("ba", ranks, out);  // "ba" has no rank
  EXPECT_EQ(out, (std::vector<std::uint16_t>{1, 0}));
  out.clear();
  EXPECT_THROW(bpe_merge("ac", ranks, out), std::invalid_argument);
  EXPECT_THROW(ranks.add("a", 9), std::invalid_argument);
}

TEST(BpeMerge, EqualsTheObviousAlgorithmOnRandomVocabularies) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    // A random byte-level vocabulary over "abc": all bytes, then random strings of 2..6 bytes.
    BpeRanks ranks;
    std::uint32_t next_rank = 0;
    for (char c : std::string("abc")) ranks.add(std::string(1, c), next_rank++);
    for (int i = 0; i < 30; ++i) {
      std::string token;
      const int length = 2 + static_cast<int>(rng() % 5);
      for (int j = 0; j < length; ++j) token.push_back("abc"[rng() % 3]);
      if (ranks.find(token) == BpeRanks::kNone) ranks.add(token, next_rank++);
    }
    for (int p = 0; p < 10; ++p) {
      std::string piece;
      const int length = 1 + static_cast<int>(rng() % 40);
      for (int j = 0; j < length; ++j) piece.push_back("abc"[rng() % 3]);
      std::vector<std::uint16_t> out;
      bpe_merge(piece, ranks, out);
      ASSERT_EQ(out, reference_bpe(piece, ranks)) << "trial " << trial << " piece " << piece;
    }
  }
}

// Long pieces are merged in parts of at most max_bytes, cut before a UTF-8 lead byte.
TEST(BpeMerge, BoundedMergeCutsLongPiecesAtCharacterStarts) {
  BpeRanks ranks;
  for (unsigned b = 0; b < 256; ++b) ranks.add(std::string(1, static_cast<char>(b)), b);
  ranks.add("aa", 256);
  ranks.add("aaaa", 257);
  ranks.add("\xC3\xA9", 258);  // é
  const auto merged = [&](std::string_view piece, std::size_t max_bytes) {
    std::vector<std::uint16_t> out;
    bpe_merge_bounded(piece, ranks, out, max_bytes);
    return out;
  };
  using Ids = std::vector<std::uint16_t>;
  EXPECT_EQ(merged("aaaaaaaaaa", 100), (Ids{257, 257, 256}));  // short: bpe_merge as it is
  EXPECT_EQ(merged("aaaaaaaaaa", 5), (Ids{257, 97, 257, 97}));  // [aaaaa][aaaaa]
  // 5 bytes would end inside the second é: the cut backs off to the character's start.
  EXPECT_EQ(merged("a\xC3\xA9\xC3\xA9\xC3\xA9", 4), (Ids{97, 258, 258, 258}));
  EXPECT_EQ(merged("\xC3\xA9\xC3\xA9\xC3\xA9", 5), (Ids{258, 258, 258}));
  EXPECT_THROW(merged("aaaa", 3), std::invalid_argument);
}

// A piece at the bound is merged whole; one byte more and it is cut there.
TEST(BpeMerge, Gpt2BoundIsSixtyFourKibibytes) {
  BpeRanks ranks;
  for (unsigned b = 0; b < 256; ++b) ranks.add(std::string(1, static_cast<char>(b)), b);
  ranks.add("ab", 256);
  std::string piece;
  for (std::size_t i = 0; i < kMaxBpePieceBytes / 2; ++i) piece += "ab";
  std::vector<std::uint16_t> out;
  bpe_merge_bounded(piece, ranks, out);
  EXPECT_EQ(out, std::vector<std::uint16_t>(kMaxBpePieceBytes / 2, 256));
  out.clear();
  bpe_merge_bounded("b" + piece, ranks, out);  // [b ab … ab a][b]: the cut splits the last "ab"
  ASSERT_EQ(out.size(), kMaxBpePieceBytes / 2 + 2);
  EXPECT_EQ(out.front(), 'b');
  EXPECT_EQ(out[out.size() - 2], 'a');
  EXPECT_EQ(out.back(), 'b');
  EXPECT_EQ(kMaxBpePieceBytes, 65536u);
}

#ifdef POPE_HAVE_PCRE2

namespace {

std::vector<std::string> pieces_of(std::string_view text) {
  static const Gpt2PreTokenizer pre_tokenizer;
  std::vector<std::string> pieces;
  pre_tokenizer.split(text, [&](std::string_view piece) { pieces.emplace_back(piece); });
  return pieces;
}

}  // namespace

TEST(Gpt2PreTokenizer, SplitsLikeGpt2) {
  using Pieces = std::vector<std::string>;
  EXPECT_EQ(pieces_of("Hello world"), (Pieces{"Hello", " world"}));
  EXPECT_EQ(pieces_of("it's 'll"), (Pieces{"it", "'s", " '", "ll"}));
  // \s+(?!\S): a whitespace run before a word leaves its last space to the word.
  EXPECT_EQ(pieces_of("a   b"), (Pieces{"a", "  ", " b"}));
  EXPECT_EQ(pieces_of("a\n\nb"), (Pieces{"a", "\n", "\n", "b"}));
  EXPECT_EQ(pieces_of("a\n\n"), (Pieces{"a", "\n\n"}));
  EXPECT_EQ(pieces_of(" 123abc!!"), (Pieces{" 123", "abc", "!!"}));
  EXPECT_EQ(pieces_of("caf\xC3\xA9 na\xC3\xAFve"), (Pieces{"caf\xC3\xA9", " na\xC3\xAFve"}));
  // U+3000 (ideographic space) is White_Space, so \s+(?!\S) leaves the last one of the run, but
  // only ' ' joins a following word; U+180E (Mongolian vowel separator) is not White_Space.
  EXPECT_EQ(pieces_of("a\xE3\x80\x80\xE3\x80\x80" "b"), (Pieces{"a", "\xE3\x80\x80", "\xE3\x80\x80", "b"}));
  EXPECT_EQ(pieces_of("a \xE1\xA0\x8E"), (Pieces{"a", " \xE1\xA0\x8E"}));
  EXPECT_TRUE(pieces_of("").empty());
}

TEST(Gpt2PreTokenizer, InvalidBytesArePiecesOfTheirOwn) {
  using Pieces = std::vector<std::string>;
  EXPECT_EQ(pieces_of("ab\xFF" "cd"), (Pieces{"ab", "\xFF", "cd"}));
  EXPECT_EQ(pieces_of(" \xE6\x97x"), (Pieces{" ", "\xE6", "\x97", "x"}));
  EXPECT_EQ(pieces_of("\xC3"), (Pieces{"\xC3"}));
}

TEST(Gpt2PreTokenizer, LongRunsNeitherCrashNorSplitWrongly) {
  // Megabyte runs of one class exercise the JIT's backtracking stack.
  for (char c : std::string(" a1!\n")) {
    const std::string run(1 << 20, c);
    const auto pieces = pieces_of(run);
    std::size_t covered = 0;
    for (const auto& p : pieces) covered += p.size();
    EXPECT_EQ(covered, run.size()) << "class of '" << c << "'";
    EXPECT_LE(pieces.size(), 2u) << "class of '" << c << "'";
  }
}

#else

TEST(Gpt2PreTokenizer, WithoutPcre2SaysSo) {
  try {
    Gpt2PreTokenizer pre_tokenizer;
    FAIL() << "expected TokenizerError";
  } catch (const TokenizerError& e) {
    EXPECT_NE(std::string(e.what()).find("PCRE2"), std::string::npos);
  }
}

#endif
