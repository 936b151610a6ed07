// IDX reader on real and broken files; checkpoints; atomic writes.
#include <doctest/doctest.h>

#include <zlib.h>

#include <fstream>
#include <functional>
#include <iterator>
#include <random>

#include "runtime/data/gzip_whole.hpp"
#include "runtime/data/idx_reader.hpp"
#include "runtime/io/atomic_file.hpp"
#include "runtime/io/checkpoint.hpp"
#include "tests/support/temp_files.hpp"
#include "tests/support/test_data.hpp"

using namespace sg;
namespace fs = std::filesystem;

namespace {

using test::fresh_dir;
using test::gunzip;
void write(const fs::path& p, const std::string& bytes) { test::write_file(p, bytes); }

// A raw copy of the t10k split in `dir`, optionally edited.
void copy_t10k(const fs::path& dir, const std::function<void(std::string&, std::string&)>& edit = {}) {
  std::string images = gunzip(sg::test::mnist_dir_or_skip() / "t10k-images-idx3-ubyte.gz");
  std::string labels = gunzip(sg::test::mnist_dir_or_skip() / "t10k-labels-idx1-ubyte.gz");
  if (edit) edit(images, labels);
  write(dir / "t10k-images-idx3-ubyte", images);
  write(dir / "t10k-labels-idx1-ubyte", labels);
}

// A checkpoint tensor of random bytes.
io::TensorBlob random_blob(const std::string& name, DType dtype, const Shape& shape, std::mt19937& rng) {
  io::TensorBlob t{name, dtype, shape, std::string(static_cast<std::size_t>(element_count(shape)) * dtype_size(dtype), '\0')};
  for (auto& ch : t.bytes) ch = static_cast<char>(rng());
  return t;
}

}  // namespace

TEST_CASE("real MNIST loads with the right counts, shapes and classes") {
  const auto train = data::load_split(sg::test::mnist_dir_or_skip(), "train");
  const auto test = data::load_split(sg::test::mnist_dir_or_skip(), "t10k");
  CHECK(train.images.count == 60000);
  CHECK(test.images.count == 10000);
  CHECK(train.images.rows == 28);
  CHECK(train.images.cols == 28);
  CHECK(train.classes == 10);
  std::vector<int> histogram(10, 0);
  for (auto l : test.labels.labels) ++histogram[l];
  for (int c = 0; c < 10; ++c) CHECK(histogram[static_cast<std::size_t>(c)] > 800);  // every digit appears
  const auto limited = data::load_split(sg::test::mnist_dir_or_skip(), "train", 2000);
  CHECK(limited.images.count == 2000);
  CHECK(limited.images.pixels.size() == 2000u * 784u);
  CHECK(std::equal(limited.images.pixels.begin(), limited.images.pixels.end(), train.images.pixels.begin()));
}

TEST_CASE("raw (uncompressed) IDX files read the same as gzipped ones") {
  const auto dir = fresh_dir("raw");
  copy_t10k(dir);
  const auto raw = data::load_split(dir, "t10k");
  const auto gz = data::load_split(sg::test::mnist_dir_or_skip(), "t10k");
  CHECK(raw.images.pixels == gz.images.pixels);
  CHECK(raw.labels.labels == gz.labels.labels);
  fs::remove_all(dir);
}

TEST_CASE("a gzip file inflates whole (libdeflate) to zlib's bytes, anything else is left to zlib's stream") {
  const auto gz = sg::test::mnist_dir_or_skip() / "t10k-labels-idx1-ubyte.gz";
  const auto whole = data::inflate_whole_gzip(gz);
  if (!data::have_fast_inflate()) {
    MESSAGE("this build has no libdeflate (libdeflate-dev): IDX files go through zlib's stream only");
    CHECK(!whole);
    return;
  }
  REQUIRE(whole);
  const std::string expected = gunzip(gz);
  CHECK(std::string(whole->begin(), whole->end()) == expected);

  const auto dir = fresh_dir("gzip_whole");
  std::ifstream in(gz, std::ios::binary);
  const std::string packed((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  write(dir / "plain", expected);
  write(dir / "cut.gz", packed.substr(0, packed.size() / 2));
  write(dir / "two_members.gz", packed + packed);
  CHECK(!data::inflate_whole_gzip(dir / "plain"));
  CHECK(!data::inflate_whole_gzip(dir / "cut.gz"));
  CHECK(!data::inflate_whole_gzip(dir / "two_members.gz"));
  CHECK(!data::inflate_whole_gzip(dir / "missing.gz"));
  fs::remove_all(dir);
}

TEST_CASE("broken IDX files are clear errors naming the file") {
  const auto dir = fresh_dir("broken");
  SUBCASE("truncated images") {
    copy_t10k(dir, [](std::string& images, std::string&) { images.resize(images.size() - 100); });
    CHECK_THROWS_WITH_AS(data::load_split(dir, "t10k"), doctest::Contains("t10k-images-idx3-ubyte: truncated"), data::IdxError);
  }
  SUBCASE("wrong magic") {
    copy_t10k(dir, [](std::string&, std::string& labels) { labels[3] = 0x03; });
    CHECK_THROWS_WITH_AS(data::load_split(dir, "t10k"), doctest::Contains("wrong magic number 0x00000803"), data::IdxError);
  }
  SUBCASE("image and label counts disagree") {
    copy_t10k(dir, [](std::string&, std::string& labels) {
      labels.resize(labels.size() - 1);
      labels[7] = static_cast<char>(0x0F);  // header count 10000 -> 9999 (0x270F)
    });
    CHECK_THROWS_WITH_AS(data::load_split(dir, "t10k"), doctest::Contains("holds 10000 images but"), data::IdxError);
  }
  SUBCASE("trailing garbage") {
    copy_t10k(dir, [](std::string&, std::string& labels) { labels += "xx"; });
    CHECK_THROWS_WITH_AS(data::load_split(dir, "t10k"), doctest::Contains("unexpected data after the last item"), data::IdxError);
  }
  SUBCASE("missing files") {
    CHECK_THROWS_WITH_AS(data::load_split(dir, "t10k"), doctest::Contains("fetch_mnist.sh"), data::IdxError);
  }
  fs::remove_all(dir);
}

TEST_CASE("checkpoints round-trip and reject corruption") {
  const auto dir = fresh_dir("ckpt");
  std::mt19937 rng(std::random_device{}());
  io::Checkpoint c;
  c.step = 1234;
  c.data_seed = 99;
  c.config_yaml = "model:\n  layers: [784, 10]\n";
  for (auto [name, dtype, shape] : std::vector<std::tuple<std::string, DType, Shape>>{
           {"w1", DType::f16, {10, 784}}, {"b1", DType::f32, {10}}, {"step", DType::i32, {1}}}) {
    c.tensors.push_back(random_blob(name, dtype, shape, rng));
  }
  const auto path = dir / "sub" / "model.sgck";
  io::save_checkpoint(path, c);
  CHECK(io::load_checkpoint(path) == c);
  for (const auto& entry : fs::directory_iterator(path.parent_path()))
    CHECK(entry.path().filename().string().find(".tmp.") == std::string::npos);  // no temp file left behind

  std::string bytes = io::read_file(path);
  SUBCASE("one flipped byte") {
    bytes[bytes.size() / 2] ^= 0x40;
    write(path, bytes);
    CHECK_THROWS_WITH_AS(io::load_checkpoint(path), doctest::Contains("checksum mismatch"), io::IoError);
  }
  SUBCASE("truncated") {
    write(path, bytes.substr(0, bytes.size() - 10));
    CHECK_THROWS_AS(io::load_checkpoint(path), io::IoError);
  }
  SUBCASE("not a checkpoint") {
    write(path, "hello, this is not a checkpoint at all");
    CHECK_THROWS_WITH_AS(io::load_checkpoint(path), doctest::Contains("bad magic"), io::IoError);
  }
  fs::remove_all(dir);
}

// The writer hands the file over in pieces (small fields copied, tensors'
// bytes as views); the file must still be the format's bytes in order,
// built here field by field, with zlib's CRC-32 of all of them at the end.
TEST_CASE("a checkpoint file is its fields in order, small and large tensors alike, then their CRC-32") {
  const auto dir = fresh_dir("ckpt-layout");
  std::mt19937 rng(std::random_device{}());
  io::Checkpoint c;
  c.step = 77;
  c.data_seed = 5;
  c.config_yaml = std::string(5000, 'y');  // longer than the writer copies
  for (auto [name, dtype, shape] : std::vector<std::tuple<std::string, DType, Shape>>{
           {"w_big", DType::f32, {3, 1500}}, {"b_small", DType::f16, {7}}, {"w_mid", DType::bf16, {2, 1024}},
           {"empty", DType::f32, {0}}}) {
    c.tensors.push_back(random_blob(name, dtype, shape, rng));
  }
  std::string expected("SGCKPT01", 8);
  const auto put = [&expected](auto value) { expected.append(reinterpret_cast<const char*>(&value), sizeof value); };
  const auto put_bytes = [&](const std::string& b) {
    put(static_cast<std::uint64_t>(b.size()));
    expected += b;
  };
  put(std::uint32_t{1});
  put(std::int64_t{77});
  put(std::uint64_t{5});
  put_bytes(c.config_yaml);
  put(static_cast<std::uint32_t>(c.tensors.size()));
  for (const auto& t : c.tensors) {
    put_bytes(t.name);
    put(static_cast<std::uint8_t>(t.dtype));
    put(static_cast<std::uint32_t>(t.shape.size()));
    for (auto d : t.shape) put(static_cast<std::int64_t>(d));
    put_bytes(t.bytes);
  }
  put(static_cast<std::uint32_t>(
      crc32(0L, reinterpret_cast<const Bytef*>(expected.data()), static_cast<uInt>(expected.size()))));

  const auto path = dir / "layout.sgck";
  io::save_checkpoint(path, c);
  const std::string bytes = io::read_file(path);
  CHECK(bytes.size() == expected.size());
  CHECK(bytes == expected);
  CHECK(io::load_checkpoint(path) == c);
  fs::remove_all(dir);
}

TEST_CASE("atomic writes replace a file whole") {
  const auto dir = fresh_dir("atomic");
  const auto path = dir / "out.txt";
  io::write_file_atomically(path, "first version, longer than the second");
  io::write_file_atomically(path, "second");
  CHECK(io::read_file(path) == "second");
  std::size_t files = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir)) ++files;
  CHECK(files == 1);
  CHECK_THROWS_AS(io::read_file(dir / "missing"), io::IoError);
  fs::remove_all(dir);
}
