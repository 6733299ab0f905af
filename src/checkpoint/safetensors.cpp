// safetensors reading and writing (https://github.com/huggingface/safetensors, "Format"):
//   8 bytes   N, the header length, unsigned little-endian
//   N bytes   JSON {name: {"dtype", "shape", "data_offsets": [begin, end)}, "__metadata__": {str: str}},
//             padded with spaces to a multiple of 8 so that the data section is aligned
//   rest      the tensors' bytes, little-endian, back to back; offsets are relative to it
#include <fmt/format.h>
#include <fmt/std.h>

#include <algorithm>
#include <array>
#include <fstream>
#include <limits>
#include <set>

#include "checkpoint/atomic_file.hpp"
#include "config/bounded_json.hpp"
#include "pope/checkpoint.hpp"

namespace pope {

namespace {

constexpr std::uint64_t kHeaderAlignment = 8;
// The reference implementation's limit; a larger "length" means a corrupt file, and the
// limit stops a corrupt length from allocating gigabytes.
constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;
constexpr const char* kMetadataKey = "__metadata__";

constexpr std::array<std::pair<DType, const char*>, 5> kDTypeNames{{
    {DType::f32, "F32"}, {DType::f64, "F64"}, {DType::bf16, "BF16"}, {DType::i32, "I32"}, {DType::u16, "U16"}}};

const char* safetensors_dtype_name(DType dtype) {
  for (const auto& [d, name] : kDTypeNames)
    if (d == dtype) return name;
  throw std::logic_error("dtype without a safetensors name");
}

// JSON text for messages; `replace` keeps invalid UTF-8 from turning an error message
// into a second, unrelated exception.
std::string describe(const nlohmann::json& value) {
  return value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// Everything a corrupt file can get wrong is reported through this one shape of message.
[[noreturn]] void fail(const std::filesystem::path& path, const std::string& problem) {
  throw CheckpointError(fmt::format("safetensors file {}: {}", path, problem));
}

std::size_t expected_bytes(const Shape& shape, DType dtype) {
  return static_cast<std::size_t>(shape_numel(shape)) * dtype_size(dtype);
}

void check_writable(const std::filesystem::path& path, const std::vector<SafetensorsTensor>& tensors) {
  std::set<std::string> names;
  for (const auto& t : tensors) {
    if (t.name.empty() || t.name == kMetadataKey) fail(path, fmt::format("cannot write a tensor named '{}'", t.name));
    if (!names.insert(t.name).second) fail(path, fmt::format("tensor name '{}' appears twice", t.name));
    if (std::any_of(t.shape.begin(), t.shape.end(), [](std::int64_t d) { return d < 0; }))
      fail(path, fmt::format("tensor '{}' has a negative dimension in shape {}", t.name, shape_string(t.shape)));
    if (t.bytes.size() != expected_bytes(t.shape, t.dtype))
      fail(path, fmt::format("tensor '{}' holds {} bytes, but shape {} of {} needs {}", t.name, t.bytes.size(),
                             shape_string(t.shape), safetensors_dtype_name(t.dtype), expected_bytes(t.shape, t.dtype)));
  }
}

// ---- reading: each helper checks one part of the header -----------------------------

DType parse_dtype(const std::filesystem::path& path, const std::string& name, const nlohmann::json& value) {
  if (value.is_string())
    for (const auto& [d, dtype_string] : kDTypeNames)
      if (value.get<std::string>() == dtype_string) return d;
  fail(path, fmt::format("tensor '{}' has dtype {}, expected one of F32, F64, BF16, I32, U16", name, describe(value)));
}

Shape parse_shape(const std::filesystem::path& path, const std::string& name, const nlohmann::json& value) {
  if (!value.is_array()) fail(path, fmt::format("tensor '{}' has shape {}, expected an array", name, describe(value)));
  Shape shape;
  for (const auto& dim : value) {
    if (!dim.is_number_unsigned() || dim.get<std::uint64_t>() > std::numeric_limits<std::int64_t>::max())
      fail(path, fmt::format("tensor '{}' has shape {}, expected non-negative integers", name, describe(value)));
    shape.push_back(dim.get<std::int64_t>());
  }
  return shape;
}

// Element count × dtype size, or nullopt when it exceeds `limit` (so a corrupt shape can
// neither overflow nor pass as small).
std::optional<std::uint64_t> byte_size_up_to(const Shape& shape, DType dtype, std::uint64_t limit) {
  std::uint64_t bytes = dtype_size(dtype);
  bool empty = false;
  for (auto dim : shape) empty = empty || dim == 0;
  if (empty) return 0;
  for (auto dim : shape) {
    const auto d = static_cast<std::uint64_t>(dim);
    if (bytes > limit / d) return std::nullopt;
    bytes *= d;
  }
  return bytes;
}

struct HeaderEntry {
  SafetensorsTensor tensor;  // bytes not yet read
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
};

HeaderEntry parse_entry(const std::filesystem::path& path, const std::string& name, const nlohmann::json& value,
                        std::uint64_t data_bytes) {
  if (!value.is_object()) fail(path, fmt::format("tensor '{}' is described by {}, expected an object", name, describe(value)));
  for (const char* key : {"dtype", "shape", "data_offsets"})
    if (!value.contains(key)) fail(path, fmt::format("tensor '{}' has no \"{}\"", name, key));
  HeaderEntry entry;
  entry.tensor.name = name;
  entry.tensor.dtype = parse_dtype(path, name, value["dtype"]);
  entry.tensor.shape = parse_shape(path, name, value["shape"]);
  const auto& offsets = value["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() || !offsets[1].is_number_unsigned())
    fail(path, fmt::format("tensor '{}' has data_offsets {}, expected [begin, end]", name, describe(offsets)));
  entry.begin = offsets[0].get<std::uint64_t>();
  entry.end = offsets[1].get<std::uint64_t>();
  if (entry.begin > entry.end || entry.end > data_bytes)
    fail(path, fmt::format("tensor '{}' has data_offsets [{}, {}], outside the {}-byte data section", name, entry.begin,
                           entry.end, data_bytes));
  const auto needed = byte_size_up_to(entry.tensor.shape, entry.tensor.dtype, data_bytes);
  if (!needed || *needed != entry.end - entry.begin)
    fail(path, fmt::format("tensor '{}' has {} bytes in data_offsets, but shape {} of {} needs {}", name,
                           entry.end - entry.begin, shape_string(entry.tensor.shape),
                           safetensors_dtype_name(entry.tensor.dtype),
                           needed ? fmt::to_string(*needed) : std::string("more than the whole file")));
  return entry;
}

std::map<std::string, std::string> parse_metadata(const std::filesystem::path& path, const nlohmann::json& value) {
  if (!value.is_object()) fail(path, fmt::format("\"{}\" is {}, expected an object of strings", kMetadataKey, describe(value)));
  std::map<std::string, std::string> metadata;
  for (const auto& [key, item] : value.items()) {
    if (!item.is_string()) fail(path, fmt::format("metadata '{}' is {}, expected a string", key, describe(item)));
    metadata[key] = item.get<std::string>();
  }
  return metadata;
}

// Tensors must tile the data section exactly: sorted by offset, each starts where the
// previous ended, the last ends at the end of the file. Anything else is overlap or junk.
void check_tiling(const std::filesystem::path& path, const std::vector<HeaderEntry>& entries, std::uint64_t data_bytes) {
  std::uint64_t position = 0;
  for (const auto& entry : entries) {
    if (entry.begin != position)
      fail(path, fmt::format("tensor '{}' starts at data offset {}, expected {} (tensors must be contiguous and must not "
                             "overlap)",
                             entry.tensor.name, entry.begin, position));
    position = entry.end;
  }
  if (position != data_bytes)
    fail(path, fmt::format("tensors cover {} bytes of the {}-byte data section ({} bytes unaccounted for)", position,
                           data_bytes, data_bytes - position));
}

void read_exactly(std::ifstream& in, const std::filesystem::path& path, void* out, std::uint64_t bytes,
                  const std::string& what) {
  in.read(static_cast<char*>(out), static_cast<std::streamsize>(bytes));
  if (static_cast<std::uint64_t>(in.gcount()) != bytes) fail(path, fmt::format("cannot read {}", what));
}

}  // namespace

const SafetensorsTensor& SafetensorsContents::at(const std::string& name) const {
  for (const auto& t : tensors)
    if (t.name == name) return t;
  throw CheckpointError(fmt::format("safetensors contents have no tensor named '{}'", name));
}

void write_safetensors(const std::filesystem::path& path, const std::vector<SafetensorsTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  check_writable(path, tensors);
  // ordered_json keeps the tensors in the caller's order, which is also their data order.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header[kMetadataKey] = metadata;
  std::uint64_t offset = 0;
  for (const auto& t : tensors) {
    header[t.name] = {{"dtype", safetensors_dtype_name(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  std::string header_text;
  try {
    header_text = header.dump();
  } catch (const nlohmann::json::exception& error) {  // names or metadata that are not UTF-8
    fail(path, fmt::format("cannot encode the header: {}", error.what()));
  }
  header_text.append((kHeaderAlignment - header_text.size() % kHeaderAlignment) % kHeaderAlignment, ' ');
  const std::uint64_t header_length = header_text.size();  // stored little-endian: the host order

  std::vector<std::span<const std::byte>> pieces{std::as_bytes(std::span(&header_length, 1)),
                                                 std::as_bytes(std::span(header_text))};
  for (const auto& t : tensors) pieces.push_back(std::as_bytes(std::span(t.bytes)));
  try {
    write_bytes_atomic(path, pieces);
  } catch (const AtomicWriteError& error) {
    throw CheckpointError(error.what());
  }
}

SafetensorsContents read_safetensors(const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) fail(path, "does not exist or is not a regular file");
  const std::uint64_t file_bytes = std::filesystem::file_size(path, ec);
  if (ec) fail(path, "cannot determine its size: " + ec.message());
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, "cannot open it for reading");

  std::uint64_t header_length = 0;
  if (file_bytes < sizeof header_length)
    fail(path, fmt::format("has {} bytes, fewer than the 8-byte header length", file_bytes));
  read_exactly(in, path, &header_length, sizeof header_length, "the header length");
  if (header_length > file_bytes - sizeof header_length || header_length > kMaxHeaderBytes)
    fail(path, fmt::format("header length {} does not fit in the {}-byte file (truncated or not safetensors?)",
                           header_length, file_bytes));
  std::string header_text(header_length, '\0');
  read_exactly(in, path, header_text.data(), header_length, "the JSON header");
  const std::uint64_t data_bytes = file_bytes - sizeof header_length - header_length;

  nlohmann::json header;
  try {
    header = parse_json(header_text);
  } catch (const nlohmann::json::exception& error) {
    fail(path, fmt::format("header is not valid JSON: {}", error.what()));
  }
  if (!header.is_object()) fail(path, "header is not a JSON object");

  SafetensorsContents contents;
  std::vector<HeaderEntry> entries;
  for (const auto& [name, value] : header.items()) {
    if (name == kMetadataKey)
      contents.metadata = parse_metadata(path, value);
    else
      entries.push_back(parse_entry(path, name, value, data_bytes));
  }
  std::sort(entries.begin(), entries.end(), [](const HeaderEntry& a, const HeaderEntry& b) {
    return std::tie(a.begin, a.end) < std::tie(b.begin, b.end);
  });
  check_tiling(path, entries, data_bytes);

  // Tiling guarantees the data is read front to back with no seeks.
  for (auto& entry : entries) {
    entry.tensor.bytes.resize(entry.end - entry.begin);
    read_exactly(in, path, entry.tensor.bytes.data(), entry.tensor.bytes.size(),
                 fmt::format("the data of tensor '{}'", entry.tensor.name));
    contents.tensors.push_back(std::move(entry.tensor));
  }
  return contents;
}

}  // namespace pope
