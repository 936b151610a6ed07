// Bounded random-mutation fuzzing of the readers that take outside input:
// the IDX reader, the checkpoint reader, the YAML config loader and the own
// data readers (npy, npz, csv). Seeds are
// the committed corpus in tests/fuzz_corpus/; the mutator is seeded, so every
// run tries the same inputs (SG_FUZZ_ITERATIONS=N runs longer, SG_FUZZ_SEED
// another sequence). A reader may only reject an input with its own error
// type; any other exception, a crash or a hang fails the test.
#include <doctest/doctest.h>

#include <zlib.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <typeinfo>

#include "apps/config/train_config.hpp"
#include "runtime/data/csv_table.hpp"
#include "runtime/data/idx_reader.hpp"
#include "runtime/data/npy_array.hpp"
#include "runtime/data/npz_archive.hpp"
#include "runtime/io/atomic_file.hpp"
#include "runtime/io/checkpoint.hpp"
#include "tests/support/temp_files.hpp"
#include "tests/support/test_data.hpp"

using namespace sg;
namespace fs = std::filesystem;

namespace {

std::uint64_t env_or(const char* name, std::uint64_t fallback) {
  const char* v = std::getenv(name);
  return v ? std::strtoull(v, nullptr, 10) : fallback;
}

std::vector<std::string> corpus(const std::string& kind) {
  std::vector<std::string> seeds;
  for (const auto& e : fs::directory_iterator(sg::test::source_dir() / "tests/fuzz_corpus" / kind))
    seeds.push_back(io::read_file(e.path()));
  std::sort(seeds.begin(), seeds.end());  // directory order is not stable
  REQUIRE(!seeds.empty());
  return seeds;
}

std::string gunzip_bytes(const std::string& gz) {
  std::string out(1 << 16, '\0');
  z_stream s{};
  inflateInit2(&s, 16 + MAX_WBITS);
  s.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(gz.data()));
  s.avail_in = static_cast<uInt>(gz.size());
  s.next_out = reinterpret_cast<Bytef*>(out.data());
  s.avail_out = static_cast<uInt>(out.size());
  inflate(&s, Z_FINISH);
  out.resize(s.total_out);
  inflateEnd(&s);
  return out;
}

std::string gzip_bytes(const std::string& raw) {
  std::string out(compressBound(static_cast<uLong>(raw.size())) + 64, '\0');
  z_stream s{};
  deflateInit2(&s, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY);
  s.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(raw.data()));
  s.avail_in = static_cast<uInt>(raw.size());
  s.next_out = reinterpret_cast<Bytef*>(out.data());
  s.avail_out = static_cast<uInt>(out.size());
  deflate(&s, Z_FINISH);
  out.resize(s.total_out);
  deflateEnd(&s);
  return out;
}

class Mutator {
 public:
  explicit Mutator(std::uint64_t seed) : rng_(seed) {}
  std::size_t below(std::size_t n) { return n == 0 ? 0 : std::uniform_int_distribution<std::size_t>(0, n - 1)(rng_); }

  // One to four of: flip a bit, set a byte to an edge value, overwrite 4 or 8
  // bytes with an edge integer, delete/duplicate/insert a range, truncate,
  // splice in a dictionary token.
  std::string mutate(std::string s, const std::vector<std::string>& dictionary) {
    const std::size_t rounds = 1 + below(4);
    for (std::size_t r = 0; r < rounds; ++r) {
      const std::size_t at = below(s.size() + 1);
      switch (below(8)) {
        case 0:
          if (!s.empty()) s[below(s.size())] ^= static_cast<char>(1u << below(8));
          break;
        case 1: {
          static const unsigned char edges[] = {0, 1, 0x7f, 0x80, 0xff, '\n', ':', '-'};
          if (!s.empty()) s[below(s.size())] = static_cast<char>(edges[below(sizeof edges)]);
          break;
        }
        case 2: {
          static const std::uint64_t ints[] = {0, 1, 0x7fffffffu, 0x80000000u, 0xffffffffu, ~0ull, 1ull << 40, 3};
          const std::uint64_t v = ints[below(8)];
          const std::size_t width = below(2) ? 4 : 8;
          if (s.size() >= width) {
            const std::size_t pos = below(s.size() - width + 1);
            for (std::size_t i = 0; i < width; ++i) s[pos + i] = static_cast<char>(v >> (8 * (below(2) ? i : width - 1 - i)));
          }
          break;
        }
        case 3:
          s.erase(at, below(16) + 1);
          break;
        case 4:
          if (!s.empty()) {
            const std::size_t from = below(s.size());
            s.insert(at, s.substr(from, below(32) + 1));
          }
          break;
        case 5:
          s.resize(below(s.size() + 1));
          break;
        case 6:
          s.insert(at, dictionary[below(dictionary.size())]);
          break;
        default:
          s.insert(at, std::string(below(8) + 1, static_cast<char>(below(256))));
      }
    }
    return s;
  }

 private:
  std::mt19937_64 rng_;
};

// Runs `read` on `iterations` mutants; only `Allowed` may escape.
template <typename Allowed, typename Read>
void fuzz(const std::string& kind, const std::vector<std::string>& dictionary, std::uint64_t salt, Read read,
          std::uint64_t iterations) {
  const auto seeds = corpus(kind);
  Mutator m(env_or("SG_FUZZ_SEED", 24) * 1000003 + salt);
  std::size_t accepted = 0, rejected = 0;
  for (const auto& seed : seeds) CHECK_NOTHROW(read(seed));  // the corpus itself is valid
  for (std::uint64_t i = 0; i < iterations; ++i) {
    const std::string input = m.mutate(seeds[m.below(seeds.size())], dictionary);
    try {
      read(input);
      ++accepted;
    } catch (const Allowed&) {
      ++rejected;
    } catch (const std::exception& e) {
      FAIL_CHECK(std::string(kind + " mutant " + std::to_string(i) + " threw " + typeid(e).name() + ": " + e.what() +
                             "\ninput (" + std::to_string(input.size()) + " bytes): " + input.substr(0, 400)));
    }
  }
  MESSAGE(kind << ": " << accepted << " mutants accepted, " << rejected << " rejected");
  CHECK(rejected > 0);
}

// The mutants' files, in one folder removed when the test program ends
// (each run left one behind in the temp dir before).
fs::path scratch(const std::string& name) {
  struct Folder {
    fs::path path = fs::temp_directory_path() / ("stepgraph-fuzz-" + std::to_string(std::random_device{}()));
    Folder() { fs::create_directories(path); }
    ~Folder() {
      std::error_code ignored;
      fs::remove_all(path, ignored);
    }
  };
  static const Folder folder;
  return folder.path / name;
}

void write(const fs::path& p, const std::string& bytes) { test::write_file(p, bytes); }

}  // namespace

TEST_CASE("fuzz: the IDX reader rejects mutants only with IdxError") {
  const auto path = scratch("in.idx");
  fuzz<data::IdxError>("idx", {std::string("\0\0\x08\x03", 4), std::string("\0\0\x08\x01", 4), std::string("\xff\xff\xff\xff", 4)}, 1,
      [&](const std::string& bytes) {
        // Gzip seeds are mutated in their uncompressed form half the time (deeper), as raw bytes otherwise.
        const bool gz = bytes.size() > 2 && bytes[0] == '\x1f' && bytes[1] == '\x8b';
        write(path, bytes);
        std::string magic = gz ? gunzip_bytes(bytes).substr(0, 4) : bytes.substr(0, 4);
        if (magic == std::string("\0\0\x08\x01", 4)) data::read_idx_labels(path);
        else data::read_idx_images(path);
        if (gz) {
          write(path, gzip_bytes(gunzip_bytes(bytes) + bytes.substr(bytes.size() / 2)));
          try {
            data::read_idx_images(path);
          } catch (const data::IdxError&) {
          }
        }
      },
      env_or("SG_FUZZ_ITERATIONS", 3000));
}

TEST_CASE("fuzz: the checkpoint reader rejects mutants only with IoError") {
  const auto path = scratch("in.sgck");
  std::uint64_t n = 0;
  fuzz<io::IoError>("checkpoint", {"SGCKPT01", std::string("\xff\xff\xff\xff\xff\xff\xff\x7f", 8), std::string(8, '\0')}, 2,
      [&](std::string bytes) {
        // Every other mutant gets a fresh checksum, so the parser behind the CRC check is exercised too.
        if (++n % 2 == 0 && bytes.size() >= 4) {
          const auto crc = static_cast<std::uint32_t>(
              crc32(0L, reinterpret_cast<const Bytef*>(bytes.data()), static_cast<uInt>(bytes.size() - 4)));
          std::memcpy(bytes.data() + bytes.size() - 4, &crc, 4);
        }
        write(path, bytes);
        io::load_checkpoint(path);
      },
      env_or("SG_FUZZ_ITERATIONS", 3000));
}

TEST_CASE("fuzz: the YAML config loader rejects mutants only with ConfigError") {
  fuzz<app::ConfigError>("yaml",
      {": ", "- ", "[", "]", "{", "}", "\n  ", ".inf", "-.inf", ".nan", "1e308", "-1", "0x10", "&a ", "*a", "!!binary ",
       "\t", "'", "\"", "? ", "layers: [784, 10]\n", "model:\n", "run:\n  steps: 3\n", "~", "<<: *a\n", "#", "|\n", "%YAML 1.2\n---\n"},
      3, [&](const std::string& text) { app::parse_config(text, "fuzz.yaml", {}); }, env_or("SG_FUZZ_ITERATIONS", 3000));
}

TEST_CASE("fuzz: --set overrides reject mutants only with ConfigError") {
  const std::string base = io::read_file(sg::test::source_dir() / "configs/ci_small.yaml");
  Mutator m(env_or("SG_FUZZ_SEED", 24) * 1000003 + 4);
  const std::vector<std::string> seeds = {"optim.lr=0.1", "model.layers=[784, 10]", "run.steps=5", "backend.kind=cpu",
                                          "data.batch_size=8", "optim.schedule.kind=step"};
  for (std::uint64_t i = 0; i < env_or("SG_FUZZ_ITERATIONS", 3000) / 3; ++i) {
    const auto o = m.mutate(seeds[m.below(seeds.size())], {"=", ".", "[", "{", ".inf", "-", "\n"});
    try {
      app::parse_config(base, "ci_small.yaml", {o});
    } catch (const app::ConfigError&) {
    } catch (const std::exception& e) {
      FAIL_CHECK(std::string("--set '" + o + "' threw " + typeid(e).name() + ": " + e.what()));
    }
  }
}

// Own data (issue 23): corpus files written by NumPy (np.save, np.savez,
// np.savez_compressed, which writes Zip64 extras) and a CSV table.
TEST_CASE("fuzz: the npy, npz and csv readers reject mutants only with DataFileError") {
  fuzz<data::DataFileError>("npy", {"\x93NUMPY", "'descr': '<f4'", "'shape': (", "True", ",)", "<i8", "|u1"}, 5,
      [&](const std::string& bytes) {
        const auto a = data::parse_npy(bytes, "fuzz.npy");
        for (std::int64_t i = 0; i < std::min<std::int64_t>(a.element_count(), 64); ++i) (void)data::npy_element(a, i);
      },
      env_or("SG_FUZZ_ITERATIONS", 3000));
  const auto path = scratch("in.npz");
  fuzz<data::DataFileError>("npz", {std::string("PK\x03\x04", 4), std::string("PK\x01\x02", 4),
                                    std::string("PK\x05\x06", 4), std::string("\xff\xff\xff\xff", 4)}, 6,
      [&](const std::string& bytes) {
        write(path, bytes);
        const data::NpzArchive archive(path);
        for (const auto& name : archive.names()) (void)archive.array(name);
      },
      env_or("SG_FUZZ_ITERATIONS", 3000));
  fuzz<data::DataFileError>("csv", {",", "\n", "\"", "nan", "1e999", "label", " "}, 7,
      [&](const std::string& text) { (void)data::parse_csv(text, "fuzz.csv"); }, env_or("SG_FUZZ_ITERATIONS", 3000));
}
