// xz (liblzma) and gzip (zlib) decompression as ByteSources. Both libraries are optional
// build dependencies; without one, its format is a clear error rather than garbage text.
#include <array>

#include "data/corpus_reader_sources.hpp"
#include "pope/data.hpp"

#ifdef POPE_HAVE_LZMA
#include <lzma.h>
#endif
#ifdef POPE_HAVE_ZLIB
#include <zlib.h>
#endif

namespace pope {
namespace {

constexpr std::size_t kInputChunk = 1 << 16;

#ifdef POPE_HAVE_LZMA
class XzSource : public ByteSource {
 public:
  XzSource(ByteSource& inner, std::string name) : inner_(inner), name_(std::move(name)) {
    // LZMA_CONCATENATED: `xz` writes (and users cat together) several streams in one file.
    if (lzma_stream_decoder(&stream_, UINT64_MAX, LZMA_CONCATENATED) != LZMA_OK)
      throw DataError(name_ + ": cannot start the xz decoder");
  }
  ~XzSource() override { lzma_end(&stream_); }

  std::size_t read(char* out, std::size_t size) override {
    stream_.next_out = reinterpret_cast<std::uint8_t*>(out);
    stream_.avail_out = size;
    while (!finished_ && stream_.avail_out == size) {
      if (stream_.avail_in == 0 && !input_ended_) {
        stream_.avail_in = inner_.read(reinterpret_cast<char*>(input_.data()), input_.size());
        stream_.next_in = input_.data();
        input_ended_ = stream_.avail_in == 0;
      }
      const lzma_ret rc = lzma_code(&stream_, input_ended_ ? LZMA_FINISH : LZMA_RUN);
      if (rc == LZMA_STREAM_END) {
        finished_ = true;
      } else if (rc != LZMA_OK) {
        throw DataError(name_ + ": corrupt or truncated xz data (liblzma error " + std::to_string(rc) + ")");
      }
    }
    return size - stream_.avail_out;
  }

 private:
  ByteSource& inner_;
  std::string name_;
  lzma_stream stream_ = LZMA_STREAM_INIT;
  std::array<std::uint8_t, kInputChunk> input_{};
  bool input_ended_ = false, finished_ = false;
};
#endif

#ifdef POPE_HAVE_ZLIB
class GzipSource : public ByteSource {
 public:
  GzipSource(ByteSource& inner, std::string name) : inner_(inner), name_(std::move(name)) {
    if (inflateInit2(&stream_, 15 + 16) != Z_OK) throw DataError(name_ + ": cannot start the gzip decoder");
  }
  ~GzipSource() override { inflateEnd(&stream_); }

  std::size_t read(char* out, std::size_t size) override {
    stream_.next_out = reinterpret_cast<Bytef*>(out);
    stream_.avail_out = static_cast<uInt>(std::min<std::size_t>(size, UINT32_MAX));
    const uInt wanted = stream_.avail_out;
    while (!finished_ && stream_.avail_out == wanted) {
      if (stream_.avail_in == 0) {
        stream_.avail_in = static_cast<uInt>(inner_.read(reinterpret_cast<char*>(input_.data()), input_.size()));
        stream_.next_in = input_.data();
        if (stream_.avail_in == 0) {
          if (!between_members_) throw DataError(name_ + ": truncated gzip data");
          finished_ = true;
          break;
        }
      }
      const int rc = inflate(&stream_, Z_NO_FLUSH);
      between_members_ = rc == Z_STREAM_END;
      if (rc == Z_STREAM_END) {
        inflateReset(&stream_);  // `cat a.gz b.gz` is valid gzip: another member may follow
      } else if (rc != Z_OK) {
        throw DataError(name_ + ": corrupt gzip data (" + (stream_.msg ? stream_.msg : "zlib error") + ")");
      }
    }
    return wanted - stream_.avail_out;
  }

 private:
  ByteSource& inner_;
  std::string name_;
  z_stream stream_{};
  std::array<Bytef, kInputChunk> input_{};
  bool between_members_ = false, finished_ = false;
};
#endif

}  // namespace

std::unique_ptr<ByteSource> open_decompressor(Compression compression, [[maybe_unused]] ByteSource& inner,
                                              const std::string& name) {
  switch (compression) {
    case Compression::xz:
#ifdef POPE_HAVE_LZMA
      return std::make_unique<XzSource>(inner, name);
#else
      throw DataError(name + ": xz-compressed, but this build of pope lacks liblzma (install liblzma-dev and "
                             "reconfigure, or decompress with `xz -d` first)");
#endif
    case Compression::gzip:
#ifdef POPE_HAVE_ZLIB
      return std::make_unique<GzipSource>(inner, name);
#else
      throw DataError(name + ": gzip-compressed, but this build of pope lacks zlib (install zlib1g-dev and "
                             "reconfigure, or decompress with `gzip -d` first)");
#endif
    case Compression::none:
      break;
  }
  throw DataError(name + ": not compressed");
}

}  // namespace pope
