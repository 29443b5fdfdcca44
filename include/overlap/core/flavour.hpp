#pragma once
/// @file
/// The two flavours of the library, from one source ({fmt}'s scheme).
///
/// Header-only (target `overlap`): every header that declares something
/// implemented in an `-inl.hpp` file includes that file at its end, so any
/// public header compiles and links alone; OVERLAP_FUNC is `inline`.
///
/// Compiled (target `overlap::compiled`, which defines OVERLAP_COMPILED):
/// <overlap/overlap.hpp> declares; the library (src/) includes the `-inl.hpp`
/// files once, defines the OVERLAP_FUNC functions and instantiates every op
/// for OVERLAP_FOR_EACH_ELEMENT. A consumer's translation unit then parses
/// neither oneDNN's nor Eigen's headers, nor the ops' implementation.

#ifdef OVERLAP_COMPILED
/// Marks a function defined in an -inl.hpp file: inline in the header-only
/// flavour, an ordinary definition compiled once into the library otherwise.
#define OVERLAP_FUNC
#else
#define OVERLAP_FUNC inline
#endif

/// The element types of the ops, the one list the compiled library
/// instantiates: X(float) X(double) X(bfloat16).
#define OVERLAP_FOR_EACH_ELEMENT(X) X(float) X(double) X(::overlap::bfloat16)
