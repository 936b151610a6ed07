#pragma once
// Everything spdlog logs while a piece of code runs, for tests that check a
// warning or an info line (the default logger is swapped for one writing
// into a string, and restored also when the code throws).
#include <functional>
#include <memory>
#include <sstream>
#include <string>

#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

namespace sg::test {

inline std::string logged(const std::function<void()>& body) {
  std::ostringstream text;
  auto previous = spdlog::default_logger();
  spdlog::set_default_logger(
      std::make_shared<spdlog::logger>("capture", std::make_shared<spdlog::sinks::ostream_sink_mt>(text)));
  try {
    body();
  } catch (...) {
    spdlog::set_default_logger(previous);
    throw;
  }
  spdlog::set_default_logger(previous);
  return text.str();
}

}  // namespace sg::test
