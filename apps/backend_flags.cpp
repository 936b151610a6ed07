#include "apps/backend_flags.hpp"

#include <cstdint>
#include <stdexcept>
#include <variant>

#include "runtime/backend_option_table.hpp"

namespace sg::app {

void add_backend_option_flags(CLI::App& cmd, BackendOptions& options, std::set<std::string>& given) {
  for (const BackendOptionRow& row_ref : backend_option_table()) {
    const BackendOptionRow* row = &row_ref;  // the table is static: rows outlive the parser
    const BackendOptionValue now = row->get(options);
    const std::string flag = row->flag();
    if (std::holds_alternative<bool>(now)) {
      cmd.add_flag_function(
             flag + ",!--no-" + flag.substr(2),
             [row, &options, &given](std::int64_t count) {  // a negated flag counts below zero
               row->set(options, BackendOptionValue(count > 0));
               given.insert(row->key);
             },
             row->doc)
          ->default_str(backend_option_text(now));
      continue;
    }
    const auto set_checked = [row, &options, &given](const BackendOptionValue& value) {
      if (std::string problem = row->problem(value); !problem.empty()) {
        // As every numeric flag says it (apps/cli_bounds.hpp): the value given, where the text lacks it.
        if (problem.find("(got ") == std::string::npos) problem += " (got " + backend_option_text(value) + ")";
        throw CLI::ValidationError(row->flag(), problem);
      }
      row->set(options, value);
      given.insert(row->key);
    };
    CLI::Option* option =
        std::holds_alternative<std::int64_t>(now)
            ? cmd.add_option_function<std::int64_t>(
                  flag, [set_checked](std::int64_t v) { set_checked(BackendOptionValue(v)); }, row->doc)
            : cmd.add_option_function<std::string>(
                  flag, [set_checked](const std::string& v) { set_checked(BackendOptionValue(v)); }, row->doc);
    option->default_str(backend_option_text(now));
    if (!row->choices.empty()) option->check(CLI::IsMember(row->choices));
  }
}

void add_core_only_flag(CLI::App& cmd, std::vector<std::string>& overrides) {
  const BackendOptionRow* row = find_backend_option("core_only");
  if (!row) throw std::logic_error("the backend option table has no core_only row");
  cmd.add_flag_function(
      row->flag(), [&overrides](std::int64_t count) { if (count > 0) overrides.push_back("backend.core_only=true"); },
      row->doc + " (as --set backend.core_only=true)");
}

nlohmann::json backend_options_json(const BackendOptions& options) {
  nlohmann::json out = nlohmann::json::object();
  for (const BackendOptionRow& row : backend_option_table())
    std::visit([&](const auto& v) { out[row.key] = v; }, row.get(options));
  return out;
}

void copy_backend_options(const BackendOptions& from, const std::set<std::string>& keys, BackendOptions& into) {
  for (const std::string& key : keys)
    if (const BackendOptionRow* row = find_backend_option(key)) row->set(into, row->get(from));
}

}  // namespace sg::app
