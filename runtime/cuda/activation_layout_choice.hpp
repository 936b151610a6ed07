#pragma once
// Which of a program's two forms the CUDA backend runs: channels-first
// convolution layers, or the channels-last variant the model builder made
// (TrainingProgram::channels_last), by backend.activation_layout.
#include <string>

#include "runtime/backend_options.hpp"
#include "runtime/trainer.hpp"
#include "runtime/training_program.hpp"

namespace sg::cuda {

// Puts the chosen form in program.train / program.eval (and their bindings)
// and drops the other; returns what was chosen and why, for the log:
// "channels-last (...)" or "NCHW (...)". With `auto` (the host rule; with
// backend.autotune the CUDA trainer times both forms instead:
// timed_layout_choice.hpp): channels-last where the variant converts back
// to NCHW only at flattens (or the global pooling), no whole-step kernel
// takes the NCHW step (its pattern is channels-first) and our NCHW kernels
// run no convolution whose input channels are more than one and not a
// multiple of 8 that the channels-last step would give to cuDNN rather than
// to the few-channel kernels (the .cpp says what was measured).
std::string choose_activation_layout(TrainingProgram& program, const BackendOptions& options,
                                     bool device_present = true);

// Why channels-last cannot run in this build (no cuDNN), or "".
std::string cudnn_missing();

// What `auto`'s host rule says without choosing: "" for channels-last, else
// why NCHW (the reason choose_activation_layout gives), the program untouched.
std::string auto_layout_nchw_reason(const TrainingProgram& program, const BackendOptions& options,
                                    bool device_present = true);

// `spec` with its program's form chosen by its backend options; `choice`
// gets the line above (the CUDA trainer's description shows it).
TrainerSpec with_activation_layout(TrainerSpec spec, bool device_present, std::string& choice);

}  // namespace sg::cuda
