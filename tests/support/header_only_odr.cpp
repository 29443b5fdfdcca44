// The header-only flavour's second translation unit (header_only_test):
// every public header again, beside the unity-built suites that instantiate
// the ops, so that a function defined in a header without `inline`
// (OVERLAP_FUNC) is defined twice and fails to link.
#include "overlap/attention/ring_attention.hpp"
#include "overlap/layers/transformer.hpp"
#include "overlap/overlap.hpp"
