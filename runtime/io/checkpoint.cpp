#include "runtime/io/checkpoint.hpp"

#include <zlib.h>

#include <cstring>
#include <deque>
#include <optional>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "runtime/io/atomic_file.hpp"

namespace sg::io {
namespace {

constexpr char kMagic[8] = {'S', 'G', 'C', 'K', 'P', 'T', '0', '1'};
constexpr std::uint32_t kVersion = 1;

// Little-endian fields, as the file's pieces in order: runs of small fields
// in buffers of their own, large byte strings (the tensors) as views of the
// caller's bytes, so a checkpoint of many megabytes is never copied into one
// string before it is written (that copy's fresh pages were most of the save).
class Writer {
 public:
  template <typename T>
  void put(T value) {
    put_raw(reinterpret_cast<const char*>(&value), sizeof value);
  }
  // `s` must outlive the writer when it is large (it is not copied).
  void put_bytes(const std::string& s) {
    put<std::uint64_t>(s.size());
    if (s.size() < kCopyBelow) {
      put_raw(s.data(), s.size());
      return;
    }
    pieces_.push_back({{}, s});
  }
  void put_raw(const char* data, std::size_t n) {
    if (pieces_.empty() || !pieces_.back().view.empty()) pieces_.push_back({});
    pieces_.back().own.append(data, n);
  }
  // The pieces so far, and their CRC-32 (zlib's) as the last piece.
  std::vector<std::string_view> with_crc() {
    std::uint32_t crc = 0;
    for (const auto& p : pieces_) {
      const std::string_view bytes = p.bytes();
      crc = static_cast<std::uint32_t>(crc32(crc, reinterpret_cast<const Bytef*>(bytes.data()), static_cast<uInt>(bytes.size())));
    }
    put<std::uint32_t>(crc);
    std::vector<std::string_view> out;
    for (const auto& p : pieces_) out.push_back(p.bytes());
    return out;
  }

 private:
  static constexpr std::size_t kCopyBelow = 4096;
  struct Piece {
    std::string own;        // small fields, copied
    std::string_view view;  // or a large byte string, not copied
    std::string_view bytes() const { return view.empty() ? std::string_view(own) : view; }
  };
  std::deque<Piece> pieces_;  // a deque: the views taken in with_crc() stay valid as it grows
};

class Reader {
 public:
  Reader(const std::filesystem::path& path, std::string_view data) : path_(path), data_(data) {}
  template <typename T>
  T get(const char* what) {
    T value;
    std::memcpy(&value, take(sizeof value, what), sizeof value);
    return value;
  }
  std::string get_bytes(const char* what) {
    const auto n = get<std::uint64_t>(what);
    return std::string(take(n, what), n);
  }
  const char* take(std::size_t n, const char* what) {
    if (n > data_.size() - pos_)
      throw IoError(fmt::format("{}: truncated checkpoint (reading {} at byte {})", path_.string(), what, pos_));
    const char* p = data_.data() + pos_;
    pos_ += n;
    return p;
  }
  bool at_end() const { return pos_ == data_.size(); }

 private:
  std::filesystem::path path_;
  std::string_view data_;
  std::size_t pos_ = 0;
};

std::uint32_t crc_of(std::string_view bytes) {
  return static_cast<std::uint32_t>(
      crc32(0L, reinterpret_cast<const Bytef*>(bytes.data()), static_cast<uInt>(bytes.size())));
}

}  // namespace

const TensorBlob& Checkpoint::tensor(const std::string& name) const {
  for (const auto& t : tensors)
    if (t.name == name) return t;
  throw IoError(fmt::format("checkpoint has no tensor '{}'", name));
}

void save_checkpoint(const std::filesystem::path& path, const Checkpoint& c) {
  Writer w;
  w.put_raw(kMagic, sizeof kMagic);
  w.put(kVersion);
  w.put<std::int64_t>(c.step);
  w.put<std::uint64_t>(c.data_seed);
  w.put_bytes(c.config_yaml);
  w.put<std::uint32_t>(static_cast<std::uint32_t>(c.tensors.size()));
  for (const auto& t : c.tensors) {
    const auto expected = static_cast<std::size_t>(element_count(t.shape)) * dtype_size(t.dtype);
    if (t.bytes.size() != expected)
      throw IoError(fmt::format("{}: tensor '{}' {} {} has {} bytes, expected {}", path.string(), t.name,
                                shape_string(t.shape), dtype_name(t.dtype), t.bytes.size(), expected));
    w.put_bytes(t.name);
    w.put<std::uint8_t>(static_cast<std::uint8_t>(t.dtype));
    w.put<std::uint32_t>(static_cast<std::uint32_t>(t.shape.size()));
    for (auto d : t.shape) w.put<std::int64_t>(d);
    w.put_bytes(t.bytes);
  }
  write_file_atomically(path, w.with_crc());
}

Checkpoint load_checkpoint(const std::filesystem::path& path) {
  const std::string data = read_file(path);
  if (data.size() < sizeof kMagic + 4 || std::memcmp(data.data(), kMagic, sizeof kMagic) != 0)
    throw IoError(fmt::format("{}: not a stepgraph checkpoint (bad magic)", path.string()));
  const std::string_view body(data.data(), data.size() - 4);
  std::uint32_t stored;
  std::memcpy(&stored, data.data() + body.size(), 4);
  if (crc_of(body) != stored)
    throw IoError(fmt::format("{}: checksum mismatch (file corrupted or truncated)", path.string()));

  Reader r(path, body);
  r.take(sizeof kMagic, "magic");
  if (const auto v = r.get<std::uint32_t>("version"); v != kVersion)
    throw IoError(fmt::format("{}: checkpoint version {} (this build reads {})", path.string(), v, kVersion));
  Checkpoint c;
  c.step = r.get<std::int64_t>("step");
  c.data_seed = r.get<std::uint64_t>("data seed");
  c.config_yaml = r.get_bytes("config");
  const auto count = r.get<std::uint32_t>("tensor count");
  for (std::uint32_t i = 0; i < count; ++i) {
    TensorBlob t;
    t.name = r.get_bytes("tensor name");
    const auto code = r.get<std::uint8_t>("dtype");
    const std::optional<DType> dtype = dtype_from_code(code);
    if (!dtype) throw IoError(fmt::format("{}: tensor '{}' has unknown dtype code {}", path.string(), t.name, code));
    t.dtype = *dtype;
    const auto rank = r.get<std::uint32_t>("rank");
    for (std::uint32_t d = 0; d < rank; ++d) t.shape.push_back(r.get<std::int64_t>("shape"));
    t.bytes = r.get_bytes("tensor data");
    if (t.bytes.size() != static_cast<std::size_t>(element_count(t.shape)) * dtype_size(t.dtype))
      throw IoError(fmt::format("{}: tensor '{}' {} has {} bytes", path.string(), t.name, shape_string(t.shape),
                                t.bytes.size()));
    c.tensors.push_back(std::move(t));
  }
  if (!r.at_end()) throw IoError(fmt::format("{}: unexpected bytes after the last tensor", path.string()));
  return c;
}

}  // namespace sg::io
