#include "runtime/data/npz_archive.hpp"

#include <zlib.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace sg::data {
namespace {

constexpr std::uint32_t kEndOfDirectory = 0x06054b50;
constexpr std::uint32_t kZip64EndOfDirectory = 0x06064b50;
constexpr std::uint32_t kZip64Locator = 0x07064b50;
constexpr std::uint32_t kDirectoryEntry = 0x02014b50;
constexpr std::uint32_t kLocalHeader = 0x04034b50;

// Bounds-checked little-endian reads from the archive bytes.
class Reader {
 public:
  Reader(const std::string& bytes, const std::string& path) : b_(bytes), path_(path) {}
  std::uint64_t le(std::uint64_t at, int n) const {
    if (at > b_.size() || b_.size() - at < static_cast<std::uint64_t>(n))
      throw DataFileError(fmt::format("{}: corrupt .npz (zip structure points past the end of the file)", path_));
    std::uint64_t v = 0;
    for (int i = n - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(b_[at + i]);
    return v;
  }
  std::uint32_t u32(std::uint64_t at) const { return static_cast<std::uint32_t>(le(at, 4)); }
  std::uint16_t u16(std::uint64_t at) const { return static_cast<std::uint16_t>(le(at, 2)); }

 private:
  const std::string& b_;
  const std::string& path_;
};

}  // namespace

NpzArchive::NpzArchive(const std::filesystem::path& file) : path_(file.string()) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw DataFileError(fmt::format("{}: cannot open", path_));
  std::stringstream ss;
  ss << in.rdbuf();
  bytes_ = ss.str();
  const Reader r(bytes_, path_);
  auto corrupt = [&](const std::string& what) { return DataFileError(fmt::format("{}: corrupt .npz: {}", path_, what)); };

  // The end-of-central-directory record: the last 22 bytes plus an optional comment (< 64 KiB).
  if (bytes_.size() < 22) throw corrupt("too short to be a zip archive");
  std::uint64_t eocd = std::string::npos;
  const std::uint64_t lowest = bytes_.size() > 22 + 65535 ? bytes_.size() - 22 - 65535 : 0;
  for (std::uint64_t at = bytes_.size() - 22 + 1; at-- > lowest;)
    if (r.u32(at) == kEndOfDirectory) {
      eocd = at;
      break;
    }
  if (eocd == std::string::npos) throw corrupt("no zip end-of-directory record (not a zip archive)");
  std::uint64_t entries = r.u16(eocd + 10);
  std::uint64_t dir_offset = r.u32(eocd + 16);
  if ((entries == 0xffff || dir_offset == 0xffffffff) && eocd >= 20 && r.u32(eocd - 20) == kZip64Locator) {
    const std::uint64_t z64 = r.le(eocd - 20 + 8, 8);
    if (r.u32(z64) != kZip64EndOfDirectory) throw corrupt("bad Zip64 end-of-directory record");
    entries = r.le(z64 + 32, 8);
    dir_offset = r.le(z64 + 48, 8);
  }
  if (entries > bytes_.size() / 46) throw corrupt("the directory claims more members than the file can hold");
  std::uint64_t at = dir_offset;
  for (std::uint64_t i = 0; i < entries; ++i) {
    if (r.u32(at) != kDirectoryEntry) throw corrupt(fmt::format("bad directory entry {}", i));
    Member m;
    const std::uint16_t flags = r.u16(at + 8);
    m.method = r.u16(at + 10);
    m.crc = r.u32(at + 16);
    m.compressed = r.u32(at + 20);
    m.size = r.u32(at + 24);
    const std::uint16_t name_len = r.u16(at + 28), extra_len = r.u16(at + 30), comment_len = r.u16(at + 32);
    m.local_offset = r.u32(at + 42);
    if (at + 46 + name_len > bytes_.size()) throw corrupt("directory entry name past the end of the file");
    std::string name = bytes_.substr(at + 46, name_len);
    if (flags & 1) throw corrupt(fmt::format("member '{}' is encrypted", name));
    // Zip64 extra field (id 1): the 64-bit values, in this order, of those that are 0xffffffff above.
    for (std::uint64_t e = at + 46 + name_len; e + 4 <= at + 46 + name_len + extra_len;) {
      const std::uint16_t id = r.u16(e), len = r.u16(e + 2);
      if (id == 1) {
        std::uint64_t f = e + 4;
        if (m.size == 0xffffffff) m.size = r.le(f, 8), f += 8;
        if (m.compressed == 0xffffffff) m.compressed = r.le(f, 8), f += 8;
        if (m.local_offset == 0xffffffff) m.local_offset = r.le(f, 8);
      }
      e += 4 + len;
    }
    at += 46 + name_len + extra_len + comment_len;
    if (name.size() > 4 && name.compare(name.size() - 4, 4, ".npy") == 0) name.resize(name.size() - 4);
    m.name = std::move(name);
    members_.push_back(std::move(m));
  }
}

std::vector<std::string> NpzArchive::names() const {
  std::vector<std::string> out;
  for (const auto& m : members_) out.push_back(m.name);
  return out;
}

bool NpzArchive::contains(const std::string& name) const {
  return std::any_of(members_.begin(), members_.end(), [&](const Member& m) { return m.name == name; });
}

NpyArray NpzArchive::array(const std::string& name) const {
  const auto it = std::find_if(members_.begin(), members_.end(), [&](const Member& m) { return m.name == name; });
  if (it == members_.end())
    throw DataFileError(fmt::format("{}: no array '{}' (it holds: {})", path_, name, fmt::join(names(), ", ")));
  const Member& m = *it;
  const std::string source = fmt::format("{}:{}", path_, name);
  const Reader r(bytes_, source);
  if (r.u32(m.local_offset) != kLocalHeader)
    throw DataFileError(fmt::format("{}: corrupt .npz member (bad local header)", source));
  const std::uint64_t data = m.local_offset + 30 + r.u16(m.local_offset + 26) + r.u16(m.local_offset + 28);
  if (data > bytes_.size() || bytes_.size() - data < m.compressed)
    throw DataFileError(fmt::format("{}: corrupt .npz member (its data runs past the end of the file)", source));
  constexpr std::uint64_t kMaxMember = std::uint64_t{1} << 46;
  if (m.size > kMaxMember || (m.method == 0 && m.size != m.compressed))
    throw DataFileError(fmt::format("{}: corrupt .npz member (implausible size {})", source, m.size));
  std::string raw;
  if (m.method == 0) {
    raw = bytes_.substr(data, m.compressed);
  } else if (m.method == 8) {
    // Raw deflate (no zlib header): windowBits -15. The output is grown in
    // chunks, so a lying size field cannot force a huge allocation up front.
    z_stream s{};
    if (inflateInit2(&s, -MAX_WBITS) != Z_OK) throw DataFileError(fmt::format("{}: zlib inflateInit2 failed", source));
    s.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(bytes_.data() + data));
    std::uint64_t left_in = m.compressed;
    auto fail = [&](const std::string& what) {
      inflateEnd(&s);
      return DataFileError(fmt::format("{}: corrupt .npz member ({})", source, what));
    };
    for (;;) {
      if (s.avail_in == 0 && left_in > 0) {
        const auto n = std::min<std::uint64_t>(left_in, 1u << 30);
        s.avail_in = static_cast<uInt>(n);
        left_in -= n;
      }
      if (s.avail_out == 0) {
        const std::size_t done = raw.size();
        if (done > m.size) throw fail(fmt::format("it inflates to more than the {} bytes the directory says", m.size));
        raw.resize(std::min<std::uint64_t>(m.size + 1, done + (std::size_t{1} << 24)));
        s.next_out = reinterpret_cast<Bytef*>(raw.data() + done);
        s.avail_out = static_cast<uInt>(raw.size() - done);
      }
      const int rc = inflate(&s, Z_NO_FLUSH);
      if (rc == Z_STREAM_END) break;
      if (rc == Z_BUF_ERROR && s.avail_in == 0 && left_in == 0) throw fail("the deflate stream ends early");
      if (rc != Z_OK && rc != Z_BUF_ERROR) throw fail(fmt::format("inflate: {}", s.msg ? s.msg : "data error"));
    }
    raw.resize(s.total_out);
    inflateEnd(&s);
    if (raw.size() != m.size)
      throw DataFileError(fmt::format("{}: corrupt .npz member ({} bytes inflated, the directory says {})", source,
                                      raw.size(), m.size));
  } else {
    throw DataFileError(
        fmt::format("{}: unsupported zip compression method {} (np.savez / np.savez_compressed write 0 or 8)", source,
                    m.method));
  }
  std::uint64_t crc = crc32(0L, Z_NULL, 0);
  for (std::uint64_t off = 0; off < raw.size();) {
    const auto n = std::min<std::uint64_t>(raw.size() - off, 1u << 30);
    crc = crc32(crc, reinterpret_cast<const Bytef*>(raw.data() + off), static_cast<uInt>(n));
    off += n;
  }
  if (crc != m.crc) throw DataFileError(fmt::format("{}: corrupt .npz member (CRC-32 mismatch)", source));
  return parse_npy(raw, source);
}

}  // namespace sg::data
