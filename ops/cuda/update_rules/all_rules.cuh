#pragma once
// Every update rule's device code, and the list of them for the update
// kernels' explicit instantiations (each kernel file applies its own macro to
// each rule). A new optimizer adds its rule's header and name here (and its
// row to runtime/cuda/lowerings/update_rule_table.hpp); no kernel file changes.
#include "ops/cuda/update_rules/adam_rule.cuh"
#include "ops/cuda/update_rules/rmsprop_rule.cuh"

#define SG_FOR_EACH_UPDATE_RULE(X) X(AdamRule) X(RmspropRule)
