#pragma once
// The error every reader of user data files (npy, npz, csv) and the dataset
// loader throw: one line naming the file (and the config key or array where
// one applies) and what is wrong with it.
#include <stdexcept>

namespace sg::data {

struct DataFileError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace sg::data
