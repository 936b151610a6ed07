#pragma once
// Integer bounds for the subcommands' numeric options whose refusal reads as
// one plain line: CLI11 prints "--steps: must be >= 1 (got 0)", where its
// own CLI::PositiveNumber / NonNegativeNumber say "Value 0 not in range
// 0.000000 to 179769313486231570814527423731704356798070567525844996..."
// (they are ranges over doubles).
#include <charconv>
#include <cstdint>
#include <limits>
#include <string>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

namespace sg::app {

// Accepts integers in [min, max]; the message names the bound that was crossed.
inline CLI::Validator integer_in(std::int64_t min, std::int64_t max = std::numeric_limits<std::int64_t>::max()) {
  // --help's text after the type, as CLI11's own validators name theirs: "INT:POSITIVE=50", "INT:[1 - 16]=3".
  const bool unbounded = max == std::numeric_limits<std::int64_t>::max();
  const std::string description = unbounded && min == 1   ? "POSITIVE"
                                  : unbounded && min == 0 ? "NONNEGATIVE"
                                  : unbounded             ? fmt::format("[{} - ]", min)
                                                          : fmt::format("[{} - {}]", min, max);
  return CLI::Validator(
      [min, max](std::string& text) -> std::string {
        std::int64_t value = 0;
        const char* end = text.data() + text.size();
        const auto [stop, error] = std::from_chars(text.data(), end, value);
        if (error != std::errc() || stop != end) return fmt::format("'{}' is not an integer", text);
        if (value < min) return fmt::format("must be >= {} (got {})", min, value);
        if (value > max) return fmt::format("must be <= {} (got {})", max, value);
        return "";
      },
      description);
}

}  // namespace sg::app
