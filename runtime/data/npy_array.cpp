#include "runtime/data/npy_array.hpp"

#include <cctype>
#include <cstring>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

namespace sg::data {
namespace {

constexpr std::string_view kMagic = "\x93NUMPY";

[[noreturn]] void fail(const std::string& source, const std::string& what) {
  throw DataFileError(fmt::format("{}: {}", source, what));
}

// The value text after `'key':` in the header dict, or npos.
std::size_t value_of(std::string_view header, std::string_view key) {
  const auto k = header.find(fmt::format("'{}'", key));
  if (k == std::string_view::npos) return k;
  auto p = header.find(':', k);
  if (p == std::string_view::npos) return p;
  ++p;
  while (p < header.size() && std::isspace(static_cast<unsigned char>(header[p]))) ++p;
  return p;
}

std::uint32_t little(const unsigned char* b, int n) {
  std::uint32_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | b[i];
  return v;
}

}  // namespace

std::int64_t NpyArray::element_count() const {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

std::string NpyArray::dtype_name() const {
  switch (kind) {
    case 'u': return fmt::format("uint{}", 8 * item_size);
    case 'i': return fmt::format("int{}", 8 * item_size);
    case 'f': return fmt::format("float{}", 8 * item_size);
    default: return "bool";
  }
}

std::string NpyArray::shape_text() const {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) s += fmt::format("{}{}", i ? ", " : "", shape[i]);
  return s + (shape.size() == 1 ? ",)" : ")");
}

NpyArray parse_npy(std::string_view bytes, const std::string& source) {
  if (bytes.size() < 10 || bytes.substr(0, kMagic.size()) != kMagic)
    fail(source, "not a .npy file (no \\x93NUMPY magic at the start)");
  const auto* u = reinterpret_cast<const unsigned char*>(bytes.data());
  const int major = u[6];
  if (major < 1 || major > 3) fail(source, fmt::format("unsupported .npy format version {}.{}", major, int(u[7])));
  const std::size_t len_bytes = major == 1 ? 2 : 4;
  if (bytes.size() < 8 + len_bytes) fail(source, "truncated .npy header");
  const std::size_t header_len = little(u + 8, static_cast<int>(len_bytes));
  const std::size_t data_start = 8 + len_bytes + header_len;
  if (bytes.size() < data_start)
    fail(source, fmt::format("truncated .npy header: it claims {} bytes, the file holds {}", header_len,
                             bytes.size() - 8 - len_bytes));
  const std::string_view header = bytes.substr(8 + len_bytes, header_len);

  NpyArray a;
  a.source = source;
  // 'descr': '<f4' (a structured dtype is a list and is refused here).
  auto p = value_of(header, "descr");
  if (p == std::string_view::npos || p >= header.size() || (header[p] != '\'' && header[p] != '"'))
    fail(source, "the .npy header has no plain 'descr' (structured arrays are not supported)");
  const auto end = header.find(header[p], p + 1);
  if (end == std::string_view::npos) fail(source, "malformed 'descr' in the .npy header");
  const std::string descr(header.substr(p + 1, end - p - 1));
  if (descr.size() < 3 || (descr[0] != '<' && descr[0] != '|' && descr[0] != '=' && descr[0] != '>'))
    fail(source, fmt::format("unsupported dtype '{}'", descr));
  a.kind = descr[1];
  const std::string size_text = descr.substr(2);
  if (size_text.size() != 1 || !std::isdigit(static_cast<unsigned char>(size_text[0])))
    fail(source, fmt::format("unsupported dtype '{}' (expected uint8/int*/float16/float32/float64)", descr));
  a.item_size = size_text[0] - '0';
  const bool int_ok = (a.kind == 'u' || a.kind == 'i') &&
                      (a.item_size == 1 || a.item_size == 2 || a.item_size == 4 || a.item_size == 8);
  const bool float_ok = a.kind == 'f' && (a.item_size == 2 || a.item_size == 4 || a.item_size == 8);
  const bool bool_ok = a.kind == 'b' && a.item_size == 1;
  if (!int_ok && !float_ok && !bool_ok)
    fail(source, fmt::format("unsupported dtype '{}' (expected uint8/int*/float16/float32/float64)", descr));
  if (descr[0] == '>' && a.item_size > 1)
    fail(source, fmt::format("big-endian dtype '{}' is not supported (use arr.astype(arr.dtype.newbyteorder('<')))",
                             descr));

  p = value_of(header, "fortran_order");
  if (p == std::string_view::npos) fail(source, "the .npy header has no 'fortran_order'");
  if (header.substr(p, 4) == "True")
    fail(source, "Fortran-ordered arrays are not supported (save np.ascontiguousarray(arr) instead)");
  if (header.substr(p, 5) != "False") fail(source, "malformed 'fortran_order' in the .npy header");

  p = value_of(header, "shape");
  if (p == std::string_view::npos || p >= header.size() || header[p] != '(')
    fail(source, "the .npy header has no 'shape' tuple");
  const auto close = header.find(')', p);
  if (close == std::string_view::npos) fail(source, "malformed 'shape' in the .npy header");
  std::string dims(header.substr(p + 1, close - p - 1));
  std::stringstream ss(dims);
  constexpr std::int64_t kMaxBytes = std::int64_t{1} << 46;  // 64 TiB: anything larger is a corrupt header
  std::int64_t count = 1;
  for (std::string item; std::getline(ss, item, ',');) {
    const auto first = item.find_first_not_of(" \t");
    if (first == std::string::npos) continue;  // "(3,)"
    const auto last = item.find_last_not_of(" \tL");
    const std::string digits = item.substr(first, last - first + 1);
    if (digits.empty() || digits.size() > 15 ||
        digits.find_first_not_of("0123456789") != std::string::npos)
      fail(source, fmt::format("malformed dimension '{}' in the .npy shape", item));
    const std::int64_t d = std::stoll(digits);
    if (d != 0 && count > kMaxBytes / d) fail(source, "implausibly large .npy shape");
    count *= d;
    a.shape.push_back(d);
  }
  if (count > kMaxBytes / a.item_size) fail(source, "implausibly large .npy shape");
  const auto payload = static_cast<std::size_t>(count * a.item_size);
  const std::size_t have = bytes.size() - data_start;
  if (have < payload)
    fail(source, fmt::format("truncated: shape {} of {} needs {} bytes of data, the file holds {}", a.shape_text(),
                             a.dtype_name(), payload, have));
  if (have > payload)
    fail(source, fmt::format("{} unexpected bytes after the {} {} elements", have - payload, a.shape_text(),
                             a.dtype_name()));
  a.bytes.assign(bytes.substr(data_start, payload));
  return a;
}

NpyArray read_npy(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) fail(file.string(), "cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) fail(file.string(), "read error");
  return parse_npy(ss.str(), file.string());
}

double npy_element(const NpyArray& a, std::int64_t i) {
  const char* p = a.bytes.data() + i * a.item_size;
  auto get = [p](auto tag) {
    decltype(tag) v;
    std::memcpy(&v, p, sizeof v);
    return static_cast<double>(v);
  };
  switch (a.kind) {
    case 'b':
    case 'u':
      switch (a.item_size) {
        case 1: return get(std::uint8_t{});
        case 2: return get(std::uint16_t{});
        case 4: return get(std::uint32_t{});
        default: return get(std::uint64_t{});
      }
    case 'i':
      switch (a.item_size) {
        case 1: return get(std::int8_t{});
        case 2: return get(std::int16_t{});
        case 4: return get(std::int32_t{});
        default: return get(std::int64_t{});
      }
    default:
      switch (a.item_size) {
        case 2: return get(_Float16{});
        case 4: return get(float{});
        default: return get(double{});
      }
  }
}

std::string npy_bytes_f32(const std::vector<std::int64_t>& shape, const std::vector<float>& values) {
  std::string dims;
  for (std::size_t i = 0; i < shape.size(); ++i) dims += fmt::format("{}{}", i ? ", " : "", shape[i]);
  if (shape.size() == 1) dims += ",";
  std::string header = fmt::format("{{'descr': '<f4', 'fortran_order': False, 'shape': ({}), }}", dims);
  // Version 1.0: the header (with its trailing newline) pads the data start to a multiple of 64.
  const std::size_t unpadded = kMagic.size() + 2 + 2 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header += '\n';
  std::string out(kMagic);
  out += '\x01';
  out += '\x00';
  out += static_cast<char>(header.size() & 0xff);
  out += static_cast<char>((header.size() >> 8) & 0xff);
  out += header;
  out.append(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
  return out;
}

}  // namespace sg::data
