#pragma once
// NumPy's .npy format (versions 1.0, 2.0 and 3.0): a magic string, a Python
// dict literal header ('descr', 'fortran_order', 'shape') and the raw
// C-ordered elements. Little-endian (or byte-sized) elements only; Fortran
// order is refused (np.ascontiguousarray first). Malformed or truncated input
// is a DataFileError naming `source` (a file, or "file.npz:array").
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/data/data_file_error.hpp"

namespace sg::data {

// Element kinds the readers accept: NumPy's unsigned ('u'), signed ('i'),
// floating ('f') and bool ('b') types of 1, 2, 4 or 8 bytes (float: 2, 4, 8).
struct NpyArray {
  char kind = 'u';          // 'u', 'i', 'f' or 'b'
  int item_size = 1;        // bytes per element
  std::vector<std::int64_t> shape;
  std::string bytes;        // element_count() * item_size bytes, C order, little-endian
  std::string source;       // where it came from, for messages

  std::int64_t element_count() const;
  std::string dtype_name() const;  // NumPy's name: "uint8", "float32", ...
  std::string shape_text() const;  // "(60000, 784)"
};

NpyArray parse_npy(std::string_view bytes, const std::string& source);
NpyArray read_npy(const std::filesystem::path& file);

// Element i as a double (any kind); used by the converters below.
double npy_element(const NpyArray& a, std::int64_t i);

// The .npy bytes of a float32 array of `shape` (C order).
std::string npy_bytes_f32(const std::vector<std::int64_t>& shape, const std::vector<float>& values);

}  // namespace sg::data
