#pragma once
// NumPy's .npz: a zip archive of .npy members (np.savez stores them,
// np.savez_compressed deflates them). The central directory is parsed here
// (Zip64 extras included, as numpy writes them) only as far as locating the
// members; the members are inflated with zlib and checked against their
// CRC-32. Why not minizip: Debian's libminizip-dev is not installed on the
// build or GPU images, and locating stored/deflated members is ~100 lines.
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "runtime/data/npy_array.hpp"

namespace sg::data {

class NpzArchive {
 public:
  // Reads the whole file and its directory; throws DataFileError naming it.
  explicit NpzArchive(const std::filesystem::path& file);

  // Array names: member names without ".npy", in archive order.
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const;
  // Throws DataFileError "file.npz: no array 'x' (it holds: a, b)" or on a
  // corrupt member.
  NpyArray array(const std::string& name) const;

 private:
  struct Member {
    std::string name;  // without ".npy"
    std::uint16_t method = 0;
    std::uint32_t crc = 0;
    std::uint64_t compressed = 0, size = 0, local_offset = 0;
  };
  std::string path_;
  std::string bytes_;
  std::vector<Member> members_;
};

}  // namespace sg::data
