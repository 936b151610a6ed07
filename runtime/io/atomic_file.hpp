#pragma once
// Nothing half-written: files are written to "<path>.tmp.<pid>", flushed and
// renamed over the target. Parent folders are created.
#include <filesystem>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace sg::io {

struct IoError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Throws IoError naming the file and the temp file on any failure ("PATH:
// cannot write (writing the temp file PATH.tmp.PID): REASON"), and leaves no
// temp file behind.
void write_file_atomically(const std::filesystem::path& path, std::string_view bytes);
// The same for a file made of `pieces` in order (a checkpoint's header fields
// and its tensors' own bytes), with no copy of them joined in memory.
void write_file_atomically(const std::filesystem::path& path, const std::vector<std::string_view>& pieces);
// Checks up front that write_file_atomically(path) can succeed: the parent
// folder exists or can be created and takes a new file, and `path` is not a
// folder. Creates the parent folder; leaves no other trace. Throws IoError
// naming `what` (e.g. "run.checkpoint") and the path.
void check_writable_file(const std::filesystem::path& path, const std::string& what);
// Same for a folder that files will be written into (created if missing).
void check_writable_dir(const std::filesystem::path& dir, const std::string& what);
std::string read_file(const std::filesystem::path& path);  // throws IoError naming the file

}  // namespace sg::io
