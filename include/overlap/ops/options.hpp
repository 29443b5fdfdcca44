#pragma once
/// @file
/// Options of the ops. Every field must agree across the ranks of a call;
/// a disagreement raises std::invalid_argument on every rank.

#include "overlap/matrix.hpp"

namespace overlap {

/// How an op is carried out.
enum class strategy {
  bulk,       ///< one blocking collective and one GEMM (the baseline)
  ring,       ///< decomposed into ring steps, transfers overlapped with partial products
  automatic,  ///< the library chooses (currently: ring)
};

/// Which operand of all_gather_matmul is sharded, and along which dimension.
enum class gathered {
  lhs_rows,  ///< a: this rank's rows of A (M_r x K), b: K x N_loc, c = AG_rows(A) @ b (M x N_loc)
  lhs_cols,  ///< a: M x K_r, b: K x N_loc (all K rows), c = AG_cols(A) @ b (M x N_loc)
  rhs_rows,  ///< a: M_loc x K (all K cols), b: K_r x N, c = a @ AG_rows(B) (M_loc x N)
  rhs_cols,  ///< a: M_loc x K, b: K x N_r, c = a @ AG_cols(B) (M_loc x N)
};

[[nodiscard]] inline const char* to_string(strategy s) {
  switch (s) {
    case strategy::bulk: return "bulk";
    case strategy::ring: return "ring";
    case strategy::automatic: return "automatic";
  }
  return "?";
}
[[nodiscard]] inline const char* to_string(gathered g) {
  switch (g) {
    case gathered::lhs_rows: return "lhs_rows";
    case gathered::lhs_cols: return "lhs_cols";
    case gathered::rhs_rows: return "rhs_rows";
    case gathered::rhs_cols: return "rhs_cols";
  }
  return "?";
}

/// Options of all_gather_matmul.
struct ag_options {
  overlap::gathered gathered = overlap::gathered::lhs_rows;
  overlap::strategy strategy = overlap::strategy::automatic;
};

}  // namespace overlap
