// Choices: configuration values that are one of a fixed set of names ("cosine", "agc").
// Each is an enum class whose names are listed once, by a function `choices(E)` beside
// the enum (found by argument-dependent lookup), e.g.
//
//   enum class Decay { kCosine, kLinear };
//   constexpr std::array<Choice<Decay>, 2> choices(Decay) {
//     return {{{Decay::kCosine, "cosine"}, {Decay::kLinear, "linear"}}};
//   }
//
// The config loader parses a name into the enum once (parse_choice), everything below
// it switches on the enum, and printing, `config show`, docs/config.md and the test
// that every accepted name is documented all read the same list. A second entry with
// the same value is an accepted alias; name_of() returns the first.
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "gradguard/core/error.h"

namespace gradguard {

template <class E>
struct Choice {
  E value;
  const char* name;
};

template <class T, class = void>
struct is_choice : std::false_type {};
template <class T>
struct is_choice<T, std::void_t<decltype(choices(std::declval<T>()))>> : std::is_enum<T> {};
template <class T>
inline constexpr bool is_choice_v = is_choice<T>::value;

// The canonical name of `value` (the first entry listing it).
template <class E>
const char* name_of(E value) {
  for (const auto& c : choices(E{}))
    if (c.value == value) return c.name;
  return "?";  // an enum value missing from its table: a test catches it
}

// Every accepted name, aliases included, in table order.
template <class E>
std::vector<std::string> choice_names() {
  std::vector<std::string> out;
  for (const auto& c : choices(E{})) out.emplace_back(c.name);
  return out;
}

// "a, b, c": the canonical names, for messages.
template <class E>
std::string choice_list() {
  std::string out;
  for (const auto& c : choices(E{})) {
    if (name_of(c.value) != std::string_view(c.name)) continue;  // aliases are not advertised
    out += (out.empty() ? "" : ", ") + std::string(c.name);
  }
  return out;
}

// The enum value named `text`; throws gradguard::Error (bad input) naming `key`, with
// the valid names, for anything else.
template <class E>
E parse_choice(std::string_view text, const std::string& key) {
  for (const auto& c : choices(E{}))
    if (text == c.name) return c.value;
  throw bad_input(key, "'" + std::string(text) + "' is not valid (valid: " + choice_list<E>() + ")");
}

}  // namespace gradguard
