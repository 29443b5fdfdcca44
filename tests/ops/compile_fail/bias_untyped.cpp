// An untyped (void) pointer as the epilogue's bias.
// expect: typed_bias|no match for .operator=
#include "common.hpp"

void call() {
  overlap::ag_options opt;
  const void* bias = c_data.data();
  opt.epilogue.bias = bias;
}
