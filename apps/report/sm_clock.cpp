#include "apps/report/sm_clock.hpp"

#include <cmath>
#include <cstdio>

namespace sg::report {

double sm_clock_mhz() {
  std::FILE* p = ::popen("nvidia-smi --query-gpu=clocks.sm --format=csv,noheader,nounits 2>/dev/null", "r");
  if (!p) return NAN;
  double mhz = NAN;
  if (std::fscanf(p, "%lf", &mhz) != 1) mhz = NAN;
  ::pclose(p);
  return mhz;
}

}  // namespace sg::report
