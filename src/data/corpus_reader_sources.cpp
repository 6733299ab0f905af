#include "data/corpus_reader_sources.hpp"

#include <cerrno>
#include <cstring>

#include "data/regular_file.hpp"
#include "pope/data.hpp"

namespace pope {

void ByteSource::drain() {
  char buffer[1 << 16];
  while (read(buffer, sizeof buffer) > 0) {
  }
}

std::string ByteSource::read_all(const std::string& name, std::size_t limit) {
  std::string bytes;
  char buffer[1 << 16];
  for (std::size_t got; (got = read(buffer, sizeof buffer)) > 0;) {
    if (bytes.size() + got > limit)
      throw DataError(name + ": larger than " + std::to_string(limit >> 20) + " MiB, too large for one document");
    bytes.append(buffer, got);
  }
  return bytes;
}

FileSource::FileSource(const std::filesystem::path& path, std::atomic<std::uint64_t>* bytes_read)
    : path_(path), file_(::fdopen(open_regular_file(path, "input file"), "rb")), bytes_read_(bytes_read) {
  if (file_ == nullptr) throw DataError(path.string() + ": cannot open: " + std::strerror(errno));
}

FileSource::~FileSource() { std::fclose(file_); }

std::size_t FileSource::read(char* out, std::size_t size) {
  const std::size_t got = std::fread(out, 1, size, file_);
  if (got == 0 && std::ferror(file_)) throw DataError(path_.string() + ": read failed: " + std::strerror(errno));
  if (bytes_read_ != nullptr) *bytes_read_ += got;
  return got;
}

BoundedSource::BoundedSource(ByteSource& inner, std::uint64_t size, std::string name)
    : inner_(inner), left_(size), name_(std::move(name)) {}

std::size_t BoundedSource::read(char* out, std::size_t size) {
  if (left_ == 0) return 0;
  const std::size_t got = inner_.read(out, static_cast<std::size_t>(std::min<std::uint64_t>(size, left_)));
  if (got == 0) throw DataError(name_ + ": truncated (the archive ends " + std::to_string(left_) + " bytes early)");
  left_ -= got;
  return got;
}

std::string_view PeekableSource::peek(std::size_t size) {
  if (offset_ > 0) {
    buffer_.erase(0, offset_);
    offset_ = 0;
  }
  char chunk[4096];
  while (buffer_.size() < size) {
    const std::size_t got = inner_.read(chunk, std::min(sizeof chunk, size - buffer_.size()));
    if (got == 0) break;
    buffer_.append(chunk, got);
  }
  return std::string_view(buffer_).substr(0, size);
}

std::size_t PeekableSource::read(char* out, std::size_t size) {
  if (offset_ < buffer_.size()) {
    const std::size_t take = std::min(size, buffer_.size() - offset_);
    std::memcpy(out, buffer_.data() + offset_, take);
    offset_ += take;
    return take;
  }
  return inner_.read(out, size);
}

Compression detect_compression(std::string_view head) {
  if (head.substr(0, 6) == std::string_view("\xFD" "7zXZ\0", 6)) return Compression::xz;
  if (head.substr(0, 2) == "\x1F\x8B") return Compression::gzip;
  return Compression::none;
}

}  // namespace pope
