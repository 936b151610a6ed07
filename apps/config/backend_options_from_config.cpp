#include "apps/config/backend_options_from_config.hpp"

#include <string>
#include <variant>

#include "runtime/backend_option_table.hpp"

namespace sg::app {

void read_backend_options(const ConfigReader& reader, const YAML::Node& backend, BackendOptions& options) {
  for (const auto& row : backend_option_table()) {
    BackendOptionValue value = row.get(options);
    std::visit([&](auto& v) { reader.read(backend, "backend", row.key.c_str(), v); }, value);
    if (const std::string problem = row.problem(value); !problem.empty())
      reader.fail(backend[row.key], "backend." + row.key, problem);
    row.set(options, value);
  }
}

}  // namespace sg::app
