// JSON read from disk, bounded. Every JSON document gradguard reads (an HF config.json,
// trainer_state.json, manifest.json, a snapshot's state.json, a safetensors header, a
// metrics.jsonl line) can come from a hostile or broken file, so it is parsed with a
// nesting limit and a size limit, and an error quotes a bounded excerpt of the text
// (never a re-serialisation of the value, which recurses as deep as the value does).
// A document nested deeper than any gradguard writes is bad input, not a stack to
// overflow.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace gradguard {

struct JsonLimits {
  size_t max_bytes = size_t{64} << 20;  // largest document (bytes)
  int max_depth = 64;                   // deepest nesting of arrays and objects
};

// `text` parsed; throws gradguard::Error (bad input) naming `where`, with what is wrong
// and a bounded excerpt, for invalid JSON, a document over the limits, or (with
// `require_object`) a value that is not an object.
nlohmann::json parse_json(std::string_view text, const std::string& where, const JsonLimits& limits = {},
                          bool require_object = true);
nlohmann::ordered_json parse_ordered_json(std::string_view text, const std::string& where,
                                          const JsonLimits& limits = {}, bool require_object = true);

// The same without exceptions, for lines that may be skipped (metrics.jsonl): nullopt
// for anything parse_json would refuse.
std::optional<nlohmann::json> try_parse_json(std::string_view text, const JsonLimits& limits = {});
std::optional<nlohmann::ordered_json> try_parse_ordered_json(std::string_view text, const JsonLimits& limits = {});

// A regular file read (fs::read_file with the limit) and parsed as an object.
nlohmann::json read_json_file(const std::string& path, const JsonLimits& limits = {});

// At most `max_chars` of `text` on one line, "..." marking a cut: for messages.
std::string excerpt(std::string_view text, size_t max_chars = 80);

// nlohmann's exception text in our words, for a message: without its
// "[json.exception.parse_error.101]" tag and its "parse error at ... syntax error while
// parsing value -" filler: "line 1, column 9: invalid literal; last read: 'tru'", "type must
// be string, but is number", "key 'step' not found".
std::string json_error_text(const std::exception& e);

// Typed reads of one field of an object that may hold anything: the fallback when the
// field is missing or of another type (never an exception).
template <class Json>
std::string string_field(const Json& object, const char* key, const std::string& fallback = "") {
  if (!object.is_object()) return fallback;
  const auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->template get<std::string>() : fallback;
}
template <class Json>
bool bool_field(const Json& object, const char* key, bool fallback = false) {
  if (!object.is_object()) return fallback;
  const auto it = object.find(key);
  return it != object.end() && it->is_boolean() ? it->template get<bool>() : fallback;
}


// `value` as bounded text for a message: scalars in full (strings cut), arrays and
// objects by their size only ("an array of 3 elements"), so no nesting is walked.
template <class Json>
std::string describe(const Json& value, size_t max_chars = 60) {
  if (value.is_array()) return "an array of " + std::to_string(value.size()) + " elements";
  if (value.is_object()) return "an object of " + std::to_string(value.size()) + " keys";
  if (value.is_string()) return "\"" + excerpt(value.template get_ref<const std::string&>(), max_chars) + "\"";
  return value.dump();  // a number, boolean or null: short
}

// Typed, range-checked reads of a state file's object (trainer_state.json and the
// state_dicts inside it): every error is gradguard::Error (bad input) naming the file
// (`where`), the field's path ("guard.detector.layer_count") and what it must be, with
// a bounded description of what it was. Nothing is changed by reading, so a caller can
// check a whole state before applying any of it.
class JsonReader {
 public:
  JsonReader(const nlohmann::json& object, std::string where, std::string path = "");

  bool has(const char* key) const;
  int64_t integer(const char* key, int64_t min = std::numeric_limits<int64_t>::min(),
                  int64_t max = std::numeric_limits<int64_t>::max()) const;
  // A finite number (JSON has no inf/NaN: gradguard writes them as null; `nullable`
  // reads null as NaN).
  double number(const char* key, bool nullable = false) const;
  bool boolean(const char* key) const;
  std::string string(const char* key) const;
  std::vector<double> numbers(const char* key, bool nullable = false) const;
  std::vector<int64_t> integers(const char* key, int64_t min = std::numeric_limits<int64_t>::min()) const;
  JsonReader object(const char* key) const;
  const nlohmann::json& raw(const char* key) const;  // the value, present (else the error)

  [[noreturn]] void fail(const char* key, const std::string& what) const;

 private:
  const nlohmann::json& object_;
  std::string where_, path_;
};

}  // namespace gradguard
