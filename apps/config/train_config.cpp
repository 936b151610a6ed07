#include "apps/config/train_config.hpp"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "apps/config/config_reader.hpp"
#include "apps/config/config_schema.hpp"
#include "apps/config/plausible_sizes.hpp"
#include "apps/config/read_config.hpp"
#include "apps/config/validate_config.hpp"

// parse_config in three steps: the --set overrides applied to the YAML tree
// (here), its values read (read_config.cpp), the rules between them checked
// (validate_config.cpp). Writing the resolved YAML: config_yaml_writer.cpp.
namespace sg::app {
namespace {

void apply_override(YAML::Node& root, const std::string& source, const std::string& text) {
  const auto eq = text.find('=');
  if (eq == std::string::npos || eq == 0)
    throw ConfigError(fmt::format("{}: --set '{}': expected key.path=value", source, text));
  const std::string key = text.substr(0, eq);
  if (!is_known_key(key)) throw ConfigError(fmt::format("{}: --set '{}': unknown key '{}'", source, text, key));
  YAML::Node value;
  try {
    value = YAML::Load(text.substr(eq + 1));
  } catch (const YAML::Exception& e) {
    throw ConfigError(fmt::format("{}: --set '{}': value is not valid YAML: {}", source, text, e.msg));
  }
  std::vector<std::string> parts;
  std::stringstream ss(key);
  for (std::string p; std::getline(ss, p, '.');) parts.push_back(p);
  // yaml-cpp nodes are handles: walk by reassignment, creating sections as needed.
  std::vector<YAML::Node> chain{root};
  for (std::size_t i = 0; i + 1 < parts.size(); ++i) {
    YAML::Node next = chain.back()[parts[i]];
    if (!next.IsMap()) {
      chain.back()[parts[i]] = YAML::Node(YAML::NodeType::Map);
      next = chain.back()[parts[i]];
    }
    chain.push_back(next);
  }
  chain.back()[parts.back()] = value;
}

// A positive integer scalar, or 0 for anything else.
std::int64_t positive_or_zero(const YAML::Node& node) {
  if (!node || !node.IsScalar()) return 0;
  try {
    return std::max<std::int64_t>(node.as<std::int64_t>(), 0);
  } catch (const YAML::Exception&) {
    return 0;
  }
}

// `--set run.steps=50` over a file that trains by run.epochs (or the reverse) asks for 50 steps
// instead: the file's other key becomes 0 and an info line says so. With both keys given by --set,
// or a value that is no positive integer, validation has the last word.
void override_replaces_run_length(YAML::Node& root, const std::map<std::string, std::string>& by_key,
                                  const std::string& set_key, const std::string& file_key, const std::string& source) {
  const auto set = by_key.find(set_key);
  const YAML::Node& file = root;  // const lookups: a missing key stays missing
  if (set == by_key.end() || by_key.count(file_key) || !file["run"] || !file["run"].IsMap()) return;
  const std::string set_name = set_key.substr(4), file_name = file_key.substr(4);
  const std::int64_t file_value = positive_or_zero(file["run"][file_name]);
  if (positive_or_zero(file["run"][set_name]) == 0 || file_value == 0) return;
  root["run"][file_name] = 0;
  spdlog::info("--set '{}' replaces {}: {} of {}: training by {} instead of {}", set->second, file_key, file_value, source,
               set_name, file_name);
}

}  // namespace

TrainConfig parse_config(const std::string& yaml_text, const std::string& source, const std::vector<std::string>& overrides) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::ParserException& e) {
    throw ConfigError(fmt::format("{}:{}: invalid YAML: {}", source, e.mark.line + 1, e.msg));
  }
  // Without this, an empty file read as all defaults and its first error blamed a key it never had.
  if (!root || root.IsNull())
    throw ConfigError(fmt::format("{}: the config file is empty (it needs at least model: and run: sections)", source));
  if (!root.IsMap())
    throw ConfigError(fmt::format("{}:{}: the top level must be a mapping of sections (model:, data:, optim:, ...), not {}",
                                  source, root.Mark().line + 1, root.IsSequence() ? "a list" : "a single value"));
  std::map<std::string, std::string> by_key;
  for (const auto& o : overrides) {
    apply_override(root, source, o);
    by_key[o.substr(0, o.find('='))] = o;
  }
  override_replaces_run_length(root, by_key, "run.steps", "run.epochs", source);
  override_replaces_run_length(root, by_key, "run.epochs", "run.steps", source);
  ConfigReader reader(source, by_key);
  TrainConfig c;
  c.source = source;
  try {
    reader.check_keys(root, "");
    read_all(reader, root, c);
    check_plausible_sizes(reader, root, c);  // before validate: it expands model.hidden_depth
    validate(reader, root, c);
  } catch (const YAML::Exception& e) {  // anything the checks above did not foresee: still a ConfigError
    throw ConfigError(fmt::format("{}:{}: {}", source, e.mark.line + 1, e.msg));
  }
  return c;
}

TrainConfig load_config(const std::filesystem::path& path, const std::vector<std::string>& overrides) {
  std::error_code ec;
  // An ifstream opens a folder and reads it as empty text.
  if (std::filesystem::is_directory(path, ec))
    throw ConfigError(fmt::format("{}: is a folder, expected a YAML config file", path.string()));
  if (const auto bytes = std::filesystem::file_size(path, ec); !ec && bytes > kMaxConfigFileBytes)
    throw ConfigError(fmt::format("{}: the config file is {:.1f} MB; a config is at most {} MB (model.layers at most {} "
                                  "entries)", path.string(), double(bytes) / 1e6, kMaxConfigFileBytes >> 20,
                                  kMaxModelLayers));
  std::ifstream in(path);
  if (!in) throw ConfigError(fmt::format("{}: cannot open config file: {}", path.string(), std::strerror(errno)));
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_config(ss.str(), path.string(), overrides);
}


}  // namespace sg::app
