#pragma once
// The message of the exception a piece of code throws, for tests that check
// one error line; "(no error)" when it throws none.
#include <exception>
#include <functional>
#include <string>

namespace sg::test {

inline std::string error_of(const std::function<void()>& body) {
  try {
    body();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace sg::test
