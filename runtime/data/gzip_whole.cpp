#include "runtime/data/gzip_whole.hpp"

#include <fstream>
#include <memory>
#include <system_error>

#ifdef STEPGRAPH_HAVE_LIBDEFLATE
#include <libdeflate.h>
#endif

namespace sg::data {

bool have_fast_inflate() {
#ifdef STEPGRAPH_HAVE_LIBDEFLATE
  return true;
#else
  return false;
#endif
}

std::optional<std::vector<std::uint8_t>> inflate_whole_gzip(const std::filesystem::path& file) {
#ifdef STEPGRAPH_HAVE_LIBDEFLATE
  std::error_code ec;
  const auto packed_size = std::filesystem::file_size(file, ec);
  if (ec) return std::nullopt;
  std::ifstream in(file, std::ios::binary);
  std::vector<char> packed(packed_size);
  if (!in || !in.read(packed.data(), static_cast<std::streamsize>(packed.size()))) return std::nullopt;
  // A gzip member: magic 1f 8b, method 8 (deflate), ..., then CRC-32 and
  // ISIZE (the inflated size mod 2^32) as its last 8 bytes.
  if (packed.size() < 18 || static_cast<unsigned char>(packed[0]) != 0x1f ||
      static_cast<unsigned char>(packed[1]) != 0x8b || packed[2] != 8)
    return std::nullopt;
  const auto* tail = reinterpret_cast<const unsigned char*>(packed.data() + packed.size() - 4);
  const std::size_t isize = std::size_t{tail[0]} | std::size_t{tail[1]} << 8 | std::size_t{tail[2]} << 16 |
                            std::size_t{tail[3]} << 24;
  // Deflate cannot expand more than about 1032:1; a larger claim is damage
  // (or a file over 4 GiB, whose ISIZE wrapped): leave it to the stream.
  if (isize > 1032 * packed.size()) return std::nullopt;
  std::unique_ptr<libdeflate_decompressor, decltype(&libdeflate_free_decompressor)> d(
      libdeflate_alloc_decompressor(), &libdeflate_free_decompressor);
  if (!d) return std::nullopt;
  std::vector<std::uint8_t> out(isize);
  std::size_t consumed = 0, produced = 0;
  const auto status =
      libdeflate_gzip_decompress_ex(d.get(), packed.data(), packed.size(), out.data(), out.size(), &consumed, &produced);
  // Trailing bytes (a second member, garbage) go to the stream reader too.
  if (status != LIBDEFLATE_SUCCESS || consumed != packed.size() || produced != isize) return std::nullopt;
  return out;
#else
  (void)file;
  return std::nullopt;
#endif
}

}  // namespace sg::data
