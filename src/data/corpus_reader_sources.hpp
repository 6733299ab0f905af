// Byte streams the corpus reader stacks on each other: a file, a bounded window (a tar member),
// a buffer that can peek ahead (to recognise a format by its first bytes) and decompressors.
// Everything streams, so a multi-gigabyte tar.xz never has to fit in memory.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>

namespace pope {

class ByteSource {
 public:
  virtual ~ByteSource() = default;
  // Reads up to `size` bytes; returns 0 only at the end. Throws DataError.
  virtual std::size_t read(char* out, std::size_t size) = 0;
  // Reads and drops everything that is left.
  void drain();
  // Reads everything that is left, up to `limit` bytes (more is a DataError naming `name`).
  std::string read_all(const std::string& name, std::size_t limit);
};

class FileSource : public ByteSource {
 public:
  FileSource(const std::filesystem::path& path, std::atomic<std::uint64_t>* bytes_read);
  ~FileSource() override;
  std::size_t read(char* out, std::size_t size) override;

 private:
  std::filesystem::path path_;
  std::FILE* file_ = nullptr;
  std::atomic<std::uint64_t>* bytes_read_;
};

// The next `size` bytes of `inner`; reading past them gives end of stream. read() throws
// DataError naming `name` when `inner` ends before the promised size (a truncated archive).
class BoundedSource : public ByteSource {
 public:
  BoundedSource(ByteSource& inner, std::uint64_t size, std::string name);
  std::size_t read(char* out, std::size_t size) override;

 private:
  ByteSource& inner_;
  std::uint64_t left_;
  std::string name_;
};

class PeekableSource : public ByteSource {
 public:
  explicit PeekableSource(ByteSource& inner) : inner_(inner) {}
  // Up to `size` bytes from the current position, without consuming them (fewer at the end).
  std::string_view peek(std::size_t size);
  std::size_t read(char* out, std::size_t size) override;

 private:
  ByteSource& inner_;
  std::string buffer_;
  std::size_t offset_ = 0;  // consumed prefix of buffer_
};

enum class Compression { none, xz, gzip };
Compression detect_compression(std::string_view head);

// A decompressing view of `inner`; `name` is used in error messages. Throws DataError when the
// build lacks the library (liblzma / zlib) or the data is corrupt.
std::unique_ptr<ByteSource> open_decompressor(Compression compression, ByteSource& inner, const std::string& name);

}  // namespace pope
