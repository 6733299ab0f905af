#include "data/bpe_merge.hpp"

#include <functional>
#include <queue>
#include <stdexcept>
#include <tuple>

namespace pope {

std::uint32_t BpeRanks::hash_of(std::string_view bytes) {
  // FNV-1a: keys are short (a few bytes), where it is as good as any and cheaper than most.
  std::uint32_t hash = 2166136261u;
  for (char c : bytes) hash = (hash ^ static_cast<unsigned char>(c)) * 16777619u;
  return hash;
}

std::size_t BpeRanks::probe(std::string_view bytes, std::uint32_t hash) const {
  const std::size_t mask = slots_.size() - 1;
  for (std::size_t i = hash & mask;; i = (i + 1) & mask) {
    const Slot& slot = slots_[i];
    if (slot.entry == kNone) return i;
    if (slot.hash != hash) continue;
    const Entry& entry = entries_[slot.entry];
    if (std::string_view(arena_).substr(entry.offset, entry.length) == bytes) return i;
  }
}

void BpeRanks::grow() {
  std::vector<Slot> old = std::move(slots_);
  slots_.assign(old.empty() ? 1024 : old.size() * 2, Slot{});
  const std::size_t mask = slots_.size() - 1;
  for (const Slot& slot : old) {
    if (slot.entry == kNone) continue;
    std::size_t i = slot.hash & mask;
    while (slots_[i].entry != kNone) i = (i + 1) & mask;
    slots_[i] = slot;
  }
}

void BpeRanks::add(std::string_view bytes, std::uint32_t rank) {
  if (rank == kNone) throw std::invalid_argument("BpeRanks: rank value is reserved");
  if (2 * (entries_.size() + 1) > slots_.size()) grow();
  const std::uint32_t hash = hash_of(bytes);
  Slot& slot = slots_[probe(bytes, hash)];
  if (slot.entry != kNone) throw std::invalid_argument("BpeRanks: a byte string was ranked twice");
  slot = Slot{hash, static_cast<std::uint32_t>(entries_.size())};
  entries_.push_back(Entry{static_cast<std::uint32_t>(arena_.size()), static_cast<std::uint32_t>(bytes.size()), rank});
  arena_ += bytes;
}

std::uint32_t BpeRanks::find(std::string_view bytes) const {
  if (slots_.empty()) return kNone;
  const Slot& slot = slots_[probe(bytes, hash_of(bytes))];
  return slot.entry == kNone ? kNone : entries_[slot.entry].rank;
}

// Parts are named by the offset of their first byte; `part_end[s]` is where part s ends (the
// next part's start). A candidate merge is (rank, left start, right end): the priority queue
// pops the lowest rank, and among equal ranks the leftmost pair, which is tiktoken's rule.
// Candidates are not removed when a neighbour merges; a popped one is used only if its two
// parts still exist unchanged, which is the case exactly when the part at `left` is alive and
// its right neighbour ends at `right_end` (parts only grow, by absorbing whole neighbours).
// This is O(n log n) where rescanning all pairs after every merge would be O(n²) on long pieces.
void bpe_merge(std::string_view piece, const BpeRanks& ranks, std::vector<std::uint16_t>& out) {
  const std::size_t n = piece.size();
  if (n == 0) return;
  std::vector<std::size_t> part_end(n), part_start_before(n);
  std::vector<bool> alive(n, true);
  for (std::size_t i = 0; i < n; ++i) {
    part_end[i] = i + 1;
    part_start_before[i] = i == 0 ? 0 : i - 1;
  }

  using Candidate = std::tuple<std::uint32_t, std::size_t, std::size_t>;
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> candidates;
  auto consider = [&](std::size_t left) {
    const std::size_t right = part_end[left];
    if (right >= n) return;
    const std::size_t right_end = part_end[right];
    const std::uint32_t rank = ranks.find(piece.substr(left, right_end - left));
    if (rank != BpeRanks::kNone) candidates.emplace(rank, left, right_end);
  };
  for (std::size_t i = 0; i + 1 < n; ++i) consider(i);

  while (!candidates.empty()) {
    const auto [rank, left, right_end] = candidates.top();
    candidates.pop();
    const std::size_t right = part_end[left];
    if (!alive[left] || right >= n || part_end[right] != right_end) continue;  // stale
    alive[right] = false;
    part_end[left] = right_end;
    if (right_end < n) part_start_before[right_end] = left;
    if (left > 0) consider(part_start_before[left]);
    consider(left);
  }

  for (std::size_t start = 0; start < n; start = part_end[start]) {
    const std::uint32_t rank = ranks.find(piece.substr(start, part_end[start] - start));
    if (rank == BpeRanks::kNone || rank > UINT16_MAX)
      throw std::invalid_argument("bpe_merge: byte " + std::to_string(start) + " of a piece has no 16-bit rank");
    out.push_back(static_cast<std::uint16_t>(rank));
  }
}

void bpe_merge_bounded(std::string_view piece, const BpeRanks& ranks, std::vector<std::uint16_t>& out,
                       std::size_t max_bytes) {
  if (max_bytes < 4) throw std::invalid_argument("bpe_merge_bounded: parts must hold a UTF-8 character (4 bytes)");
  const auto continuation = [&](std::size_t i) { return (static_cast<unsigned char>(piece[i]) & 0xC0) == 0x80; };
  while (piece.size() > max_bytes) {
    std::size_t cut = max_bytes;
    // A UTF-8 character has at most 3 continuation bytes; other bytes (not UTF-8) cut anywhere.
    for (int back = 0; back < 3 && continuation(cut); ++back) --cut;
    bpe_merge(piece.substr(0, cut), ranks, out);
    piece.remove_prefix(cut);
  }
  bpe_merge(piece, ranks, out);
}

}  // namespace pope
