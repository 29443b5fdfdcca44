#pragma once
/// @file
/// CLI11, included the one way every program here uses it. SimGrid's smpicxx
/// force-includes a header that defines exit(x) as a macro, which breaks
/// CLI11's App::exit; the macro is lifted around CLI11 and restored after.

#pragma push_macro("exit")
#undef exit
#include <CLI/CLI.hpp>
#pragma pop_macro("exit")
