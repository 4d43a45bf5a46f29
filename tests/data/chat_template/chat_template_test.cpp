// Chat templates: every golden case from tests/golden/chat_templates.json (rendered by
// Python jinja2 configured as transformers does, see tests/golden/chat_templates.py) must
// render byte-identically or fail when jinja2 failed; then the error paths a user sees
// (syntax errors with line:column and `where`, unknown filters/tests, raise_exception,
// undefined values) and the limits that stop a hostile template.
#include "gradguard/data/chat_template/chat_template.h"

#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "gradguard/core/error.h"

namespace gradguard {
namespace data {
namespace {

using Json = nlohmann::ordered_json;

const char* const kWhere = "tokenizer_config.json: chat_template";

// The golden cases; a real model's template ("template_file") is read from its npm
// package's tokenizer_config.json, and its cases are left out when that is not installed.
Json load_goldens() {
  std::ifstream in(std::string(GRADGUARD_SOURCE_DIR) + "/tests/golden/chat_templates.json");
  EXPECT_TRUE(in.good()) << "missing tests/golden/chat_templates.json";
  Json cases = Json::parse(in);
  Json kept = Json::array();
  for (auto& c : cases) {
    if (c.contains("template_file")) {
      std::ifstream config(std::string(GRADGUARD_SOURCE_DIR) + "/" + c["template_file"].get<std::string>());
      if (!config.good()) continue;
      c["template"] = Json::parse(config)["chat_template"];
    }
    kept.push_back(c);
  }
  return kept;
}

std::string render(const std::string& source, const Json& context = Json::object(),
                   const ChatTemplateOptions& options = ChatTemplateOptions()) {
  return ChatTemplate::parse(source, kWhere, options).render(context);
}

// The message of the gradguard::Error that `fn` throws ("" when it does not throw).
template <class Fn>
std::string error_of(Fn fn) {
  try {
    fn();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
    EXPECT_EQ(e.where(), kWhere);
    return e.what();
  }
  return "";
}

TEST(ChatTemplate, GoldenCasesMatchJinja2) {
  Json cases = load_goldens();
  ASSERT_GT(cases.size(), 150u);
  int passed = 0;
  for (const auto& c : cases) {
    const std::string name = c["name"].get<std::string>();
    const std::string source = c["template"].get<std::string>();
    if (c.contains("error")) {
      std::string message = error_of([&] { render(source, c["context"]); });
      EXPECT_FALSE(message.empty()) << name << ": jinja2 raised " << c["error_type"].get<std::string>()
                                    << " (" << c["error_message"].get<std::string>() << ") but we rendered";
      if (!message.empty()) ++passed;
      continue;
    }
    std::string got;
    try {
      got = render(source, c["context"]);
    } catch (const Error& e) {
      ADD_FAILURE() << name << ": threw " << e.what();
      continue;
    }
    EXPECT_EQ(got, c["expected"].get<std::string>()) << name;
    if (got == c["expected"].get<std::string>()) ++passed;
  }
  EXPECT_EQ(passed, static_cast<int>(cases.size()));
  std::cout << "[ golden   ] " << passed << " / " << cases.size() << " cases byte-identical\n";
}

TEST(ChatTemplate, ErrorMessagesFollowJinja2) {
  // Where jinja2's message is about the template's data, ours carries the same text.
  Json cases = load_goldens();
  for (const auto& c : cases) {
    if (!c.contains("error")) continue;
    const std::string type = c["error_type"].get<std::string>();
    if (type != "UndefinedError" && type != "TemplateError" && type != "SecurityError") continue;
    std::string message = error_of([&] { render(c["template"].get<std::string>(), c["context"]); });
    EXPECT_NE(message.find(c["error_message"].get<std::string>()), std::string::npos)
        << c["name"].get<std::string>() << ": " << message;
  }
}

TEST(ChatTemplate, AHugeFormatIndexIsPythonsValueErrorNotARawLibraryError) {
  // Python 3.11: '{999999999999999999999}'.format() raises ValueError "Too many decimal
  // digits in format string" (past Py_ssize_t), '{9223372036854775807}'.format() an
  // IndexError "Replacement index ... out of range"; std::stoul's out_of_range used to
  // escape as exit 1.
  auto says = [](const std::string& source, const std::string& text) {
    const std::string message = error_of([&] { render(source, Json::object()); });
    EXPECT_NE(message.find(text), std::string::npos) << source << ": " << message;
  };
  says("{{ '{999999999999999999999}'.format() }}", "Too many decimal digits in format string");
  says("{{ '{9223372036854775808}'.format() }}", "Too many decimal digits in format string");
  says("{{ '{9223372036854775807}'.format() }}",
       "Replacement index 9223372036854775807 out of range for positional args tuple");
}

TEST(ChatTemplate, SyntaxErrorNamesWhereLineAndColumn) {
  std::string message = error_of([] { ChatTemplate::parse("ok\n{{ 1 + }}", kWhere); });
  EXPECT_NE(message.find(kWhere), std::string::npos) << message;
  EXPECT_NE(message.find("line 2:8"), std::string::npos) << message;

  message = error_of([] { ChatTemplate::parse("{% for x in xs %}\n  {{ x }}\n", kWhere); });
  EXPECT_NE(message.find("endfor"), std::string::npos) << message;

  message = error_of([] { ChatTemplate::parse("a\n\n  {{ 'unterminated }}", kWhere); });
  EXPECT_NE(message.find("line 3:6"), std::string::npos) << message;

  message = error_of([] { ChatTemplate::parse("{% if x %}a{% endfor %}", kWhere); });
  EXPECT_NE(message.find("endfor"), std::string::npos) << message;
  EXPECT_NE(message.find("line 1:"), std::string::npos) << message;
}

TEST(ChatTemplate, UnknownAndUnsupportedFeaturesAreNamed) {
  EXPECT_NE(error_of([] { ChatTemplate::parse("{{ x | frobnicate }}", kWhere); }).find("no filter named 'frobnicate'"),
            std::string::npos);
  EXPECT_NE(error_of([] { ChatTemplate::parse("{{ x is frob }}", kWhere); }).find("no test named 'frob'"),
            std::string::npos);
  EXPECT_NE(error_of([] { ChatTemplate::parse("{{ x | wordwrap }}", kWhere); }).find("'wordwrap' is not supported"),
            std::string::npos);
  EXPECT_NE(error_of([] { ChatTemplate::parse("{% include 'x' %}", kWhere); }).find("not supported"),
            std::string::npos);
  EXPECT_NE(error_of([] { ChatTemplate::parse("{% do x %}", kWhere); }).find("unknown tag 'do'"),
            std::string::npos);
  EXPECT_NE(error_of([] { ChatTemplate::parse("{% for x in y recursive %}{% endfor %}", kWhere); })
                .find("recursive"),
            std::string::npos);
}

TEST(ChatTemplate, RaiseExceptionSurfacesTheTemplateMessage) {
  const std::string source = "{% if messages[0].role != 'user' %}{{ raise_exception('first must be user') }}{% endif %}";
  Json context = {{"messages", Json::array({Json{{"role", "system"}, {"content", "x"}}})}};
  std::string message = error_of([&] { render(source, context); });
  EXPECT_NE(message.find("first must be user"), std::string::npos) << message;
  EXPECT_NE(message.find("raise_exception"), std::string::npos) << message;
}

TEST(ChatTemplate, UndefinedBehavesLikeJinja2) {
  EXPECT_EQ(render("[{{ missing }}][{{ d.nope }}][{{ l[3] }}]", Json{{"d", Json::object()}, {"l", Json::array()}}),
            "[][][]");
  EXPECT_EQ(render("{{ missing is defined }} {{ missing|default('x') }} {{ missing|length }}"), "False x 0");
  std::string message = error_of([] { render("{{ missing.attr }}"); });
  EXPECT_NE(message.find("'missing' is undefined"), std::string::npos) << message;
  message = error_of([] { render("line1\n{{ d.a.b }}", Json{{"d", Json::object()}}); });
  EXPECT_NE(message.find("'dict object' has no attribute 'a'"), std::string::npos) << message;
  EXPECT_NE(message.find("line 2"), std::string::npos) << message;
}

TEST(ChatTemplate, ContextKeyOrderIsKept) {
  Json context = Json::parse(R"({"tool": {"name": "f", "arguments": {"z": 1, "a": 2}}})");
  EXPECT_EQ(render("{{ tool|tojson }}", context), R"({"name": "f", "arguments": {"z": 1, "a": 2}})");
  // nlohmann::json sorts keys; the overload still renders.
  nlohmann::json sorted = nlohmann::json::parse(R"({"x": {"b": 1, "a": 2}})");
  EXPECT_EQ(ChatTemplate::parse("{{ x|tojson }}", kWhere).render(sorted), R"({"a": 2, "b": 1})");
}

TEST(ChatTemplate, OutputLimitStopsHugeRenders) {
  ChatTemplateOptions options;
  options.max_output_bytes = 1 << 20;
  std::string message = error_of([&] { render("{% for i in range(100000) %}{{ 'x' * 100 }}{% endfor %}", {}, options); });
  EXPECT_NE(message.find("max_output_bytes"), std::string::npos) << message;
  // Doubling a string inside a namespace never reaches the output but is still bounded.
  message = error_of([&] {
    render("{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}", {},
           options);
  });
  EXPECT_NE(message.find("max_output_bytes"), std::string::npos) << message;
  message = error_of([&] { render("{{ 'x' * 100000000000 }}", {}, options); });
  EXPECT_NE(message.find("max_output_bytes"), std::string::npos) << message;
}

TEST(ChatTemplate, LoopAndDepthLimitsStopHostileTemplates) {
  ChatTemplateOptions options;
  options.max_loop_iterations = 1000;
  std::string message = error_of([&] {
    render("{% for i in range(100) %}{% for j in range(100) %}{% endfor %}{% endfor %}", {}, options);
  });
  EXPECT_NE(message.find("max_loop_iterations"), std::string::npos) << message;

  message = error_of([] { render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"); });
  EXPECT_NE(message.find("max_depth"), std::string::npos) << message;

  std::string deep(5000, '(');
  message = error_of([&] { ChatTemplate::parse("{{ " + deep + "1" + std::string(5000, ')') + " }}", kWhere); });
  EXPECT_NE(message.find("nests deeper"), std::string::npos) << message;

  message = error_of([] { render("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}"); });
  EXPECT_FALSE(message.empty());

  EXPECT_THROW(ChatTemplate::parse("x", kWhere, [] {
                 ChatTemplateOptions bad;
                 bad.max_depth = 0;
                 return bad;
               }()),
               Error);
}

TEST(ChatTemplate, TruncatedTemplatesFailOnlyWithGradguardErrors) {
  // Every prefix of every golden template either renders or throws gradguard::Error:
  // no crash, hang or foreign exception on malformed input.
  Json cases = load_goldens();
  for (const auto& c : cases) {
    const std::string source = c["template"].get<std::string>();
    for (size_t n = 0; n <= source.size(); n += 1 + source.size() / 97) {
      try {
        ChatTemplate::parse(source.substr(0, n), kWhere).render(c["context"]);
      } catch (const Error&) {
      } catch (const std::exception& e) {
        ADD_FAILURE() << c["name"].get<std::string>() << " prefix " << n << ": " << e.what();
      }
    }
  }
}

TEST(ChatTemplate, RendersAreRepeatableAndIndependent) {
  ChatTemplate t = ChatTemplate::parse(
      "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}", kWhere);
  Json context = {{"messages", Json::array({1, 2, 3})}};
  EXPECT_EQ(t.render(context), "3");
  EXPECT_EQ(t.render(context), "3");
  EXPECT_EQ(t.where(), kWhere);
}

}  // namespace
}  // namespace data
}  // namespace gradguard
