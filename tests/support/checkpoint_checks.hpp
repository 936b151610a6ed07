#pragma once
// A straight run's checkpoint against a resumed run's: the same global step
// and every tensor (parameters, optimizer state) bit for bit.
#include <doctest/doctest.h>

#include <cstdint>
#include <filesystem>

#include "runtime/io/checkpoint.hpp"

namespace sg::test {

inline void check_same_checkpoints(const std::filesystem::path& straight_path, const std::filesystem::path& resumed_path,
                                   std::int64_t step) {
  const auto straight = io::load_checkpoint(straight_path);
  const auto resumed = io::load_checkpoint(resumed_path);
  CHECK(straight.step == step);
  CHECK(resumed.step == step);
  REQUIRE(straight.tensors.size() == resumed.tensors.size());
  for (std::size_t i = 0; i < straight.tensors.size(); ++i) {
    INFO(straight.tensors[i].name);
    CHECK(straight.tensors[i] == resumed.tensors[i]);
  }
}

}  // namespace sg::test
