#include "runtime/data/idx_reader.hpp"

#include <zlib.h>

#include <algorithm>
#include <array>
#include <memory>
#include <optional>

#include <fmt/format.h>

#include "runtime/data/gzip_whole.hpp"

namespace sg::data {
namespace {

constexpr std::uint32_t kImageMagic = 0x00000803;  // unsigned byte, 3 dimensions
constexpr std::uint32_t kLabelMagic = 0x00000801;  // unsigned byte, 1 dimension

struct GzCloser {
  void operator()(gzFile f) const { gzclose(f); }
};
using GzHandle = std::unique_ptr<std::remove_pointer_t<gzFile>, GzCloser>;

// gzopen/gzread read gzip files and plain files alike. A gzip file that
// libdeflate inflates whole (gzip_whole.hpp) is read from memory instead;
// anything it declines goes through the stream, errors included.
class IdxFile {
 public:
  explicit IdxFile(const std::filesystem::path& path) : path_(path), inflated_(inflate_whole_gzip(path)) {
    if (inflated_) return;
    file_.reset(gzopen(path.c_str(), "rb"));
    if (!file_) throw IdxError(fmt::format("{}: cannot open", path.string()));
  }

  std::uint32_t read_u32(const char* what) {
    std::array<unsigned char, 4> b{};
    read_exact(b.data(), b.size(), what);
    return (std::uint32_t(b[0]) << 24) | (std::uint32_t(b[1]) << 16) | (std::uint32_t(b[2]) << 8) | b[3];
  }

  void read_exact(void* dst, std::size_t bytes, const char* what) {
    if (inflated_) {
      const std::size_t left = inflated_->size() - position_;
      const std::size_t n = std::min(bytes, left);
      std::copy_n(inflated_->data() + position_, n, static_cast<std::uint8_t*>(dst));
      position_ += n;
      if (n < bytes)
        throw IdxError(fmt::format("{}: truncated {}: expected {} bytes, file ends after {}", path_.string(), what,
                                   bytes, n));
      return;
    }
    std::size_t done = 0;
    while (done < bytes) {
      const auto chunk = static_cast<unsigned>(std::min<std::size_t>(bytes - done, 1u << 30));
      const int got = gzread(file_.get(), static_cast<char*>(dst) + done, chunk);
      if (got < 0) throw IdxError(fmt::format("{}: read error ({})", path_.string(), error_text()));
      if (got == 0)
        throw IdxError(fmt::format("{}: truncated {}: expected {} bytes, file ends after {}", path_.string(), what,
                                   bytes, done));
      done += static_cast<std::size_t>(got);
    }
  }

  // Reads `bytes` into `out`, growing it chunk by chunk, so that a header
  // claiming more data than the file holds ends as "truncated", never as a
  // huge allocation.
  void read_into(std::vector<std::uint8_t>& out, std::size_t bytes, const char* what) {
    if (inflated_ && bytes <= inflated_->size() - position_) {  // in memory: one copy
      out.assign(inflated_->begin() + static_cast<std::ptrdiff_t>(position_),
                 inflated_->begin() + static_cast<std::ptrdiff_t>(position_ + bytes));
      position_ += bytes;
      return;
    }
    constexpr std::size_t kChunk = std::size_t{1} << 24;
    out.clear();
    while (out.size() < bytes) {
      const std::size_t done = out.size();
      const std::size_t n = std::min(kChunk, bytes - done);
      out.resize(done + n);
      try {
        read_exact(out.data() + done, n, what);
      } catch (const IdxError& e) {
        if (std::string(e.what()).find(": truncated ") == std::string::npos) throw;
        throw IdxError(fmt::format("{}: truncated {}: the header promises {} bytes, the file ends before that",
                                   path_.string(), what, bytes));
      }
    }
  }

  // Compressed input may hold anything; a plain file's size bounds what the
  // header may claim.
  void check_size(std::uint64_t header_bytes, std::uint64_t payload, const char* what) {
    if (inflated_ || gzdirect(file_.get()) != 1) return;
    std::error_code ec;
    const auto size = std::filesystem::file_size(path_, ec);
    if (!ec && size < header_bytes + payload)
      throw IdxError(fmt::format("{}: truncated {}: the header promises {} bytes but the file holds {} after the header",
                                 path_.string(), what, payload, size - std::min<std::uint64_t>(size, header_bytes)));
  }

  void expect_end() {
    if (inflated_) {
      if (position_ < inflated_->size())
        throw IdxError(fmt::format("{}: unexpected data after the last item", path_.string()));
      return;
    }
    char extra;
    if (gzread(file_.get(), &extra, 1) > 0)
      throw IdxError(fmt::format("{}: unexpected data after the last item", path_.string()));
  }

  void expect_magic(std::uint32_t wanted, const char* kind) {
    const auto magic = read_u32("header");
    if (magic != wanted)
      throw IdxError(fmt::format("{}: wrong magic number 0x{:08x} for an IDX {} file (expected 0x{:08x})",
                                 path_.string(), magic, kind, wanted));
  }

 private:
  std::string error_text() {
    int code = 0;
    const char* msg = gzerror(file_.get(), &code);
    return msg ? msg : "unknown";
  }

  std::filesystem::path path_;
  std::optional<std::vector<std::uint8_t>> inflated_;  // the whole file, when libdeflate took it
  std::size_t position_ = 0;                          // read position in inflated_
  GzHandle file_;
};

std::filesystem::path find_file(const std::filesystem::path& dir, const std::string& name) {
  for (const auto& candidate : {dir / (name + ".gz"), dir / name}) {
    std::error_code ec;  // a folder without permission or a symlink loop: one line, not a filesystem_error
    const auto type = std::filesystem::status(candidate, ec).type();
    if (type == std::filesystem::file_type::none)
      throw IdxError(fmt::format("{}: cannot read {}: {}", dir.string(), candidate.filename().string(), ec.message()));
    if (type != std::filesystem::file_type::not_found) return candidate;
  }
  throw IdxError(fmt::format("{}: neither {}.gz nor {} exists (get MNIST with scripts/fetch_mnist.sh {})",
                             dir.string(), name, name, dir.string()));
}

}  // namespace

ImageSet read_idx_images(const std::filesystem::path& file) {
  IdxFile f(file);
  f.expect_magic(kImageMagic, "images");
  ImageSet set;
  set.count = f.read_u32("header");
  set.rows = f.read_u32("header");
  set.cols = f.read_u32("header");
  if (set.count == 0 || set.rows == 0 || set.cols == 0)
    throw IdxError(fmt::format("{}: empty image set ({} x {} x {})", file.string(), set.count, set.rows, set.cols));
  // u32 x u32 x u32 may overflow 64 bits: refuse more than 2^62 bytes before multiplying it out.
  const auto per_image = static_cast<std::uint64_t>(set.rows) * static_cast<std::uint64_t>(set.cols);
  if (per_image > (std::uint64_t{1} << 62) / static_cast<std::uint64_t>(set.count))
    throw IdxError(fmt::format("{}: implausible image set header ({} images of {}x{})", file.string(), set.count,
                               set.rows, set.cols));
  const auto bytes = static_cast<std::uint64_t>(set.count * set.rows * set.cols);
  f.check_size(16, bytes, "pixel data");
  f.read_into(set.pixels, static_cast<std::size_t>(bytes), "pixel data");
  f.expect_end();
  return set;
}

LabelSet read_idx_labels(const std::filesystem::path& file) {
  IdxFile f(file);
  f.expect_magic(kLabelMagic, "labels");
  LabelSet set;
  const std::uint32_t count = f.read_u32("header");
  if (count == 0) throw IdxError(fmt::format("{}: empty label set", file.string()));
  f.check_size(8, count, "label data");
  f.read_into(set.labels, count, "label data");
  f.expect_end();
  return set;
}

Split load_split(const std::filesystem::path& dir, const std::string& prefix, std::int64_t limit) {
  const auto image_file = find_file(dir, prefix + "-images-idx3-ubyte");
  const auto label_file = find_file(dir, prefix + "-labels-idx1-ubyte");
  Split split{read_idx_images(image_file), read_idx_labels(label_file), 0};
  const auto labels = static_cast<std::int64_t>(split.labels.labels.size());
  if (labels != split.images.count)
    throw IdxError(fmt::format("{} holds {} images but {} holds {} labels", image_file.string(), split.images.count,
                               label_file.string(), labels));
  if (limit > 0 && limit < split.images.count) {
    split.images.count = limit;
    split.images.pixels.resize(static_cast<std::size_t>(limit * split.images.pixels_per_image()));
    split.labels.labels.resize(static_cast<std::size_t>(limit));
  }
  split.classes = *std::max_element(split.labels.labels.begin(), split.labels.labels.end()) + 1;
  return split;
}

}  // namespace sg::data
