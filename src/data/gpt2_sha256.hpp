// SHA-256 (FIPS 180-4), used to verify the downloaded tokenizer files against their pinned
// digests. Small and dependency-free so the check works in every build.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace pope {

class Sha256 {
 public:
  Sha256();
  void update(std::string_view bytes);
  // The digest as 64 lowercase hex digits; the object must not be updated afterwards.
  std::string hex_digest();

 private:
  void compress(const unsigned char* block);

  std::array<std::uint32_t, 8> state_;
  std::array<unsigned char, 64> pending_{};
  std::size_t pending_size_ = 0;
  std::uint64_t total_bytes_ = 0;
};

std::string sha256_hex(std::string_view bytes);

}  // namespace pope
