#pragma once
// The GPU's current SM clock as nvidia-smi reports it, for the records of
// `stepgraph bench` and `stepgraph profile` (clocks ramp; a timing means
// little without it).

namespace sg::report {

// MHz now; NaN when nvidia-smi is unavailable or prints nothing useful.
double sm_clock_mhz();

}  // namespace sg::report
