#pragma once
/// @file
/// Ring attention's options and the views it reads and writes
/// (attention/ring_attention.hpp).

#include <cstdint>
#include <type_traits>

#include "overlap/core/bfloat16.hpp"
#include "overlap/core/matrix.hpp"
#include "overlap/schedule/strategy.hpp"

namespace overlap {

/// The type ring attention computes in for element type T: double for
/// double, float for float and bfloat16. The log-sum-exp it keeps is of it.
template <class T>
using attention_acc_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

/// How ring attention runs. Every field but `block` must agree across ranks.
struct attention_options {
  /// Heads: Q, K, V and the output have heads * head_dim columns, head h at
  /// columns h * head_dim .. (h + 1) * head_dim. Must be positive and divide
  /// the width.
  int64_t heads = 1;
  /// The causal mask: token i attends to tokens 0..i. Otherwise every token
  /// attends to every token. Either way the tokens are placed by causal_split.
  bool causal = true;
  /// ring (K and V travel while each step computes), bulk (gather K and V
  /// first: the baseline) or automatic: bulk on one rank and on one node
  /// without a calibration, else the cost model's choice between the two,
  /// made on the first call of a shape (which measures the links if the
  /// context has no calibration, as the ops do). The other strategies are
  /// refused.
  overlap::strategy strategy = overlap::strategy::automatic;
  /// Query rows per block of scores (scratch of block x the longest chunk).
  /// Local; must be positive.
  int64_t block = 256;
};

/// This rank's queries, keys and values: rows x width each (rows: the
/// tokens causal_split gives this rank; row-major, ld >= width).
template <class T>
struct attention_inputs {
  matrix_view<const T> q;  ///< the queries
  matrix_view<const T> k;  ///< the keys
  matrix_view<const T> v;  ///< the values
};

/// What the forward pass writes and the backward pass reads: the output
/// (rows x width) and, per head and row, the log-sum-exp of the scaled
/// scores (heads x rows, ld >= rows).
template <class T>
struct attention_outputs {
  matrix_view<T> o;                     ///< the attention output
  matrix_view<attention_acc_t<T>> lse;  ///< heads x rows
};

/// The same, read-only (the backward pass's input).
template <class T>
struct attention_saved {
  matrix_view<const T> o;                     ///< the forward pass's output
  matrix_view<const attention_acc_t<T>> lse;  ///< its log-sum-exp, heads x rows
};

/// The backward pass's results for this rank's tokens: d(loss)/dq, dk, dv
/// (rows x width each, overwritten).
template <class T>
struct attention_grads {
  matrix_view<T> dq;  ///< the queries' gradient
  matrix_view<T> dk;  ///< the keys' gradient
  matrix_view<T> dv;  ///< the values' gradient
};

}  // namespace overlap
