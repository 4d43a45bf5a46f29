// Chat-template evaluator: walks the parsed tree over Python-like values. Scoping follows
// jinja2: each for-loop iteration gets a fresh scope over the enclosing one (a `set` in the
// body is gone at the next iteration and after the loop; namespaces are the way out),
// `if` opens no scope, and macros run in a scope over the template's top level. Attribute
// and item access follow jinja2's sandbox (obj.name tries Python attributes such as
// dict.items before keys; obj[key] tries keys first), and a missing value becomes an
// Undefined that prints as "" but raises jinja2's message when used further. Every loop
// iteration, output append and macro call is counted against ChatTemplateOptions.
#include <cmath>
#include <unordered_map>

#include "chat_template_internal.h"
#include "gradguard/core/error.h"

namespace gradguard {
namespace data {
namespace chat_detail {

struct Scope {
  Scope* parent = nullptr;
  std::unordered_map<std::string, Value> vars;
  const Value* find(const std::string& name) const {
    for (const Scope* s = this; s; s = s->parent) {
      auto it = s->vars.find(name);
      if (it != s->vars.end()) return &it->second;
    }
    return nullptr;
  }
};

enum class Flow { kNormal, kBreak, kContinue };

class Renderer {
 public:
  explicit Renderer(const Template& t) : tmpl_(t), opts_(t.options) {}
  Renderer(const Renderer&) = delete;
  Renderer& operator=(const Renderer&) = delete;
  ~Renderer() {
    for (auto& ns : namespaces_) ns->entries.clear();
  }

  void track_namespace(const std::shared_ptr<DictData>& ns) { namespaces_.push_back(ns); }

  std::string run(Value context) {
    set_size_limit(opts_.max_output_bytes);
    for (auto& entry : context.dict->entries) root_.vars[entry.first.s] = entry.second;
    std::string out;
    out_ = &out;
    scope_ = &root_;
    exec_body(tmpl_.body);
    return out;
  }

  void check_size(int64_t bytes) const {
    if (bytes > opts_.max_output_bytes)
      fail("output or value larger than max_output_bytes (" + std::to_string(opts_.max_output_bytes) + " bytes)");
  }

 private:
  Flow exec_body(const Body& body) {
    for (const auto& node : body) {
      Flow flow = exec(*node);
      if (flow != Flow::kNormal) return flow;
    }
    return Flow::kNormal;
  }

  void emit(const std::string& s) {
    check_size(static_cast<int64_t>(out_->size() + s.size()));
    *out_ += s;
  }

  Flow exec(const Node& node) {
    try {
      return exec_node(node);
    } catch (EvalError& e) {
      if (e.line == 0) e.line = node.line;
      throw;
    }
  }

  std::string capture(const Body& body, Scope* scope) {
    std::string buffer;
    std::string* saved_out = out_;
    Scope* saved_scope = scope_;
    out_ = &buffer;
    scope_ = scope;
    try {
      exec_body(body);
    } catch (...) {
      out_ = saved_out;
      scope_ = saved_scope;
      throw;
    }
    out_ = saved_out;
    scope_ = saved_scope;
    return buffer;
  }

  Flow exec_node(const Node& node) {
    switch (node.kind) {
      case NodeKind::kText: emit(node.text); return Flow::kNormal;
      case NodeKind::kOutput: emit(to_str(eval(*node.expr))); return Flow::kNormal;
      case NodeKind::kIf:
        for (const auto& branch : node.branches)
          if (truthy(eval(*branch.first))) return exec_body(branch.second);
        return exec_body(node.else_body);
      case NodeKind::kFor: exec_for(node); return Flow::kNormal;
      case NodeKind::kSet: assign(node, eval(*node.expr)); return Flow::kNormal;
      case NodeKind::kSetBlock: {
        Value body = Value::string(capture(node.body, scope_));
        if (node.filter) {
          Scope temp{scope_, {}};
          temp.vars["\x01body"] = body;
          Scope* saved = scope_;
          scope_ = &temp;
          try {
            body = eval(*node.filter);
          } catch (...) {
            scope_ = saved;
            throw;
          }
          scope_ = saved;
        }
        assign(node, body);
        return Flow::kNormal;
      }
      case NodeKind::kMacro: define_macro(node); return Flow::kNormal;
      case NodeKind::kBreak: return Flow::kBreak;
      case NodeKind::kContinue: return Flow::kContinue;
      case NodeKind::kGeneration: return exec_body(node.body);
    }
    return Flow::kNormal;
  }

  void bind(Scope* scope, const Node& node, const Value& value) {
    if (!node.tuple_target) {
      scope->vars[node.targets[0]] = value;
      return;
    }
    std::vector<Value> items = iterate(value);
    size_t want = node.targets.size();
    if (items.size() > want) fail("too many values to unpack (expected " + std::to_string(want) + ")");
    if (items.size() < want)
      fail("not enough values to unpack (expected " + std::to_string(want) + ", got " +
           std::to_string(items.size()) + ")");
    for (size_t k = 0; k < want; ++k) scope->vars[node.targets[k]] = items[k];
  }

  void assign(const Node& node, const Value& value) {
    if (!node.ns_target) {
      bind(scope_, node, value);
      return;
    }
    const Value* ns = scope_->find(node.targets[0]);
    if (!ns) fail("'" + node.targets[0] + "' is undefined");
    if (ns->kind != Kind::kNamespace) fail("cannot assign attribute on non-namespace object");
    ns->dict->set(Value::string(node.targets[1]), value);
  }

  void count_iteration() {
    if (++iterations_ > opts_.max_loop_iterations)
      fail("more than max_loop_iterations (" + std::to_string(opts_.max_loop_iterations) +
           ") loop iterations");
  }

  void exec_for(const Node& node) {
    std::vector<Value> items = iterate(eval(*node.expr));
    if (node.filter) {
      std::vector<Value> kept;
      for (const Value& item : items) {
        count_iteration();
        Scope temp{scope_, {}};
        bind(&temp, node, item);
        Scope* saved = scope_;
        scope_ = &temp;
        bool keep;
        try {
          keep = truthy(eval(*node.filter));
        } catch (...) {
          scope_ = saved;
          throw;
        }
        scope_ = saved;
        if (keep) kept.push_back(item);
      }
      items = std::move(kept);
    }
    Scope* saved = scope_;
    if (items.empty()) {
      Scope scope{saved, {}};
      scope_ = &scope;
      try {
        exec_body(node.else_body);
      } catch (...) {
        scope_ = saved;
        throw;
      }
      scope_ = saved;
      return;
    }
    const int64_t n = static_cast<int64_t>(items.size());
    for (int64_t k = 0; k < n; ++k) {
      count_iteration();
      Scope scope{saved, {}};
      bind(&scope, node, items[static_cast<size_t>(k)]);
      scope.vars["loop"] = make_loop(items, k);
      scope_ = &scope;
      Flow flow;
      try {
        flow = exec_body(node.body);
      } catch (...) {
        scope_ = saved;
        throw;
      }
      scope_ = saved;
      if (flow == Flow::kBreak) break;
    }
  }

  static Value make_loop(const std::vector<Value>& items, int64_t k) {
    const int64_t n = static_cast<int64_t>(items.size());
    Value loop = Value::new_dict();
    auto& e = loop.dict->entries;
    e.emplace_back(Value::string("index"), Value::integer(k + 1));
    e.emplace_back(Value::string("index0"), Value::integer(k));
    e.emplace_back(Value::string("revindex"), Value::integer(n - k));
    e.emplace_back(Value::string("revindex0"), Value::integer(n - k - 1));
    e.emplace_back(Value::string("first"), Value::boolean(k == 0));
    e.emplace_back(Value::string("last"), Value::boolean(k == n - 1));
    e.emplace_back(Value::string("length"), Value::integer(n));
    e.emplace_back(Value::string("depth"), Value::integer(1));
    e.emplace_back(Value::string("depth0"), Value::integer(0));
    e.emplace_back(Value::string("previtem"),
                   k > 0 ? items[static_cast<size_t>(k - 1)] : Value::undefined("there is no previous item"));
    e.emplace_back(Value::string("nextitem"),
                   k + 1 < n ? items[static_cast<size_t>(k + 1)] : Value::undefined("there is no next item"));
    Value cycle;
    cycle.kind = Kind::kCallable;
    cycle.callable = std::make_shared<Callable>(Callable{"cycle", [k](Renderer&, CallArgs& args) -> Value {
      if (args.positional.empty()) fail("no items for cycling given");
      return args.positional[static_cast<size_t>(k) % args.positional.size()];
    }});
    e.emplace_back(Value::string("cycle"), cycle);
    return loop;
  }

  void define_macro(const Node& node) {
    Value macro;
    macro.kind = Kind::kCallable;
    const Node* def = &node;
    macro.callable = std::make_shared<Callable>(
        Callable{node.text, [def](Renderer& r, CallArgs& args) { return r.call_macro(*def, args); }});
    scope_->vars[node.text] = macro;
  }

 public:
  Value call_macro(const Node& def, CallArgs& args) {
    if (args.positional.size() > def.params.size())
      fail("macro '" + def.text + "' takes not more than " + std::to_string(def.params.size()) +
           " argument(s)");
    if (++depth_ > opts_.max_depth) fail("macro calls nest deeper than max_depth (" + std::to_string(opts_.max_depth) + ")");
    Scope scope{&root_, {}};
    for (const auto& kw : args.keyword) {
      bool known = false;
      for (const auto& p : def.params) known = known || p == kw.first;
      if (!known) fail("macro '" + def.text + "' takes no keyword argument '" + kw.first + "'");
    }
    Scope* saved = scope_;
    scope_ = &scope;
    std::string result;
    try {
      for (size_t k = 0; k < def.params.size(); ++k) {
        const Value* given = find_arg(args, k, def.params[k].c_str());
        if (given) scope.vars[def.params[k]] = *given;
        else if (def.defaults[k]) scope.vars[def.params[k]] = eval(*def.defaults[k]);
        else scope.vars[def.params[k]] = Value::undefined("parameter '" + def.params[k] + "' was not provided");
      }
      result = capture(def.body, &scope);
    } catch (...) {
      scope_ = saved;
      --depth_;
      throw;
    }
    scope_ = saved;
    --depth_;
    return Value::string(std::move(result));
  }

  Value eval(const Expr& e);

 private:
  Value lookup(const std::string& name) {
    if (const Value* v = scope_->find(name)) return *v;
    Value global = make_global(name);
    if (!global.is_undefined()) return global;
    return Value::undefined("'" + name + "' is undefined");
  }

  Value eval_call(const Expr& e) {
    Value callee = eval(*e.args[0]);
    CallArgs args = eval_args(e);
    return call_value(*this, callee, args);
  }

  CallArgs eval_args(const Expr& e) {
    CallArgs args;
    for (size_t k = 1; k < e.args.size(); ++k) args.positional.push_back(eval(*e.args[k]));
    for (const auto& kw : e.kwargs) args.keyword.emplace_back(kw.first, eval(*kw.second));
    return args;
  }


  const Template& tmpl_;
  const ChatTemplateOptions& opts_;
  Scope root_;
  Scope* scope_ = nullptr;
  std::string* out_ = nullptr;
  int64_t iterations_ = 0;
  int depth_ = 0;
  std::vector<std::shared_ptr<DictData>> namespaces_;  // [creation order]
};

void check_size(Renderer& r, int64_t bytes) { r.check_size(bytes); }
void track_namespace(Renderer& r, const std::shared_ptr<DictData>& ns) { r.track_namespace(ns); }

Value Renderer::eval(const Expr& e) {
  switch (e.kind) {
    case ExprKind::kLiteral: return e.literal;
    case ExprKind::kName: return lookup(e.name);
    case ExprKind::kList:
    case ExprKind::kTuple: {
      std::vector<Value> items;
      for (const auto& arg : e.args) items.push_back(eval(*arg));
      return Value::new_list(std::move(items), e.kind == ExprKind::kTuple ? SeqKind::kTuple : SeqKind::kList);
    }
    case ExprKind::kDict: {
      Value dict = Value::new_dict();
      for (size_t k = 0; k + 1 < e.args.size(); k += 2) dict.dict->set(eval(*e.args[k]), eval(*e.args[k + 1]));
      return dict;
    }
    case ExprKind::kGetAttr: return getattr(eval(*e.args[0]), e.name);
    case ExprKind::kGetItem: {
      Value object = eval(*e.args[0]);
      return getitem(object, eval(*e.args[1]));
    }
    case ExprKind::kSlice: {
      Value object = eval(*e.args[0]);
      Value parts[3] = {Value::none(), Value::none(), Value::none()};
      for (size_t k = 0; k < 3; ++k)
        if (e.args[k + 1]) parts[k] = eval(*e.args[k + 1]);
      return slice_value(object, parts);
    }
    case ExprKind::kCall: return eval_call(e);
    case ExprKind::kFilter: {
      Value operand = eval(*e.args[0]);
      CallArgs args = eval_args(e);
      return apply_filter(*this, e.name, operand, args);
    }
    case ExprKind::kTest: {
      Value operand = eval(*e.args[0]);
      CallArgs args = eval_args(e);
      return Value::boolean(apply_test(*this, e.name, operand, args));
    }
    case ExprKind::kNeg:
    case ExprKind::kPos: {
      Value v = eval(*e.args[0]);
      if (v.is_undefined()) fail(v.s);
      if (!v.is_number())
        fail(std::string("bad operand type for unary ") + (e.kind == ExprKind::kNeg ? "-" : "+") + ": '" +
             type_name(v) + "'");
      if (e.kind == ExprKind::kPos) return v.kind == Kind::kBool ? Value::integer(v.b) : v;
      if (v.kind == Kind::kFloat) return Value::number(-v.f);
      int64_t x = v.kind == Kind::kBool ? v.b : v.i;
      if (x == INT64_MIN) fail("integer overflow (Python would use a big integer)");
      return Value::integer(-x);
    }
    case ExprKind::kNot: return Value::boolean(!truthy(eval(*e.args[0])));
    case ExprKind::kBinary: {
      Value a = eval(*e.args[0]);
      return binary_op(*this, e.name, a, eval(*e.args[1]));
    }
    case ExprKind::kConcat: {
      std::string out;
      for (const auto& arg : e.args) {
        out += to_str(eval(*arg));
        check_size(static_cast<int64_t>(out.size()));
      }
      return Value::string(std::move(out));
    }
    case ExprKind::kCompare: {
      Value left = eval(*e.args[0]);
      for (size_t k = 0; k < e.ops.size(); ++k) {
        Value right = eval(*e.args[k + 1]);
        if (!compare_op(e.ops[k], left, right)) return Value::boolean(false);
        left = std::move(right);
      }
      return Value::boolean(true);
    }
    case ExprKind::kAnd: {
      Value left = eval(*e.args[0]);
      return truthy(left) ? eval(*e.args[1]) : left;
    }
    case ExprKind::kOr: {
      Value left = eval(*e.args[0]);
      return truthy(left) ? left : eval(*e.args[1]);
    }
    case ExprKind::kCond:
      if (truthy(eval(*e.args[1]))) return eval(*e.args[0]);
      if (e.args.size() > 2) return eval(*e.args[2]);
      return Value::undefined("the inline if-expression evaluated to false and no else section was defined.");
  }
  return Value();
}

}  // namespace chat_detail

// ---- public API --------------------------------------------------------------------------

void ChatTemplateOptions::validate() const {
  if (max_output_bytes <= 0) throw bad_input("chat_template.max_output_bytes", "must be > 0");
  if (max_loop_iterations <= 0) throw bad_input("chat_template.max_loop_iterations", "must be > 0");
  if (max_depth <= 0) throw bad_input("chat_template.max_depth", "must be > 0");
}

namespace {
// Whether `e` (a for loop's iterable, through any filters applied to it) reads an
// attribute or item named "content": `message.content`, `m['content'] | selectattr(...)`.
bool reads_content(const chat_detail::Expr* e) {
  using chat_detail::ExprKind;
  if (e == nullptr) return false;
  if (e->kind == ExprKind::kGetAttr) return e->name == "content";
  if (e->kind == ExprKind::kGetItem && e->args.size() > 1 && e->args[1] && e->args[1]->kind == ExprKind::kLiteral &&
      e->args[1]->literal.kind == chat_detail::Kind::kString && e->args[1]->literal.s == "content")
    return true;
  if (e->kind == ExprKind::kFilter && !e->args.empty()) return reads_content(e->args[0].get());
  return false;
}

bool loops_over_content(const chat_detail::Body& body) {
  for (const auto& n : body) {
    if (n->kind == chat_detail::NodeKind::kFor && reads_content(n->expr.get())) return true;
    if (loops_over_content(n->body) || loops_over_content(n->else_body)) return true;
    for (const auto& [cond, branch] : n->branches)
      if (loops_over_content(branch)) return true;
  }
  return false;
}
}  // namespace

ChatTemplate ChatTemplate::parse(const std::string& source, const std::string& where,
                                 const ChatTemplateOptions& options) {
  options.validate();
  auto t = std::make_shared<chat_detail::Template>();
  t->where = where;
  t->options = options;
  t->body = chat_detail::parse_tokens(chat_detail::lex(source, where), where, options.max_depth);
  t->iterates_content = loops_over_content(t->body);
  return ChatTemplate(std::move(t));
}

const std::string& ChatTemplate::where() const { return impl_->where; }

bool ChatTemplate::iterates_message_content() const { return impl_->iterates_content; }

std::string ChatTemplate::render(const nlohmann::ordered_json& context) const {
  return render_value(chat_detail::from_json(context));
}

std::string ChatTemplate::render(const nlohmann::json& context) const {
  return render_value(chat_detail::from_json(context));
}

std::string ChatTemplate::render_value(const chat_detail::Value& context) const {
  if (context.kind == chat_detail::Kind::kNone) return render_value(chat_detail::Value::new_dict());
  if (context.kind != chat_detail::Kind::kDict)
    throw bad_input(impl_->where, "render context must be a JSON object (or null for no variables)");
  try {
    chat_detail::Renderer renderer(*impl_);
    return renderer.run(context);
  } catch (const chat_detail::EvalError& e) {
    std::string at = "line " + std::to_string(e.line) + ": ";
    if (e.raised) throw bad_input(impl_->where, at + "raise_exception: " + e.message);
    throw bad_input(impl_->where, at + e.message);
  }
}

}  // namespace data
}  // namespace gradguard
