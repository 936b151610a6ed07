#pragma once
// Command-line flags for the CUDA backend's options, one per row of the
// backend option table (runtime/backend_option_table.hpp): `--key-name`
// (switches also `--no-key-name`), typed and checked as the config's
// backend: keys are. No flag is listed here.
#include <set>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "runtime/backend_options.hpp"

namespace sg::app {

// A flag per row, writing into `options`; `given` collects the keys set on the command line.
void add_backend_option_flags(CLI::App& cmd, BackendOptions& options, std::set<std::string>& given);
// --core-only for commands that read a config (train, inspect): it adds the
// override backend.core_only=true to `overrides`.
void add_core_only_flag(CLI::App& cmd, std::vector<std::string>& overrides);
// Every row's key and value (bench.json).
nlohmann::json backend_options_json(const BackendOptions& options);
// `into` with the rows in `keys` taken from `from` (flags given over a config's backend: section).
void copy_backend_options(const BackendOptions& from, const std::set<std::string>& keys, BackendOptions& into);

}  // namespace sg::app
