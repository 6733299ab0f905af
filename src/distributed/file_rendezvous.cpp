// The shared-file rendezvous (POPE_RENDEZVOUS=file:PATH): rank 0 publishes a value, the other
// ranks poll for it. See distributed.hpp.
#include <fmt/format.h>

#include <fstream>
#include <sstream>
#include <thread>

#include "checkpoint/atomic_file.hpp"
#include "pope/distributed.hpp"

namespace pope {

namespace {

// The first line of the file, so that a reader can tell a rendezvous file from anything else.
constexpr std::string_view kHeader = "pope-rendezvous v1";

std::string to_hex(const std::string& bytes) {
  std::string hex;
  hex.reserve(bytes.size() * 2);
  for (unsigned char byte : bytes) hex += fmt::format("{:02x}", byte);
  return hex;
}

std::optional<std::string> from_hex(const std::string& hex) {
  if (hex.size() % 2 != 0) return std::nullopt;
  std::string bytes;
  for (std::size_t i = 0; i < hex.size(); i += 2) {
    unsigned value = 0;
    for (char c : hex.substr(i, 2)) {
      value *= 16;
      if (c >= '0' && c <= '9') value += unsigned(c - '0');
      else if (c >= 'a' && c <= 'f') value += unsigned(c - 'a' + 10);
      else return std::nullopt;
    }
    bytes.push_back(char(value));
  }
  return bytes;
}

}  // namespace

FileRendezvous::FileRendezvous(std::filesystem::path path, const World& world, std::chrono::duration<double> timeout)
    : path_(std::move(path)), world_(world), timeout_(timeout) {}

std::string FileRendezvous::share_from_root(const std::string& value) {
  if (world_.is_root()) {
    if (std::filesystem::exists(path_))
      throw LaunchError(fmt::format("rendezvous file {} already exists, probably from an earlier launch; remove it "
                                    "or name a fresh path in POPE_RENDEZVOUS",
                                    path_.string()));
    const std::string contents = fmt::format("{}\n{}\n", kHeader, to_hex(value));
    const std::span<const std::byte> piece(reinterpret_cast<const std::byte*>(contents.data()), contents.size());
    try {
      write_bytes_atomic(path_, std::span<const std::span<const std::byte>>(&piece, 1));
    } catch (const AtomicWriteError& e) {
      throw LaunchError(fmt::format("rank 0 cannot write the rendezvous file: {}", e.what()));
    }
    return value;
  }
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(timeout_);
  // The file appears by an atomic rename, so once it exists it is complete.
  while (!std::filesystem::exists(path_)) {
    if (Clock::now() > deadline)
      throw LaunchError(fmt::format("rank {}: rank 0 did not write the rendezvous file {} within {:.0f} s "
                                    "(POPE_NCCL_TIMEOUT_S); is rank 0 running, and do all ranks see this path?",
                                    world_.rank, path_.string(), timeout_.count()));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::ifstream in(path_);
  std::string header, hex;
  std::getline(in, header);
  std::getline(in, hex);
  const std::optional<std::string> shared = from_hex(hex);
  if (header != kHeader || !shared)
    throw LaunchError(fmt::format("rank {}: {} is not a pope rendezvous file (expected \"{}\" and a hex line)",
                                  world_.rank, path_.string(), kHeader));
  return *shared;
}

void FileRendezvous::complete() {
  if (!world_.is_root()) return;
  std::error_code ignored;  // a file someone else removed is fine: the next launch needs it gone
  std::filesystem::remove(path_, ignored);
}

std::unique_ptr<Rendezvous> rendezvous_from_environment(const World& world, const EnvLookup& env) {
  const std::optional<std::string> spec = env("POPE_RENDEZVOUS");
  if (!spec) return nullptr;
  constexpr std::string_view kFile = "file:";
  if (!spec->starts_with(kFile) || spec->size() == kFile.size())
    throw LaunchError(fmt::format("POPE_RENDEZVOUS=\"{}\": expected file:PATH (a path every rank sees)", *spec));
  return std::make_unique<FileRendezvous>(spec->substr(kFile.size()), world, communication_timeout(env));
}

}  // namespace pope
