// A bias of a type no op takes (int).
// expect: typed_bias|no match for .operator=
#include "common.hpp"

void call() {
  static const int values[2] = {1, 2};
  overlap::rs_options opt;
  opt.epilogue.bias = values;
}
