// Bounded JSON reading (core/json_read.h): depth and size limits, bounded excerpts, and
// the typed, range-checked reads of state files.
#include "gradguard/core/json_read.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "gradguard/core/error.h"
#include "gradguard/core/fs.h"
#include "test_util.h"

namespace gradguard {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string nested(int depth) { return std::string(depth, '[') + std::string(depth, ']'); }

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), 2) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

TEST(JsonRead, DepthLimitRefusesDeepNestingWithoutRecursingIntoIt) {
  EXPECT_NO_THROW(parse_json(nested(64), "x.json", {}, false));
  const std::string deep = nested(1'000'000);  // recursing over this would overflow the stack
  const std::string msg = error_of([&] { parse_json(deep, "x.json", {}, false); });
  EXPECT_THAT(msg, HasSubstr("x.json"));
  EXPECT_THAT(msg, HasSubstr("64"));  // the limit is named
  EXPECT_LT(msg.size(), 400u);        // an excerpt, not the document
  EXPECT_FALSE(try_parse_json(deep).has_value());
  EXPECT_FALSE(try_parse_json(nested(65)).has_value());
  // Nesting inside a string is text, not depth.
  EXPECT_NO_THROW(parse_json("{\"a\":\"" + nested(500) + "\"}", "x.json"));
}

TEST(JsonRead, SizeLimitAndObjectRequirement) {
  JsonLimits small;
  small.max_bytes = 10;
  EXPECT_THAT(error_of([&] { parse_json("{\"a\":12345678}", "y.json", small); }), HasSubstr("y.json"));
  EXPECT_THAT(error_of([&] { parse_json("[1,2]", "z.json"); }), HasSubstr("object"));
  EXPECT_NO_THROW(parse_json("[1,2]", "z.json", {}, false));
  EXPECT_THAT(error_of([&] { parse_json("{\"a\":", "w.json"); }), HasSubstr("w.json"));
}

TEST(JsonRead, ParseErrorsAreInOurWordsWithLineAndColumn) {
  // nlohmann's own text carries a "[json.exception.parse_error.101]" tag and parser
  // jargon; the message keeps the position and the reason (nlohmann 3.11's wording).
  const std::string msg = error_of([&] { parse_json("{\"a\": tru}", "x.json"); });
  EXPECT_THAT(msg, HasSubstr("x.json: not valid JSON: line 1, column 10: invalid literal; last read: '"));
  EXPECT_THAT(msg, Not(HasSubstr("json.exception")));
  EXPECT_THAT(msg, Not(HasSubstr("syntax error while parsing")));
  try {
    nlohmann::json j = 3;
    (void)j.get<std::string>();
    ADD_FAILURE() << "no exception";
  } catch (const nlohmann::json::exception& e) {
    EXPECT_EQ(json_error_text(e), "type must be string, but is number");
  }
  try {
    (void)nlohmann::json::object().at("step");
    ADD_FAILURE() << "no exception";
  } catch (const nlohmann::json::exception& e) {
    EXPECT_EQ(json_error_text(e), "key 'step' not found");
  }
}

TEST(JsonRead, ExcerptIsOneBoundedLine) {
  EXPECT_EQ(excerpt("abc"), "abc");
  const std::string cut = excerpt(std::string(1000, 'x') + "\nmore", 20);
  EXPECT_LE(cut.size(), 23u);
  EXPECT_THAT(cut, HasSubstr("..."));
  EXPECT_THAT(excerpt("a\nb"), Not(HasSubstr("\n")));
}

TEST(JsonRead, DescribeNeverWalksNesting) {
  const auto deep = nlohmann::json::parse(nested(50));
  EXPECT_EQ(describe(deep), "an array of 1 elements");
  EXPECT_EQ(describe(nlohmann::json{{"a", 1}, {"b", 2}}), "an object of 2 keys");
  EXPECT_EQ(describe(nlohmann::json(3)), "3");
}

TEST(JsonRead, ReadJsonFileNamesTheFile) {
  test::TempDir dir;
  const std::string path = dir.file("state.json");
  fs::write_file_atomic(path, nested(100000));
  EXPECT_THAT(error_of([&] { read_json_file(path); }), HasSubstr(path));
  EXPECT_THAT(error_of([&] { read_json_file(dir.file("missing.json")); }), HasSubstr("missing.json"));
  fs::write_file_atomic(path, "{\"step\": 3}");
  EXPECT_EQ(read_json_file(path)["step"], 3);
}

TEST(JsonReader, TypedReadsNameFileAndFieldPath) {
  const auto j = nlohmann::json::parse(
      R"({"step": -1, "lr": null, "ok": true, "name": "x", "inner": {"n": "7", "v": [1, 2.5]}, "big": 1e300})");
  const JsonReader r(j, "trainer_state.json");
  EXPECT_EQ(r.integer("step"), -1);
  const std::string neg = error_of([&] { r.integer("step", 0); });
  EXPECT_THAT(neg, HasSubstr("trainer_state.json"));
  EXPECT_THAT(neg, HasSubstr("step"));
  EXPECT_TRUE(std::isnan(r.number("lr", true)));
  EXPECT_THAT(error_of([&] { r.number("lr"); }), HasSubstr("lr"));
  EXPECT_TRUE(r.boolean("ok"));
  EXPECT_EQ(r.string("name"), "x");
  EXPECT_THAT(error_of([&] { r.string("ok"); }), HasSubstr("ok"));
  EXPECT_THAT(error_of([&] { r.integer("missing"); }), HasSubstr("missing"));
  const JsonReader inner = r.object("inner");
  const std::string path_msg = error_of([&] { inner.integer("n"); });
  EXPECT_THAT(path_msg, HasSubstr("inner.n"));
  EXPECT_THAT(path_msg, HasSubstr("\"7\""));  // what it was, described
  EXPECT_EQ(inner.numbers("v"), (std::vector<double>{1, 2.5}));
  EXPECT_THAT(error_of([&] { inner.integers("v"); }), HasSubstr("inner.v"));
  EXPECT_THAT(error_of([&] { r.object("name"); }), HasSubstr("name"));
  EXPECT_THAT(error_of([&] { r.integer("big"); }), HasSubstr("big"));
}

}  // namespace
}  // namespace gradguard
