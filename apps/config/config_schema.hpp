#pragma once
// The set of keys a config may hold, per section; used to reject unknown
// keys (in files and in --set overrides) before anything is read.
#include <string>
#include <vector>

namespace sg::app {

struct ConfigSection {
  std::string path;               // "optim.schedule"
  std::vector<std::string> keys;  // scalar or list keys of this section
  std::vector<std::string> subsections;
};

const std::vector<ConfigSection>& config_schema();
const ConfigSection* find_section(const std::string& path);
bool is_known_key(const std::string& dotted_path);  // "optim.schedule.kind"

}  // namespace sg::app
