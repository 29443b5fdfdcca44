#pragma once
/// @file
/// Which tokens a rank holds under context parallelism: the causal load
/// balance of ring attention (attention/ring_attention.hpp).

#include <array>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "overlap/core/matrix.hpp"

namespace overlap {

/// A run of consecutive tokens: `rows` tokens from sequence position `begin`.
struct token_range {
  int64_t begin = 0;  ///< the first token's position in the sequence
  int64_t rows = 0;   ///< how many tokens
};

/// The split of a sequence of `seq` tokens over `ranks` ranks for causal
/// attention: 2 * ranks chunks of balanced sizes (shard_layout::balanced),
/// and rank r holds chunk r and chunk 2 * ranks - 1 - r. Under the causal
/// mask a query sees the keys before it, so an early chunk has little work
/// and a late one much; one of each gives every rank about the same work.
/// A rank's local rows are its early chunk's tokens, then its late chunk's.
/// Uneven lengths are allowed: chunks differ by at most one token, and some
/// are empty when seq < 2 * ranks.
class causal_split {
 public:
  /// seq >= 0 tokens over ranks >= 1 ranks; std::invalid_argument otherwise.
  causal_split(int64_t seq, int ranks) : chunks_(checked(seq, ranks)), ranks_(ranks) {}

  [[nodiscard]] int ranks() const noexcept { return ranks_; }             ///< the ranks it splits over
  [[nodiscard]] int64_t seq() const noexcept { return chunks_.total(); }  ///< tokens in all

  /// The index (in sequence order, 0 .. 2 * ranks - 1) of rank r's early
  /// (which = 0) or late (which = 1) chunk.
  [[nodiscard]] int chunk_index(int r, int which) const noexcept { return which == 0 ? r : 2 * ranks_ - 1 - r; }
  /// Rank r's early (which = 0) or late (which = 1) chunk.
  [[nodiscard]] token_range chunk(int r, int which) const {
    const int c = chunk_index(r, which);
    return {chunks_.offset(c), chunks_.size(c)};
  }
  /// Rank r's two chunks, early first.
  [[nodiscard]] std::array<token_range, 2> chunks(int r) const { return {chunk(r, 0), chunk(r, 1)}; }
  /// The tokens rank r holds (both chunks).
  [[nodiscard]] int64_t rows(int r) const { return chunk(r, 0).rows + chunk(r, 1).rows; }
  /// The sequence position of rank r's local row i (0 <= i < rows(r)).
  [[nodiscard]] int64_t position(int r, int64_t i) const {
    const token_range early = chunk(r, 0);
    return i < early.rows ? early.begin + i : chunk(r, 1).begin + (i - early.rows);
  }

 private:
  static shard_layout checked(int64_t seq, int ranks) {
    if (seq < 0 || ranks < 1)
      throw std::invalid_argument("overlap::causal_split: needs seq >= 0 and ranks >= 1; got seq " +
                                  std::to_string(seq) + ", ranks " + std::to_string(ranks));
    return shard_layout::balanced(seq, 2 * ranks);
  }
  shard_layout chunks_;
  int ranks_ = 1;
};

}  // namespace overlap
