// What `make lint` runs clang-tidy on besides src/instantiations.cpp: every
// public header that file does not reach (the layers), with the layer's
// templates instantiated so that their bodies are checked too. Never built
// by default (CMake target overlap_lint_headers).
#include "overlap/attention/ring_attention.hpp"
#include "overlap/layers/block_stack.hpp"
#include "overlap/layers/example_values.hpp"
#include "overlap/layers/moe.hpp"
#include "overlap/layers/transformer.hpp"
#include "overlap/overlap.hpp"

template class overlap::layers::transformer_block<float>;
template class overlap::layers::transformer_block<double>;
template void overlap::ring_attention<float>(context&, const attention_inputs<float>&, const attention_outputs<float>&,
                                             const attention_options&);
template void overlap::ring_attention_backward<overlap::bfloat16>(context&, const attention_inputs<overlap::bfloat16>&,
                                                                  const attention_saved<overlap::bfloat16>&,
                                                                  matrix_view<const overlap::bfloat16>,
                                                                  const attention_grads<overlap::bfloat16>&,
                                                                  const attention_options&);
template class overlap::layers::moe_mlp<float>;
template class overlap::layers::block_stack<float>;
template class overlap::layers::moe_mlp<double>;
