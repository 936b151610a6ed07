#pragma once
// Test helpers that make NumPy files byte by byte (what np.save / np.savez /
// np.savez_compressed write), so the data tests need no Python: .npy bytes of
// any dtype, and .npz zip archives with stored or deflated members.
#include <zlib.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace sg::test {

// .npy version 1.0 bytes: `descr` e.g. "<f4", "|u1", "<i8", "<f2".
inline std::string npy_bytes(const std::string& descr, const std::vector<std::int64_t>& shape, const std::string& data) {
  std::string dims;
  for (std::size_t i = 0; i < shape.size(); ++i) dims += (i ? ", " : "") + std::to_string(shape[i]);
  if (shape.size() == 1) dims += ",";
  std::string header = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': (" + dims + "), }";
  const std::size_t unpadded = 6 + 2 + 2 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header += '\n';
  std::string out = "\x93NUMPY";
  out += '\x01';
  out += '\x00';
  out += static_cast<char>(header.size() & 0xff);
  out += static_cast<char>(header.size() >> 8);
  return out + header + data;
}

template <typename T>
std::string raw_bytes(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

inline std::string npy_f32(const std::vector<std::int64_t>& shape, const std::vector<float>& v) {
  return npy_bytes("<f4", shape, raw_bytes(v));
}
inline std::string npy_i64(const std::vector<std::int64_t>& shape, const std::vector<std::int64_t>& v) {
  return npy_bytes("<i8", shape, raw_bytes(v));
}
inline std::string npy_u8(const std::vector<std::int64_t>& shape, const std::vector<std::uint8_t>& v) {
  return npy_bytes("|u1", shape, raw_bytes(v));
}
inline std::string npy_f16(const std::vector<std::int64_t>& shape, const std::vector<float>& v) {
  // Explicit casts: GCC 13 (the GPU image) does not convert float to
  // _Float16 implicitly, as a narrowing conversion between extended types.
  std::vector<_Float16> h;
  h.reserve(v.size());
  for (float x : v) h.push_back(static_cast<_Float16>(x));
  return npy_bytes("<f2", shape, raw_bytes(h));
}

// A zip archive of `members` ({name, bytes}), each stored (method 0) or
// raw-deflated (method 8), with local headers, a central directory and the
// end record, as Python's zipfile writes them.
inline std::string zip_bytes(const std::vector<std::pair<std::string, std::string>>& members, bool deflated) {
  auto le = [](std::string& s, std::uint64_t v, int n) {
    for (int i = 0; i < n; ++i) s += static_cast<char>((v >> (8 * i)) & 0xff);
  };
  std::string out, directory;
  for (const auto& [name, data] : members) {
    std::string payload = data;
    if (deflated) {
      payload.assign(compressBound(static_cast<uLong>(data.size())) + 64, '\0');
      z_stream s{};
      deflateInit2(&s, Z_DEFAULT_COMPRESSION, Z_DEFLATED, -MAX_WBITS, 8, Z_DEFAULT_STRATEGY);
      s.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
      s.avail_in = static_cast<uInt>(data.size());
      s.next_out = reinterpret_cast<Bytef*>(payload.data());
      s.avail_out = static_cast<uInt>(payload.size());
      deflate(&s, Z_FINISH);
      payload.resize(s.total_out);
      deflateEnd(&s);
    }
    const auto crc = crc32(0L, reinterpret_cast<const Bytef*>(data.data()), static_cast<uInt>(data.size()));
    const auto offset = out.size();
    const int method = deflated ? 8 : 0;
    le(out, 0x04034b50, 4);
    le(out, 20, 2), le(out, 0, 2), le(out, method, 2), le(out, 0, 2), le(out, 0, 2);
    le(out, crc, 4), le(out, payload.size(), 4), le(out, data.size(), 4);
    le(out, name.size(), 2), le(out, 0, 2);
    out += name + payload;
    le(directory, 0x02014b50, 4);
    le(directory, 20, 2), le(directory, 20, 2), le(directory, 0, 2), le(directory, method, 2);
    le(directory, 0, 2), le(directory, 0, 2);
    le(directory, crc, 4), le(directory, payload.size(), 4), le(directory, data.size(), 4);
    le(directory, name.size(), 2), le(directory, 0, 2), le(directory, 0, 2), le(directory, 0, 2), le(directory, 0, 2);
    le(directory, 0, 4), le(directory, offset, 4);
    directory += name;
  }
  const auto dir_offset = out.size();
  out += directory;
  le(out, 0x06054b50, 4);
  le(out, 0, 2), le(out, 0, 2), le(out, members.size(), 2), le(out, members.size(), 2);
  le(out, directory.size(), 4), le(out, dir_offset, 4), le(out, 0, 2);
  return out;
}

}  // namespace sg::test
