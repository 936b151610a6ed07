#pragma once
// The data.* paths checked before any reader opens them, so that what is
// wrong with a path is one line naming its config key:
// - a path that cannot be looked at (no permission on a folder on the way, a
//   symlink loop, a name too long), which std::filesystem would report as a
//   bare "filesystem error: status: Permission denied [PATH]";
// - a folder where a file belongs, a file where data.dir's folder belongs;
// - a file whose first bytes are not what data.format reads there: the
//   \x93NUMPY magic of a .npy array, the zip magic of an .npz archive, the
//   text of a CSV table (a gzip file is named as such).
// A missing path is left to the readers, whose messages say what belongs there.
#include <string>
#include <string_view>

#include "runtime/data/dataset_files.hpp"

namespace sg::data {

// `format`: dataset_format(files) ("idx", "npy" or "csv"). Throws DataFileError.
void check_data_paths(const DatasetFiles& files, const std::string& format);

// What a file's first bytes say it is (an empty file: empty).
enum class FileKind { empty, npy, zip, gzip, text, other_binary };
FileKind sniff_file_kind(std::string_view head);

}  // namespace sg::data
