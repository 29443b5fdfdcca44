// The compiled flavour's layers (overlap::compiled): ring attention and the
// transformer block for every element type of OVERLAP_FOR_EACH_ELEMENT,
// compiled once here instead of in every program that includes
// layers/transformer.hpp or attention/ring_attention.hpp (those headers declare
// these instantiations extern in the compiled flavour). A translation unit
// of its own, beside src/instantiations.cpp, so that a parallel build
// compiles the two at once.
// The declarations (with their default arguments) before the definitions.
#include "overlap/attention/ring_attention.hpp"
#include "overlap/attention/ring_attention_backward.hpp"
#include "overlap/attention/ring_attention_forward.hpp"
#include "overlap/layers/transformer-inl.hpp"

namespace overlap {

#define OVERLAP_RING_ATTENTION(T)                                                                           \
  template void ring_attention<T>(context&, const attention_inputs<T>&, const attention_outputs<T>&,        \
                                  const attention_options&);                                                \
  template void ring_attention_backward<T>(context&, const attention_inputs<T>&, const attention_saved<T>&, \
                                           matrix_view<const T>, const attention_grads<T>&, const attention_options&);
OVERLAP_FOR_EACH_ELEMENT(OVERLAP_RING_ATTENTION)
#undef OVERLAP_RING_ATTENTION

namespace layers {
#define OVERLAP_TRANSFORMER_BLOCK(T) template class transformer_block<T>;
OVERLAP_FOR_EACH_ELEMENT(OVERLAP_TRANSFORMER_BLOCK)
#undef OVERLAP_TRANSFORMER_BLOCK
}  // namespace layers

}  // namespace overlap
