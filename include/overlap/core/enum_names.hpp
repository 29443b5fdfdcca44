#pragma once
/// @file
/// One table of names per enum. Each public enum specialises enum_names next
/// to its definition; to_string, parsing (environment settings, the apps'
/// command lines), the list of allowed values in messages and the check that
/// a value is one of the enum's all read that one table.

#include <array>
#include <cstddef>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace overlap {

/// An enum value and its name.
template <class E>
struct enum_entry {
  E value;           ///< the value
  const char* name;  ///< how the environment, messages and JSON spell it
};

/// Specialised per enum with `static constexpr std::array<enum_entry<E>, N> entries`.
template <class E>
struct enum_names;

namespace detail {
template <class E, class = void>
struct has_enum_names : std::false_type {};
template <class E>
struct has_enum_names<E, std::void_t<decltype(enum_names<E>::entries)>> : std::true_type {};
}  // namespace detail

/// The name of e, or "?" for a value outside the enum.
template <class E, std::enable_if_t<detail::has_enum_names<E>::value, int> = 0>
[[nodiscard]] constexpr const char* to_string(E e) {
  for (const auto& entry : enum_names<E>::entries)
    if (entry.value == e) return entry.name;
  return "?";
}

/// Whether e is one of the enum's named values (a cast from a bad integer is not).
template <class E>
[[nodiscard]] constexpr bool is_valid(E e) {
  for (const auto& entry : enum_names<E>::entries)
    if (entry.value == e) return true;
  return false;
}

/// The value named `text`; false (and `out` untouched) when none is.
template <class E>
[[nodiscard]] bool parse_enum(std::string_view text, E& out) {
  for (const auto& entry : enum_names<E>::entries)
    if (text == entry.name) {
      out = entry.value;
      return true;
    }
  return false;
}

/// The names, in the table's order (a command line's allowed values).
template <class E>
[[nodiscard]] std::vector<std::string> enum_name_list() {
  std::vector<std::string> names;
  for (const auto& entry : enum_names<E>::entries) names.emplace_back(entry.name);
  return names;
}

/// The names joined by `sep`: "bulk|ring|..." for help, "bulk, ring, ..." for messages.
template <class E>
[[nodiscard]] std::string enum_choices(const char* sep = "|") {
  std::string s;
  for (const auto& entry : enum_names<E>::entries) s += (s.empty() ? "" : sep) + std::string(entry.name);
  return s;
}

}  // namespace overlap
