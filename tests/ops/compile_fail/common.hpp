#pragma once
// Shared by the compile-failure snippets: each one is a program that must not
// compile, and says why in the comment at its top (the test checks the
// compiler's message for that reason). ok.cpp, the same program with
// correct types, must compile, so a failure is the misuse and not the setup.
#include <vector>

#include "overlap/overlap.hpp"

inline std::vector<float> a_data(6), b_data(6), c_data(4);
inline std::vector<double> d_data(6);
