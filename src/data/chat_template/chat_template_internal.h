// Internals shared by the chat-template lexer, parser and evaluator
// (include/gradguard/data/chat_template/chat_template.h explains the design). Values imitate the Python
// objects jinja2 would hold: lists, dicts and namespaces are shared by reference (a
// namespace attribute set inside a loop is seen after it), strings are UTF-8 and every
// length/index on them counts code points as Python does.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gradguard/data/chat_template/chat_template.h"
#include "../tokenizer/unicode_text.h"  // the tokenizers' UTF-8 helpers

namespace gradguard {
namespace data {
namespace chat_detail {

struct Value;
struct Callable;

// What a list-like value is in Python: printing, len() and truthiness differ.
enum class SeqKind { kList, kTuple, kGenerator };

struct ListData {
  std::vector<Value> data;
  SeqKind seq = SeqKind::kList;
  bool consumed = false;  // a generator iterates once
};

struct DictData {
  std::vector<std::pair<Value, Value>> entries;  // [insertion order]
  const Value* find(const Value& key) const;
  void set(const Value& key, Value value);
};

enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kNamespace,
                  kCallable };

struct Value {
  Kind kind = Kind::kUndefined;
  bool b = false;
  int64_t i = 0;
  double f = 0.0;
  std::string s;  // kString: the text; kUndefined: the message jinja2 would raise
  std::shared_ptr<ListData> list;      // kList
  std::shared_ptr<DictData> dict;      // kDict, kNamespace
  std::shared_ptr<Callable> callable;  // kCallable

  static Value none();
  static Value boolean(bool v);
  static Value integer(int64_t v);
  static Value number(double v);
  static Value string(std::string v);
  static Value undefined(std::string message);
  static Value new_list(std::vector<Value> items, SeqKind seq = SeqKind::kList);
  static Value new_dict();

  bool is_undefined() const { return kind == Kind::kUndefined; }
  bool is_number() const { return kind == Kind::kInt || kind == Kind::kFloat || kind == Kind::kBool; }
};

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

class Renderer;
struct Callable {
  std::string name;
  std::function<Value(Renderer&, CallArgs&)> fn;
};

// A runtime error as jinja2 would raise it; the renderer adds where and line.
struct EvalError {
  std::string message;
  int line = 0;         // filled in by the statement that was running
  bool raised = false;  // from raise_exception(): the template's own message
};
[[noreturn]] void fail(const std::string& message);

// ---- values (chat_template_value.cpp) -------------------------------------------------
// Largest string any str()/repr()/json.dumps may build during this thread's render; the
// renderer sets it from max_output_bytes so printing a huge nested value stops early.
void set_size_limit(int64_t bytes);
bool truthy(const Value& v);
std::string to_str(const Value& v);   // Python str()
std::string repr(const Value& v);     // Python repr()
std::string type_name(const Value& v);  // Python type name: 'str', 'dict', ...
bool equals(const Value& a, const Value& b);
int compare(const Value& a, const Value& b, const char* op);  // <0, 0, >0 or fail()
// JSON in, keeping object key order (ordered_json) as Python's json module does.
template <class Json>
Value from_json(const Json& j) {
  if (j.is_null()) return Value::none();
  if (j.is_boolean()) return Value::boolean(j.template get<bool>());
  if (j.is_number_unsigned()) {
    uint64_t u = j.template get<uint64_t>();
    if (u <= static_cast<uint64_t>(INT64_MAX)) return Value::integer(static_cast<int64_t>(u));
    return Value::number(static_cast<double>(u));
  }
  if (j.is_number_integer()) return Value::integer(j.template get<int64_t>());
  if (j.is_number_float()) return Value::number(j.template get<double>());
  if (j.is_string()) return Value::string(j.template get<std::string>());
  if (j.is_array()) {
    std::vector<Value> items;
    items.reserve(j.size());
    for (const auto& item : j) items.push_back(from_json(item));
    return Value::new_list(std::move(items));
  }
  Value dict = Value::new_dict();
  if (j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it)
      dict.dict->entries.emplace_back(Value::string(it.key()), from_json(it.value()));
  }
  return dict;
}
std::string to_json(const Value& v, const std::string* indent, bool ensure_ascii,
                    bool sort_keys, const std::string& item_sep, const std::string& key_sep);
std::string float_repr(double v);
double as_double(const Value& v);  // numbers only
// Items of an iterable (list/tuple/generator elements, dict keys, string characters);
// fails like Python for non-iterables. Marks generators consumed.
std::vector<Value> iterate(const Value& v);

// UTF-8 helpers: code points of a string and back.
std::vector<uint32_t> decode_utf8(const std::string& s);
// UTF-8 encoding of one code point: the tokenizers' (unicode_text.h).
using detail::append_utf8;
std::string encode_utf8(const std::vector<uint32_t>& cps, size_t begin, size_t end);
bool is_py_space(uint32_t cp);  // str.isspace()
// Byte length of the whitespace code point starting at s[pos], 0 if none.
size_t space_len_at(const std::string& s, size_t pos);

// String helpers with Python's semantics (chat_template_methods.cpp). Case mapping is
// ASCII-only; other code points pass through unchanged.
std::string ascii_lower(const std::string& s);
std::string ascii_upper(const std::string& s);
std::string py_capitalize(const std::string& s);
// str.strip family: `chars` nullptr strips Unicode whitespace, else the given code points.
std::string py_strip(const std::string& s, const std::string* chars, bool left, bool right);
std::string py_replace(const std::string& s, const std::string& old, const std::string& with,
                       int64_t count);
std::vector<std::string> py_splitlines(const std::string& s);
std::string py_center(const std::string& s, int64_t width, uint32_t fill);
int64_t py_len(const std::string& s);  // code points

// ---- syntax tree -----------------------------------------------------------------------
struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

enum class ExprKind { kLiteral, kName, kList, kTuple, kDict, kGetAttr, kGetItem, kSlice,
                      kCall, kFilter, kTest, kNeg, kPos, kNot, kBinary, kConcat, kCompare,
                      kAnd, kOr, kCond };

struct Expr {
  ExprKind kind = ExprKind::kLiteral;
  int line = 0;
  Value literal;
  std::string name;              // name, attribute, filter, test, binary operator
  std::vector<ExprPtr> args;     // operand first (attr/item/filter/test/call), then arguments;
                                 // slice: object, start, stop, step (nullptr when absent)
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;  // kCompare: one operator per args[i + 1]
};

struct Node;
using Body = std::vector<std::unique_ptr<Node>>;

enum class NodeKind { kText, kOutput, kIf, kFor, kSet, kSetBlock, kMacro, kBreak, kContinue,
                      kGeneration };

struct Node {
  NodeKind kind = NodeKind::kText;
  int line = 0;
  std::string text;                  // kText; kMacro: name
  ExprPtr expr;                      // kOutput, kSet value, kFor iterable
  ExprPtr filter;                    // kFor: `if` condition; kSetBlock: filter chain on a
                                     // placeholder kName "" operand
  std::vector<std::string> targets;  // kFor/kSet/kSetBlock names; kSet to ns: {ns, attr}
  bool ns_target = false;            // set ns.attr = ...
  bool tuple_target = false;         // for a, b in ... / set a, b = ...
  std::vector<std::pair<ExprPtr, Body>> branches;  // kIf: (cond, body), else cond nullptr
  Body body, else_body;
  std::vector<std::string> params;   // kMacro
  std::vector<ExprPtr> defaults;     // kMacro, parallel to params (nullptr: none)
};

struct Template {
  std::string where;
  ChatTemplateOptions options;
  Body body;
  bool iterates_content = false;  // some for loop runs over `X.content` / `X['content']`
};

// ---- lexer / parser (chat_template_lexer.cpp, chat_template_parser.cpp) ---------------
enum class TokKind { kText, kVarBegin, kVarEnd, kBlockBegin, kBlockEnd, kName, kString,
                     kInt, kFloat, kOp, kEof };
struct Token {
  TokKind kind;
  std::string text;  // decoded string literal, name, operator, raw text
  int line;
  int col;
  int64_t int_value = 0;
  double float_value = 0.0;
};
std::vector<Token> lex(const std::string& source, const std::string& where);
Body parse_tokens(const std::vector<Token>& tokens, const std::string& where, int max_depth);

// ---- builtins (chat_template_filters.cpp) ----------------------------------------------
bool has_filter(const std::string& name);
bool has_test(const std::string& name);
bool jinja_knows_filter(const std::string& name);  // jinja2 filter we do not implement
bool jinja_knows_test(const std::string& name);
Value apply_filter(Renderer& r, const std::string& name, const Value& operand, CallArgs& args);
bool apply_test(Renderer& r, const std::string& name, const Value& operand, CallArgs& args);
// Attribute `name` of a str/dict/list as jinja2's sandbox resolves it (bound methods
// included); Undefined when absent.
Value get_method(const Value& object, const std::string& name);
Value make_global(const std::string& name);  // range, namespace, dict, raise_exception, ...

// Argument binding like a Python signature: positional index or keyword name.
const Value* find_arg(const CallArgs& args, size_t index, const char* name);
Value arg_or(const CallArgs& args, size_t index, const char* name, Value fallback);

// ---- evaluator (chat_template_eval.cpp) ------------------------------------------------
// Checks a size against max_output_bytes; fails with a clear message when over.
void check_size(Renderer& r, int64_t bytes);
// Namespaces can hold themselves (`{% set ns.me = ns %}`), a shared_ptr cycle; the renderer
// empties every namespace it created when the render ends.
void track_namespace(Renderer& r, const std::shared_ptr<DictData>& ns);
Value getattr(const Value& object, const std::string& name);
Value getitem(const Value& object, const Value& key);
Value call_value(Renderer& r, const Value& callee, CallArgs& args);

// ---- operators (chat_template_ops.cpp) ---------------------------------------------------
// parts: start, stop, step; None where absent.
Value slice_value(const Value& object, const Value parts[3]);
Value binary_op(Renderer& r, const std::string& op, const Value& a, const Value& b);  // + - * / // % **
bool compare_op(const std::string& op, const Value& a, const Value& b);  // == != < <= > >= in, not in

}  // namespace chat_detail
}  // namespace data
}  // namespace gradguard
