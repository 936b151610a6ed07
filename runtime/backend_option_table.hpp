#pragma once
// The one table of the CUDA backend's options (issue 35): one row per knob,
// naming the BackendOptions field it sets, its config key under `backend:`,
// its type, default (BackendOptions{}'s), doc line and validation, and who
// owns it ("core", or the fast path of runtime/cuda/fast_paths/ whose
// record lists the key). The config schema's backend keys, the YAML reader
// and writer, the validation messages, the `bench`/`train`/`inspect` flags
// and the bench JSON's `backend` object are all generated from it, so a new
// knob is its BackendOptions field plus one row here (and the key in its
// record). CUDA-free: apps read it without CUDA headers.
#include <cstdint>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "runtime/backend_options.hpp"

namespace sg {

// A knob's value: a switch, a count, or one of a few names.
using BackendOptionValue = std::variant<bool, std::int64_t, std::string>;

struct BackendOptionRow {
  std::string key;    // under `backend:`, the bench JSON key; its flag is --key-with-dashes (bools: also --no-...)
  std::string owner;  // "core" or the owning fast path's name (FastPath::name)
  std::string doc;
  std::vector<std::string> choices;  // a named option's allowed names (empty for the others)
  BackendOptionValue (*get)(const BackendOptions&) = nullptr;
  void (*set)(BackendOptions&, const BackendOptionValue&) = nullptr;  // after problem() said ""
  std::string (*check)(const BackendOptionValue&) = nullptr;        // extra validation ("" ok); may be null

  BackendOptionValue default_value() const { return get(BackendOptions{}); }
  // "" when `value` has the row's type and passes its validation, else the
  // config error's text ("'x' is not one of auto, grid", "must be >= 1").
  std::string problem(const BackendOptionValue& value) const;
  std::string flag() const;  // "--whole-step-mode"
};

const std::vector<BackendOptionRow>& backend_option_table();
// The row of `key`, or null.
const BackendOptionRow* find_backend_option(std::string_view key);
// The value as a config would spell it: true, 3, auto.
std::string backend_option_text(const BackendOptionValue& value);

}  // namespace sg
