// A Hugging Face chat template (tokenizer_config.json "chat_template") rendered in C++,
// byte-identical to Python jinja2 as transformers runs it: an ImmutableSandboxedEnvironment
// with trim_blocks, lstrip_blocks and loopcontrols, the globals raise_exception(msg) and
// strftime_now(fmt), and transformers' tojson filter (json.dumps with ensure_ascii=False).
// We implement the subset of Jinja2 that real chat templates use rather than embed Python:
// the template is lexed with jinja2's whitespace rules, parsed once into a tree, and
// evaluated over Python-like values (None/Undefined, bool, int, float, str, list, tuple,
// dict in insertion order, namespace, macro) so printing, truthiness, comparisons and
// errors follow Python's. Golden outputs from jinja2 live in tests/golden/chat_templates.json.
//
// Unknown or unsupported filters, tests and tags are rejected when the template is parsed
// (jinja2 also rejects unknown filters/tests at compile time), so a tokenizer_config.json
// that needs a feature we lack fails before training starts, naming line:column.
//
// Not supported (parse error "... is not supported"): {% call %} blocks, {% include %},
// {% extends %}/{% block %}, {% import %}, {% with %}, recursive for loops, *args/**kwargs
// in calls and macros, Markup auto-escaping semantics (escape/safe only change the text),
// Python %-formatting of strings. Case mapping (upper, lower, title, ...) covers ASCII only.
//
// A hostile template cannot hang the process or exhaust memory: rendering stops with a
// gradguard::Error once any of the ChatTemplateOptions limits below is exceeded.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

namespace gradguard {
namespace data {

namespace chat_detail {
struct Template;
struct Value;
}

struct ChatTemplateOptions {
  // Largest rendered output, and largest string or list any expression may build, in bytes
  // (lists count 16 bytes per element). 64 MiB; must be > 0.
  int64_t max_output_bytes = int64_t{64} << 20;
  // Total loop iterations (all for loops together) one render may run. Must be > 0.
  int64_t max_loop_iterations = 10'000'000;
  // Deepest macro call nesting during a render, and deepest expression/statement nesting
  // accepted by the parser. Must be > 0.
  int max_depth = 200;

  void validate() const;  // throws gradguard::Error naming the bad field
};

class ChatTemplate {
 public:
  // Parses `source` once. Throws gradguard::Error (bad input) whose where() is `where`
  // (e.g. "tokenizer_config.json: chat_template") and whose message gives line:column and
  // what is wrong or unsupported.
  static ChatTemplate parse(const std::string& source, const std::string& where,
                            const ChatTemplateOptions& options = ChatTemplateOptions());

  // Renders with `context`, a JSON object whose keys become template variables (messages,
  // add_generation_prompt, bos_token, eos_token, tools, ...). Variables not in `context`
  // are undefined, as in jinja2. Throws gradguard::Error (bad input) when the template calls
  // raise_exception (the message is the template's), on a runtime error jinja2 would also
  // raise (e.g. "'x' is undefined" when an attribute of an undefined value is read), and
  // when a limit in ChatTemplateOptions is exceeded. Thread-safe: renders share nothing.
  // Pass an nlohmann::ordered_json to keep object key order as Python's dicts do (it shows
  // in tojson output and dict iteration); nlohmann::json sorts keys alphabetically.
  std::string render(const nlohmann::ordered_json& context) const;
  std::string render(const nlohmann::json& context) const;

  const std::string& where() const;

  // Whether some for loop of the template runs over a message's content (`{% for part in
  // message.content %}`, `message['content']`, through any filter): such a template takes
  // the list-of-parts form ([{"type": "text", "text": ...}], OpenAI's and HF's multimodal
  // messages) itself; one that does not expects a string (data/sft.h joins the parts).
  bool iterates_message_content() const;

 private:
  explicit ChatTemplate(std::shared_ptr<const chat_detail::Template> impl)
      : impl_(std::move(impl)) {}
  std::string render_value(const chat_detail::Value& context) const;
  std::shared_ptr<const chat_detail::Template> impl_;
};

}  // namespace data
}  // namespace gradguard
