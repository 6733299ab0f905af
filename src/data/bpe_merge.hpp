// Byte-pair merging over a rank table, as tiktoken does it: a piece starts as single bytes
// and, while some adjacent pair's concatenation is in the table, the pair with the lowest
// rank is joined (the leftmost one among equal ranks). The output is the ranks of the final
// parts, which for GPT-2 are the token ids.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace pope {

// Byte string → rank. Lookups are most of the tokenizer's work (one per piece, several per
// BPE merge), so this is a flat open-addressing table: the keys live in one byte arena and a
// slot holds the key's hash beside its entry, so a miss rarely touches the key bytes and a
// lookup touches two or three cache lines instead of std::unordered_map's node chain.
class BpeRanks {
 public:
  // Throws std::invalid_argument when `bytes` already has a rank or `rank` is kNone.
  void add(std::string_view bytes, std::uint32_t rank);
  // The rank of `bytes`, or kNone.
  std::uint32_t find(std::string_view bytes) const;
  std::size_t size() const { return entries_.size(); }

  static constexpr std::uint32_t kNone = UINT32_MAX;

 private:
  struct Entry {
    std::uint32_t offset, length, rank;  // key = arena_[offset, offset + length)
  };
  struct Slot {
    std::uint32_t hash = 0;
    std::uint32_t entry = kNone;  // index into entries_; kNone: empty
  };
  static std::uint32_t hash_of(std::string_view bytes);
  // The index of the slot holding `bytes`, or of the empty slot where it would go.
  std::size_t probe(std::string_view bytes, std::uint32_t hash) const;
  void grow();

  std::string arena_;
  std::vector<Entry> entries_;
  std::vector<Slot> slots_;  // size is a power of two, at most half full
};

// Appends the ranks of the BPE parts of `piece` to `out`. Every single byte of `piece` must
// have a rank (true for byte-level vocabularies); otherwise throws std::invalid_argument.
// Memory: about 50 bytes per byte of `piece` (a 100 MB piece took 4.9 GB).
void bpe_merge(std::string_view piece, const BpeRanks& ranks, std::vector<std::uint16_t>& out);

// The longest piece merged whole: longer ones are merged in parts (bpe_merge_bounded), so that
// BPE's memory stays a few MB per thread whatever the text. No natural text has a piece this
// long (64 KiB of letters, digits, punctuation or whitespace in one run), so only such pieces are
// tokenized otherwise than by tiktoken.
constexpr std::size_t kMaxBpePieceBytes = std::size_t{64} << 10;

// bpe_merge of `piece` cut into parts of at most `max_bytes` (≥ 4), each merged alone; a cut
// falls on the start of a UTF-8 character (it backs off over continuation bytes), so no
// character is split between parts.
void bpe_merge_bounded(std::string_view piece, const BpeRanks& ranks, std::vector<std::uint16_t>& out,
                       std::size_t max_bytes = kMaxBpePieceBytes);

}  // namespace pope
