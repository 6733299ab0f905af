// Byte-pair merging over a rank table, as tiktoken does it: a piece starts as single bytes
// and, while some adjacent pair's concatenation is in the table, the pair with the lowest
// rank is joined (the leftmost one among equal ranks). The output is the ranks of the final
// parts, which for GPT-2 are the token ids.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace pope {

class BpeRanks {
 public:
  // Throws std::invalid_argument when `bytes` already has a rank.
  void add(std::string bytes, std::uint32_t rank);
  // The rank of `bytes`, or kNone.
  std::uint32_t find(std::string_view bytes) const;
  std::size_t size() const { return ranks_.size(); }

  static constexpr std::uint32_t kNone = UINT32_MAX;

 private:
  struct Hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  std::unordered_map<std::string, std::uint32_t, Hash, std::equal_to<>> ranks_;
};

// Appends the ranks of the BPE parts of `piece` to `out`. Every single byte of `piece` must
// have a rank (true for byte-level vocabularies); otherwise throws std::invalid_argument.
void bpe_merge(std::string_view piece, const BpeRanks& ranks, std::vector<std::uint16_t>& out);

}  // namespace pope
