// What `make lint` runs clang-tidy on besides src/instantiations.cpp: every
// public header that file does not reach (the layers), with the layer's
// templates instantiated so that their bodies are checked too. Never built
// by default (CMake target overlap_lint_headers).
#include "overlap/layers/example_values.hpp"
#include "overlap/layers/transformer.hpp"
#include "overlap/overlap.hpp"

template class overlap::layers::transformer_block<float>;
template class overlap::layers::transformer_block<double>;
