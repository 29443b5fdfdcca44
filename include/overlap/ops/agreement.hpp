#pragma once
/// @file
/// overlap: forwarding header. The old path of overlap/ops/call_agreement.hpp
/// (renamed in 0.3.0: one file is named agreement.hpp, overlap/runtime/agreement.hpp,
/// the collective agreement every part uses; this one is an op call's).
/// Include the new path.

#include "overlap/ops/call_agreement.hpp"
