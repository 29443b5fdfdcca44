#pragma once
/// @file
/// Ring attention: softmax attention over a sequence sharded across the
/// ranks of a context (context parallelism), forward and backward.
///
/// Every rank holds the queries, keys and values of its tokens (the causal
/// split: an early and a late chunk of the sequence, attention/causal_split.hpp).
/// K and V travel round the ring, one rank's block per step, while each
/// rank computes its queries against the block it holds, with an online
/// softmax (a running maximum and sum per query row and head), so the
/// scores of the whole sequence are never stored. In the backward pass K and
/// V travel again, and the gradients of each block's keys and values travel
/// with them, one step behind, collecting every rank's share until they are
/// back on the block's rank. The baseline (strategy::bulk) gathers every
/// rank's K and V first (MPI_Allgatherv), computes, and in the backward pass
/// sums the keys' and values' gradients with MPI_Reduce_scatter.
///
/// In the compiled flavour (overlap::compiled) the library holds both
/// passes for every element type (src/layers.cpp) and this header only
/// declares them; header-only, it includes their implementation.

#include "overlap/attention/attention_options.hpp"
#include "overlap/attention/causal_split.hpp"
#include "overlap/core/flavour.hpp"
#include "overlap/runtime/context.hpp"

namespace overlap {

/// Collective over ctx: out.o = softmax(q k^T / sqrt(head_dim), masked) v
/// per head for this rank's queries against the keys of the whole
/// sequence, and out.lse its log-sum-exp. T: float, bfloat16 or double.
/// The sequence is the sum of the ranks' rows, placed by
/// causal_split(seq, ctx.size()); each rank's rows must be that split's.
/// Bad input on any rank (shapes, options that differ across ranks, rows
/// that are not the split's) throws std::invalid_argument on every rank
/// before any transfer; a failure during the transfers is fatal
/// (config().on_fatal).
template <class T>
void ring_attention(context& ctx, const attention_inputs<T>& in, const attention_outputs<T>& out,
                    const attention_options& opt = {});

/// Collective over ctx, after ring_attention with the same inputs and
/// options: the gradients of q, k and v for d_o = d(loss)/d(output)
/// (rows x width), from the forward pass's output and log-sum-exp.
/// Errors as for ring_attention.
template <class T>
void ring_attention_backward(context& ctx, const attention_inputs<T>& in, const attention_saved<T>& fwd,
                             matrix_view<const T> d_o, const attention_grads<T>& grads,
                             const attention_options& opt = {});

#ifdef OVERLAP_COMPILED
/// Declares the compiled library's instantiations for element type T.
#define OVERLAP_RING_ATTENTION(T)                                                                                  \
  extern template void ring_attention<T>(context&, const attention_inputs<T>&, const attention_outputs<T>&,        \
                                         const attention_options&);                                                \
  extern template void ring_attention_backward<T>(context&, const attention_inputs<T>&, const attention_saved<T>&, \
                                                  matrix_view<const T>, const attention_grads<T>&,                 \
                                                  const attention_options&);
OVERLAP_FOR_EACH_ELEMENT(OVERLAP_RING_ATTENTION)
#undef OVERLAP_RING_ATTENTION
#endif

}  // namespace overlap

#ifndef OVERLAP_COMPILED
#include "overlap/attention/ring_attention_backward.hpp"
#include "overlap/attention/ring_attention_forward.hpp"
#endif
