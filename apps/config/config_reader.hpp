#pragma once
// Typed reads out of a config's YAML tree, shared by the reading
// (read_config.cpp) and validation (validate_config.cpp) steps of
// parse_config: every error is a ConfigError naming the file and line, or
// the --set override, and the key.
#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <map>
#include <string>
#include <type_traits>
#include <vector>

#include <fmt/format.h>

#include "apps/config/train_config.hpp"

namespace sg::app {

std::string join_path(const std::string& parent, const std::string& key);

class ConfigReader {
 public:
  // `overrides`: the --set texts by key, which messages about those keys name instead of a line.
  explicit ConfigReader(std::string source, std::map<std::string, std::string> overrides = {})
      : source_(std::move(source)), overrides_(std::move(overrides)) {}

  [[noreturn]] void fail(const YAML::Node& node, const std::string& key, const std::string& problem) const;

  // Rejects keys the schema does not list, recursively.
  void check_keys(const YAML::Node& map, const std::string& path) const;

  template <typename T>
  void read(const YAML::Node& section, const std::string& path, const char* key, T& out) const {
    if (!section || !section.IsMap()) return;
    const YAML::Node node = section[key];
    if (!node || node.IsNull()) return;  // "key:" with no value keeps the default
    const auto full = join_path(path, key);
    if (!node.IsScalar()) fail(node, full, fmt::format("expected {}, got a {}", type_name<T>(), node.IsSequence() ? "list" : "mapping"));
    try {
      out = node.as<T>();
    } catch (const YAML::Exception&) {
      fail(node, full, fmt::format("expected {}, got '{}'", type_name<T>(), node.Scalar()));
    }
  }

  // `key: [a, b]`: exactly two numbers (optim.betas).
  void read_pair(const YAML::Node& section, const std::string& path, const char* key, double& first, double& second) const;
  void read_list(const YAML::Node& section, const std::string& path, const char* key, std::vector<std::int64_t>& out) const;

 private:
  template <typename T>
  static const char* type_name() {
    if constexpr (std::is_same_v<T, bool>) return "true or false";
    else if constexpr (std::is_integral_v<T>) return "an integer";
    else if constexpr (std::is_floating_point_v<T>) return "a number";
    else return "a string";
  }

  std::string source_;
  std::map<std::string, std::string> overrides_;
};

// root[name], or an undefined node when the root is no mapping.
YAML::Node section_of(const YAML::Node& root, const char* name);
// The node of a dotted key, for the line number in a validation error (the root when absent).
YAML::Node node_at(const YAML::Node& root, const std::string& dotted);

}  // namespace sg::app
