#include "apps/config/config_reader.hpp"

#include <algorithm>
#include <set>
#include <sstream>

#include <fmt/ranges.h>

#include "apps/config/config_schema.hpp"

namespace sg::app {

std::string join_path(const std::string& parent, const std::string& key) { return parent.empty() ? key : parent + "." + key; }

void ConfigReader::fail(const YAML::Node& node, const std::string& key, const std::string& problem) const {
  const int line = node.Mark().line;
  std::string where = line >= 0 ? fmt::format("{}:{}", source_, line + 1) : fmt::format("{} (--set)", source_);
  for (const auto& [k, text] : overrides_)
    if (key == k || key.rfind(k + ".", 0) == 0) where = fmt::format("--set '{}' (over {})", text, source_);
  throw ConfigError(fmt::format("{}: {}: {}", where, key, problem));
}

void ConfigReader::check_keys(const YAML::Node& map, const std::string& path) const {
  const ConfigSection* section = find_section(path);
  if (!map.IsMap()) fail(map, path.empty() ? "(top level)" : path, "must be a mapping of keys");
  std::set<std::string> seen;
  for (const auto& kv : map) {
    if (!kv.first.IsScalar())  // "? [a]: 1", "?  layers: ..." (a complex key)
      fail(kv.first, path.empty() ? "(top level)" : path, "keys must be plain names, not a list or mapping");
    const auto key = kv.first.as<std::string>();
    const auto full = join_path(path, key);
    if (!seen.insert(key).second) fail(kv.first, full, "duplicate key (each key may appear once)");
    const bool is_sub = std::find(section->subsections.begin(), section->subsections.end(), key) != section->subsections.end();
    const bool is_key = std::find(section->keys.begin(), section->keys.end(), key) != section->keys.end();
    if (is_sub) check_keys(kv.second, full);
    else if (!is_key) {
      std::vector<std::string> known = section->keys;
      known.insert(known.end(), section->subsections.begin(), section->subsections.end());
      fail(kv.first, full, fmt::format("unknown key (known here: {})", fmt::join(known, ", ")));
    }
  }
}

void ConfigReader::read_pair(const YAML::Node& section, const std::string& path, const char* key, double& first,
                             double& second) const {
  if (!section || !section.IsMap()) return;
  const YAML::Node node = section[key];
  if (!node) return;
  const auto full = join_path(path, key);
  if (!node.IsSequence() || node.size() != 2) fail(node, full, "expected a list of two numbers, e.g. [0.9, 0.999]");
  try {
    first = node[0].as<double>();
    second = node[1].as<double>();
  } catch (const YAML::Exception&) {
    fail(node, full, "expected a list of two numbers, e.g. [0.9, 0.999]");
  }
}

void ConfigReader::read_list(const YAML::Node& section, const std::string& path, const char* key,
                             std::vector<std::int64_t>& out) const {
  if (!section || !section.IsMap()) return;
  const YAML::Node node = section[key];
  if (!node) return;
  const auto full = join_path(path, key);
  if (!node.IsSequence()) fail(node, full, "expected a list of integers, e.g. [784, 128, 10]");
  out.clear();
  for (const auto& item : node) {
    try {
      out.push_back(item.as<std::int64_t>());
    } catch (const YAML::Exception&) {
      fail(item, full, fmt::format("expected an integer, got '{}'", item.IsScalar() ? item.Scalar() : "a collection"));
    }
  }
}

YAML::Node section_of(const YAML::Node& root, const char* name) { return root.IsMap() ? root[name] : YAML::Node(); }

YAML::Node node_at(const YAML::Node& root, const std::string& dotted) {
  YAML::Node node = root;
  std::stringstream ss(dotted);
  for (std::string part; std::getline(ss, part, '.');) {
    if (!node.IsMap() || !node[part]) return root;
    node = node[part];
  }
  return node;
}

}  // namespace sg::app
