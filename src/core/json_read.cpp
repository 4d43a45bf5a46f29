// Bounded JSON: nlohmann's parser is iterative, so a deep document does not overflow
// the stack while parsing, but everything recursive afterwards would (printing the value
// in a message, walking it); the parser callback stops at max_depth before such a value
// exists. Sizes are checked before parsing.
#include "gradguard/core/json_read.h"

#include <cmath>

#include "gradguard/core/error.h"
#include "gradguard/core/fs.h"

namespace gradguard {
namespace {

// Thrown from the parser callback, caught below; never leaves this file.
struct TooDeep {};

template <class Json>
std::optional<Json> parse_bounded(std::string_view text, const JsonLimits& limits, std::string* why) {
  if (text.size() > limits.max_bytes) {
    *why = std::to_string(text.size()) + " bytes, more than the limit of " + std::to_string(limits.max_bytes);
    return std::nullopt;
  }
  const int max_depth = limits.max_depth;
  // The parser reports an array or object start with the number of levels already open
  // (0 for the outermost), so the (max_depth + 1)-th level is refused as it opens.
  auto depth_guard = [max_depth](int depth, typename Json::parse_event_t event, Json&) {
    using Event = typename Json::parse_event_t;
    if ((event == Event::array_start || event == Event::object_start) && depth >= max_depth) throw TooDeep{};
    return true;
  };
  try {
    Json j = Json::parse(text.begin(), text.end(), depth_guard, /*allow_exceptions=*/true);
    return j;
  } catch (const TooDeep&) {
    *why = "nested more than " + std::to_string(max_depth) + " levels deep";
  } catch (const nlohmann::json::exception& e) {
    *why = "not valid JSON: " + json_error_text(e);
  }
  return std::nullopt;
}

template <class Json>
Json parse_or_throw(std::string_view text, const std::string& where, const JsonLimits& limits, bool require_object) {
  std::string why;
  auto j = parse_bounded<Json>(text, limits, &why);
  if (!j) throw bad_input(where, why + " (starts: " + excerpt(text) + ")");
  if (require_object && !j->is_object())
    throw bad_input(where, "expected a JSON object, got " + std::string(j->type_name()) + " (starts: " +
                               excerpt(text) + ")");
  return std::move(*j);
}

}  // namespace

std::string json_error_text(const std::exception& e) {
  std::string s = e.what();
  if (s.rfind("[json.exception.", 0) == 0) {
    const size_t close = s.find("] ");
    if (close != std::string::npos) s.erase(0, close + 2);
  }
  const std::string parse = "parse error at ";
  if (s.rfind(parse, 0) == 0) s.erase(0, parse.size());
  const size_t filler = s.find("syntax error while parsing ");
  if (filler != std::string::npos) {
    const size_t dash = s.find(" - ", filler);
    if (dash != std::string::npos) s.erase(filler, dash + 3 - filler);
  }
  return s;
}

nlohmann::json parse_json(std::string_view text, const std::string& where, const JsonLimits& limits,
                          bool require_object) {
  return parse_or_throw<nlohmann::json>(text, where, limits, require_object);
}

nlohmann::ordered_json parse_ordered_json(std::string_view text, const std::string& where, const JsonLimits& limits,
                                          bool require_object) {
  return parse_or_throw<nlohmann::ordered_json>(text, where, limits, require_object);
}

std::optional<nlohmann::json> try_parse_json(std::string_view text, const JsonLimits& limits) {
  std::string why;
  return parse_bounded<nlohmann::json>(text, limits, &why);
}

std::optional<nlohmann::ordered_json> try_parse_ordered_json(std::string_view text, const JsonLimits& limits) {
  std::string why;
  return parse_bounded<nlohmann::ordered_json>(text, limits, &why);
}

nlohmann::json read_json_file(const std::string& path, const JsonLimits& limits) {
  return parse_json(fs::read_file(path, limits.max_bytes), path, limits);
}

std::string excerpt(std::string_view text, size_t max_chars) {
  std::string out;
  for (char c : text.substr(0, max_chars)) out += (c == '\n' || c == '\r' || c == '\t') ? ' ' : c;
  if (text.size() > max_chars) out += "...";
  return out;
}

JsonReader::JsonReader(const nlohmann::json& object, std::string where, std::string path)
    : object_(object), where_(std::move(where)), path_(std::move(path)) {
  if (!object_.is_object())
    throw bad_input(where_, (path_.empty() ? std::string("the state") : "'" + path_ + "'") +
                                " must be a JSON object, got " + describe(object_));
}

void JsonReader::fail(const char* key, const std::string& what) const {
  throw bad_input(where_, "'" + (path_.empty() ? std::string() : path_ + ".") + key + "' " + what);
}

bool JsonReader::has(const char* key) const { return object_.contains(key); }

const nlohmann::json& JsonReader::raw(const char* key) const {
  const auto it = object_.find(key);
  if (it == object_.end()) fail(key, "is missing");
  return *it;
}

int64_t JsonReader::integer(const char* key, int64_t min, int64_t max) const {
  const auto& v = raw(key);
  if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX)) ||
      v.get<int64_t>() < min || v.get<int64_t>() > max)
    fail(key, "must be an integer in [" + std::to_string(min) + ", " + std::to_string(max) + "], got " +
                  describe(v));
  return v.get<int64_t>();
}

double JsonReader::number(const char* key, bool nullable) const {
  const auto& v = raw(key);
  if (nullable && v.is_null()) return std::numeric_limits<double>::quiet_NaN();
  if (!v.is_number() || !std::isfinite(v.get<double>())) fail(key, "must be a finite number, got " + describe(v));
  return v.get<double>();
}

bool JsonReader::boolean(const char* key) const {
  const auto& v = raw(key);
  if (!v.is_boolean()) fail(key, "must be true or false, got " + describe(v));
  return v.get<bool>();
}

std::string JsonReader::string(const char* key) const {
  const auto& v = raw(key);
  if (!v.is_string()) fail(key, "must be a string, got " + describe(v));
  return v.get<std::string>();
}

std::vector<double> JsonReader::numbers(const char* key, bool nullable) const {
  const auto& v = raw(key);
  if (!v.is_array()) fail(key, "must be a list of numbers, got " + describe(v));
  std::vector<double> out;
  for (const auto& x : v) {
    if (nullable && x.is_null()) {
      out.push_back(std::numeric_limits<double>::quiet_NaN());
      continue;
    }
    if (!x.is_number() || !std::isfinite(x.get<double>()))
      fail(key, "must be a list of finite numbers, got an element " + describe(x));
    out.push_back(x.get<double>());
  }
  return out;
}

std::vector<int64_t> JsonReader::integers(const char* key, int64_t min) const {
  const auto& v = raw(key);
  if (!v.is_array()) fail(key, "must be a list of integers, got " + describe(v));
  std::vector<int64_t> out;
  for (const auto& x : v) {
    if (!x.is_number_integer() || x.get<int64_t>() < min)
      fail(key, "must be a list of integers >= " + std::to_string(min) + ", got an element " + describe(x));
    out.push_back(x.get<int64_t>());
  }
  return out;
}

JsonReader JsonReader::object(const char* key) const {
  return JsonReader(raw(key), where_, (path_.empty() ? std::string() : path_ + ".") + key);
}

}  // namespace gradguard
