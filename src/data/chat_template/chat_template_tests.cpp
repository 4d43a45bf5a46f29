// jinja2's built-in tests (`x is defined`, `n is divisibleby 3`, `s is string`, ...) with
// Python's type rules: bools are numbers but not integers, an Undefined is iterable and
// callable (it defines __iter__ and __call__), and a generator is not a sequence.
#include <map>

#include "chat_template_internal.h"

namespace gradguard {
namespace data {
namespace chat_detail {
namespace {

using TestFn = bool (*)(Renderer&, const Value&, CallArgs&);

int64_t int_operand(const Value& v, const char* what) {
  if (v.is_undefined()) fail(v.s);
  if (v.kind == Kind::kInt || v.kind == Kind::kBool) return v.kind == Kind::kBool ? v.b : v.i;
  if (v.kind == Kind::kFloat) return static_cast<int64_t>(v.f);
  fail(std::string("unsupported operand type(s) for %: '") + type_name(v) + "' and 'int' (" + what + ")");
}

const Value& need(const CallArgs& a, const char* test) {
  const Value* v = find_arg(a, 0, "other");
  if (!v) fail(std::string("test '") + test + "' needs an argument");
  return *v;
}

bool t_defined(Renderer&, const Value& v, CallArgs&) { return !v.is_undefined(); }
bool t_undefined(Renderer&, const Value& v, CallArgs&) { return v.is_undefined(); }
bool t_none(Renderer&, const Value& v, CallArgs&) { return v.kind == Kind::kNone; }
bool t_boolean(Renderer&, const Value& v, CallArgs&) { return v.kind == Kind::kBool; }
bool t_true(Renderer&, const Value& v, CallArgs&) { return v.kind == Kind::kBool && v.b; }
bool t_false(Renderer&, const Value& v, CallArgs&) { return v.kind == Kind::kBool && !v.b; }
bool t_integer(Renderer&, const Value& v, CallArgs&) { return v.kind == Kind::kInt; }
bool t_float(Renderer&, const Value& v, CallArgs&) { return v.kind == Kind::kFloat; }
bool t_number(Renderer&, const Value& v, CallArgs&) { return v.is_number(); }
bool t_string(Renderer&, const Value& v, CallArgs&) { return v.kind == Kind::kString; }
bool t_mapping(Renderer&, const Value& v, CallArgs&) { return v.kind == Kind::kDict; }
bool t_callable(Renderer&, const Value& v, CallArgs&) { return v.kind == Kind::kCallable || v.is_undefined(); }
bool t_iterable(Renderer&, const Value& v, CallArgs&) {
  return v.kind == Kind::kString || v.kind == Kind::kList || v.kind == Kind::kDict || v.is_undefined();
}
bool t_sequence(Renderer&, const Value& v, CallArgs&) {
  return v.kind == Kind::kString || v.kind == Kind::kDict || (v.kind == Kind::kList && v.list->seq != SeqKind::kGenerator);
}
bool t_odd(Renderer&, const Value& v, CallArgs&) { return int_operand(v, "odd") % 2 != 0; }
bool t_even(Renderer&, const Value& v, CallArgs&) { return int_operand(v, "even") % 2 == 0; }
bool t_divisibleby(Renderer&, const Value& v, CallArgs& a) {
  const Value* n = find_arg(a, 0, "num");
  if (!n) fail("test 'divisibleby' needs an argument");
  int64_t d = int_operand(*n, "divisibleby");
  if (d == 0) fail("integer division or modulo by zero");
  return int_operand(v, "divisibleby") % d == 0;
}
bool t_eq(Renderer&, const Value& v, CallArgs& a) { return equals(v, need(a, "eq")); }
bool t_ne(Renderer&, const Value& v, CallArgs& a) { return !equals(v, need(a, "ne")); }
bool t_lt(Renderer&, const Value& v, CallArgs& a) { return compare(v, need(a, "lt"), "<") < 0; }
bool t_le(Renderer&, const Value& v, CallArgs& a) { return compare(v, need(a, "le"), "<=") <= 0; }
bool t_gt(Renderer&, const Value& v, CallArgs& a) { return compare(v, need(a, "gt"), ">") > 0; }
bool t_ge(Renderer&, const Value& v, CallArgs& a) { return compare(v, need(a, "ge"), ">=") >= 0; }
bool t_in(Renderer&, const Value& v, CallArgs& a) {
  const Value& seq = need(a, "in");
  if (seq.kind == Kind::kString) {
    if (v.kind != Kind::kString) fail("'in <string>' requires string as left operand, not " + type_name(v));
    return seq.s.find(v.s) != std::string::npos;
  }
  if (seq.kind == Kind::kDict) return seq.dict->find(v) != nullptr;
  for (const Value& item : iterate(seq))
    if (equals(item, v)) return true;
  return false;
}
bool t_lower(Renderer&, const Value& v, CallArgs&) {
  std::string s = to_str(v);
  return ascii_lower(s) == s && ascii_upper(s) != s;
}
bool t_upper(Renderer&, const Value& v, CallArgs&) {
  std::string s = to_str(v);
  return ascii_upper(s) == s && ascii_lower(s) != s;
}
bool t_sameas(Renderer&, const Value& v, CallArgs& a) {
  const Value& o = need(a, "sameas");
  if (v.kind != o.kind) return false;
  switch (v.kind) {
    case Kind::kList: return v.list == o.list;
    case Kind::kDict:
    case Kind::kNamespace: return v.dict == o.dict;
    case Kind::kCallable: return v.callable == o.callable;
    default: return equals(v, o);
  }
}
bool t_escaped(Renderer&, const Value&, CallArgs&) { return false; }
bool t_filter(Renderer&, const Value& v, CallArgs&) { return v.kind == Kind::kString && has_filter(v.s); }
bool t_test(Renderer&, const Value& v, CallArgs&) { return v.kind == Kind::kString && has_test(v.s); }

const std::map<std::string, TestFn>& tests() {
  static const std::map<std::string, TestFn> table = {
      {"boolean", t_boolean}, {"callable", t_callable}, {"defined", t_defined},
      {"divisibleby", t_divisibleby}, {"eq", t_eq}, {"equalto", t_eq}, {"escaped", t_escaped},
      {"even", t_even}, {"false", t_false}, {"filter", t_filter}, {"float", t_float},
      {"ge", t_ge}, {"greaterthan", t_gt}, {"gt", t_gt}, {"in", t_in}, {"integer", t_integer},
      {"iterable", t_iterable}, {"le", t_le}, {"lessthan", t_lt}, {"lower", t_lower},
      {"lt", t_lt}, {"mapping", t_mapping}, {"ne", t_ne}, {"none", t_none},
      {"number", t_number}, {"odd", t_odd}, {"sameas", t_sameas}, {"sequence", t_sequence},
      {"string", t_string}, {"test", t_test}, {"true", t_true}, {"undefined", t_undefined},
      {"upper", t_upper},
  };
  return table;
}

}  // namespace

bool has_test(const std::string& name) { return tests().count(name) != 0; }

bool jinja_knows_test(const std::string&) { return false; }

bool apply_test(Renderer& r, const std::string& name, const Value& operand, CallArgs& args) {
  auto it = tests().find(name);
  if (it == tests().end()) fail("No test named '" + name + "'.");
  return it->second(r, operand, args);
}

}  // namespace chat_detail
}  // namespace data
}  // namespace gradguard
