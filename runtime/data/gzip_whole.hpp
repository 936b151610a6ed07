#pragma once
// Inflating a whole gzip file in one call. zlib's streaming gzread takes about
// 0.2 s for MNIST's 47 MB training images, most of a short run's data load;
// libdeflate's whole-buffer decompressor does the same in about a third of
// that. Built without libdeflate (STEPGRAPH_HAVE_LIBDEFLATE unset), or for
// anything but one well-formed gzip member, this returns nothing and the
// caller reads the file through zlib's stream, which also gives the precise
// error for a damaged file.
#include <cstdint>
#include <filesystem>
#include <optional>
#include <vector>

namespace sg::data {

// The inflated contents of `file` when it is a single gzip member that
// libdeflate decompresses cleanly; nullopt otherwise (not gzip, damaged,
// several members, unreadable, or no libdeflate in this build).
std::optional<std::vector<std::uint8_t>> inflate_whole_gzip(const std::filesystem::path& file);

// Whether this build has the libdeflate fast path.
bool have_fast_inflate();

}  // namespace sg::data
