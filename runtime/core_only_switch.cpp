#include "runtime/core_only_switch.hpp"

#include <atomic>

namespace sg {
namespace {

std::atomic<bool> forced{false};

}  // namespace

void force_core_only_for_tests(bool on) { forced = on; }
bool core_only_forced_for_tests() { return forced; }

}  // namespace sg
