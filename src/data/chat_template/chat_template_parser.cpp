// Chat-template parser: tokens -> statement and expression trees, following jinja2's
// grammar and operator precedence (lowest first): `x if c else y`, or, and, not,
// comparisons (==, !=, <, <=, >, >=, in, not in; chained), + -, ~, * / // %, **, unary
// - +, then primary with postfix .attr [item] [a:b:c] (call) and the filter chain
// `| f(args)` / `is [not] test args`. Note jinja2's quirks kept here: `~` binds tighter
// than `+`, `**` is left-associative, and a unary minus takes the filter chain after it
// (`-x|abs` is abs(-x)). Unknown filters, tests and tags are errors now, not at render.
#include "chat_template_internal.h"
#include "gradguard/core/error.h"

namespace gradguard {
namespace data {
namespace chat_detail {
namespace {

const char* const kBodyVar = "\x01body";  // operand of a `{% set x | filter %}` chain

class Parser {
 public:
  Parser(const std::vector<Token>& tokens, const std::string& where, int max_depth)
      : toks_(tokens), where_(where), max_depth_(max_depth) {}

  Body parse_all() {
    std::string end;
    Body body = parse_body({}, &end, 0);
    return body;
  }

 private:
  struct DepthGuard {
    Parser* p;
    explicit DepthGuard(Parser* parser) : p(parser) {
      if (++p->depth_ > p->max_depth_)
        p->error(p->cur(), "template nests deeper than " + std::to_string(p->max_depth_) + " levels");
    }
    ~DepthGuard() { --p->depth_; }
  };

  [[noreturn]] void error(const Token& at, const std::string& what) const {
    throw bad_input(where_, "line " + std::to_string(at.line) + ":" + std::to_string(at.col) + ": " + what);
  }
  const Token& cur() const { return toks_[pos_]; }
  const Token& peek(size_t ahead = 1) const { return toks_[std::min(pos_ + ahead, toks_.size() - 1)]; }
  bool is_op(const char* op) const { return cur().kind == TokKind::kOp && cur().text == op; }
  bool is_name(const char* name) const { return cur().kind == TokKind::kName && cur().text == name; }
  const Token& next() {
    const Token& t = toks_[pos_];
    if (pos_ + 1 < toks_.size()) ++pos_;
    return t;
  }
  static std::string describe(const Token& t) {
    switch (t.kind) {
      case TokKind::kVarEnd: return "'}}'";
      case TokKind::kBlockEnd: return "'%}'";
      case TokKind::kEof: return "end of template";
      case TokKind::kString: return "string literal";
      default: return "'" + t.text + "'";
    }
  }
  void expect_op(const char* op) {
    if (!is_op(op)) error(cur(), std::string("expected '") + op + "', got " + describe(cur()));
    next();
  }
  void expect_block_end() {
    if (cur().kind != TokKind::kBlockEnd) error(cur(), "expected '%}', got " + describe(cur()));
    next();
  }
  std::string expect_name() {
    if (cur().kind != TokKind::kName) error(cur(), "expected a name, got " + describe(cur()));
    return next().text;
  }

  // Statements until one of `ends` (a tag name) or the end of the template; `end` gets
  // the tag found (its name consumed, the rest of the tag not).
  Body parse_body(const std::vector<std::string>& ends, std::string* end, int loops) {
    DepthGuard guard(this);
    Body body;
    while (true) {
      const Token& t = cur();
      if (t.kind == TokKind::kEof) {
        if (ends.empty()) return body;
        error(t, "unexpected end of template: expected " + list_tags(ends) + " to close the block");
      }
      if (t.kind == TokKind::kText) {
        auto node = std::make_unique<Node>();
        node->kind = NodeKind::kText;
        node->line = t.line;
        node->text = next().text;
        body.push_back(std::move(node));
      } else if (t.kind == TokKind::kVarBegin) {
        next();
        auto node = std::make_unique<Node>();
        node->kind = NodeKind::kOutput;
        node->line = t.line;
        node->expr = parse_tuple(true);
        if (cur().kind != TokKind::kVarEnd) error(cur(), "expected '}}', got " + describe(cur()));
        next();
        body.push_back(std::move(node));
      } else if (t.kind == TokKind::kBlockBegin) {
        next();
        const Token& name_tok = cur();
        std::string name = expect_name();
        for (const auto& e : ends) {
          if (name == e) {
            *end = name;
            return body;
          }
        }
        body.push_back(parse_statement(name, name_tok, ends, loops));
      } else {
        error(t, "unexpected " + describe(t));
      }
    }
  }

  static std::string list_tags(const std::vector<std::string>& tags) {
    std::string out;
    for (size_t k = 0; k < tags.size(); ++k) out += (k ? " or '{% " : "'{% ") + tags[k] + " %}'";
    return out;
  }

  std::unique_ptr<Node> parse_statement(const std::string& name, const Token& at,
                                        const std::vector<std::string>& ends, int loops) {
    auto node = std::make_unique<Node>();
    node->line = at.line;
    std::string end;
    if (name == "if") {
      node->kind = NodeKind::kIf;
      ExprPtr cond = parse_tuple(true);
      while (true) {
        expect_block_end();
        Body body = parse_body({"elif", "else", "endif"}, &end, loops);
        node->branches.emplace_back(std::move(cond), std::move(body));
        if (end == "elif") {
          cond = parse_tuple(true);
        } else if (end == "else") {
          expect_block_end();
          node->else_body = parse_body({"endif"}, &end, loops);
          break;
        } else {
          break;
        }
      }
      expect_block_end();
    } else if (name == "for") {
      node->kind = NodeKind::kFor;
      parse_target(node.get(), false);
      if (!is_name("in")) error(cur(), "expected 'in' in for loop, got " + describe(cur()));
      next();
      node->expr = parse_tuple(false);
      if (is_name("if")) {
        next();
        node->filter = parse_expression(true);
      }
      if (is_name("recursive")) error(cur(), "recursive for loops are not supported");
      expect_block_end();
      node->body = parse_body({"endfor", "else"}, &end, loops + 1);
      if (end == "else") {
        expect_block_end();
        node->else_body = parse_body({"endfor"}, &end, loops);
      }
      expect_block_end();
    } else if (name == "set") {
      parse_target(node.get(), true);
      if (is_op("=")) {
        next();
        node->kind = NodeKind::kSet;
        node->expr = parse_tuple(true);
        expect_block_end();
      } else {
        if (node->ns_target || node->tuple_target) error(cur(), "expected '=' after the set target");
        node->kind = NodeKind::kSetBlock;
        if (is_op("|")) {
          auto operand = std::make_unique<Expr>();
          operand->kind = ExprKind::kName;
          operand->name = kBodyVar;
          operand->line = at.line;
          node->filter = parse_filter_expr(std::move(operand));
        }
        expect_block_end();
        node->body = parse_body({"endset"}, &end, loops);
        expect_block_end();
      }
    } else if (name == "macro") {
      node->kind = NodeKind::kMacro;
      node->text = expect_name();
      expect_op("(");
      while (!is_op(")")) {
        if (!node->params.empty()) expect_op(",");
        if (is_op(")")) break;
        node->params.push_back(expect_name());
        if (is_op("=")) {
          next();
          node->defaults.push_back(parse_expression(true));
        } else {
          node->defaults.push_back(nullptr);
        }
      }
      next();
      expect_block_end();
      node->body = parse_body({"endmacro"}, &end, 0);
      if (cur().kind == TokKind::kName && cur().text == node->text) next();
      expect_block_end();
    } else if (name == "break" || name == "continue") {
      if (loops == 0) error(at, "'" + name + "' outside of a for loop");
      node->kind = name == "break" ? NodeKind::kBreak : NodeKind::kContinue;
      expect_block_end();
    } else if (name == "generation") {
      node->kind = NodeKind::kGeneration;
      expect_block_end();
      node->body = parse_body({"endgeneration"}, &end, loops);
      expect_block_end();
    } else if (name == "call" || name == "include" || name == "extends" || name == "block" ||
               name == "import" || name == "from" || name == "with" || name == "filter" ||
               name == "autoescape") {
      error(at, "'{% " + name + " %}' is not supported in chat templates");
    } else if (name.rfind("end", 0) == 0 || name == "elif" || name == "else") {
      error(at, "unexpected '{% " + name + " %}'" +
                    (ends.empty() ? std::string() : "; expected " + list_tags(ends)));
    } else {
      error(at, "unknown tag '" + name + "'");
    }
    return node;
  }

  // Names for `for` / `set`: `x`, `a, b`, `(a, b)`, or (set only) `ns.attr`.
  void parse_target(Node* node, bool allow_ns) {
    bool paren = is_op("(");
    if (paren) next();
    node->targets.push_back(expect_name());
    if (allow_ns && !paren && is_op(".")) {
      next();
      node->targets.push_back(expect_name());
      node->ns_target = true;
      return;
    }
    while (is_op(",")) {
      next();
      node->tuple_target = true;
      if (cur().kind != TokKind::kName) break;
      node->targets.push_back(expect_name());
    }
    if (paren) {
      expect_op(")");
      node->tuple_target = true;
    }
  }

  ExprPtr make(ExprKind kind, const Token& at) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = at.line;
    return e;
  }

  // Expression or bare tuple `a, b` (print statements, set values, for iterables).
  ExprPtr parse_tuple(bool with_cond) {
    const Token& at = cur();
    ExprPtr first = parse_expression(with_cond);
    if (!is_op(",")) return first;
    auto tuple = make(ExprKind::kTuple, at);
    tuple->args.push_back(std::move(first));
    while (is_op(",")) {
      next();
      if (cur().kind == TokKind::kVarEnd || cur().kind == TokKind::kBlockEnd || is_op(")")) break;
      tuple->args.push_back(parse_expression(with_cond));
    }
    return tuple;
  }

  ExprPtr parse_expression(bool with_cond) {
    DepthGuard guard(this);
    if (!with_cond) return parse_or();
    const Token& at = cur();
    ExprPtr expr = parse_or();
    while (is_name("if")) {
      next();
      auto cond = make(ExprKind::kCond, at);
      cond->args.push_back(std::move(expr));
      cond->args.push_back(parse_or());
      if (is_name("else")) {
        next();
        cond->args.push_back(parse_expression(true));
      }
      expr = std::move(cond);
    }
    return expr;
  }

  ExprPtr parse_or() {
    ExprPtr left = parse_and();
    while (is_name("or")) {
      auto e = make(ExprKind::kOr, next());
      e->args.push_back(std::move(left));
      e->args.push_back(parse_and());
      left = std::move(e);
    }
    return left;
  }

  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    while (is_name("and")) {
      auto e = make(ExprKind::kAnd, next());
      e->args.push_back(std::move(left));
      e->args.push_back(parse_not());
      left = std::move(e);
    }
    return left;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      DepthGuard guard(this);
      auto e = make(ExprKind::kNot, next());
      e->args.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    const Token& at = cur();
    ExprPtr left = parse_math1();
    ExprPtr cmp;
    while (true) {
      std::string op;
      if (cur().kind == TokKind::kOp && (cur().text == "==" || cur().text == "!=" || cur().text == "<" ||
                                         cur().text == ">" || cur().text == "<=" || cur().text == ">=")) {
        op = next().text;
      } else if (is_name("in")) {
        next();
        op = "in";
      } else if (is_name("not") && peek().kind == TokKind::kName && peek().text == "in") {
        next();
        next();
        op = "not in";
      } else {
        break;
      }
      if (!cmp) {
        cmp = make(ExprKind::kCompare, at);
        cmp->args.push_back(std::move(left));
      }
      cmp->ops.push_back(op);
      cmp->args.push_back(parse_math1());
    }
    return cmp ? std::move(cmp) : std::move(left);
  }

  ExprPtr binary(const std::string& op, ExprPtr left, ExprPtr right, const Token& at) {
    auto e = make(ExprKind::kBinary, at);
    e->name = op;
    e->args.push_back(std::move(left));
    e->args.push_back(std::move(right));
    return e;
  }

  ExprPtr parse_math1() {
    ExprPtr left = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token& at = next();
      left = binary(at.text, std::move(left), parse_concat(), at);
    }
    return left;
  }

  ExprPtr parse_concat() {
    ExprPtr left = parse_math2();
    if (!is_op("~")) return left;
    auto e = make(ExprKind::kConcat, cur());
    e->args.push_back(std::move(left));
    while (is_op("~")) {
      next();
      e->args.push_back(parse_math2());
    }
    return e;
  }

  ExprPtr parse_math2() {
    ExprPtr left = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& at = next();
      left = binary(at.text, std::move(left), parse_pow(), at);
    }
    return left;
  }

  ExprPtr parse_pow() {
    ExprPtr left = parse_unary(true);
    while (is_op("**")) {
      const Token& at = next();
      left = binary("**", std::move(left), parse_unary(true), at);
    }
    return left;
  }

  ExprPtr parse_unary(bool with_filter) {
    DepthGuard guard(this);
    ExprPtr node;
    if (is_op("-") || is_op("+")) {
      ExprKind kind = is_op("-") ? ExprKind::kNeg : ExprKind::kPos;
      node = make(kind, next());
      node->args.push_back(parse_unary(false));
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_expr(std::move(node));
    return node;
  }

  ExprPtr parse_primary() {
    const Token& t = cur();
    if (t.kind == TokKind::kName) {
      next();
      const std::string& n = t.text;
      auto e = make(ExprKind::kLiteral, t);
      if (n == "true" || n == "True") e->literal = Value::boolean(true);
      else if (n == "false" || n == "False") e->literal = Value::boolean(false);
      else if (n == "none" || n == "None") e->literal = Value::none();
      else {
        e->kind = ExprKind::kName;
        e->name = n;
      }
      return e;
    }
    if (t.kind == TokKind::kString) {
      std::string s;
      while (cur().kind == TokKind::kString) s += next().text;
      auto e = make(ExprKind::kLiteral, t);
      e->literal = Value::string(std::move(s));
      return e;
    }
    if (t.kind == TokKind::kInt || t.kind == TokKind::kFloat) {
      next();
      auto e = make(ExprKind::kLiteral, t);
      e->literal = t.kind == TokKind::kInt ? Value::integer(t.int_value) : Value::number(t.float_value);
      return e;
    }
    if (is_op("(")) {
      next();
      if (is_op(")")) {
        next();
        return make(ExprKind::kTuple, t);
      }
      ExprPtr first = parse_expression(true);
      if (is_op(")")) {
        next();
        return first;
      }
      auto tuple = make(ExprKind::kTuple, t);
      tuple->args.push_back(std::move(first));
      while (is_op(",")) {
        next();
        if (is_op(")")) break;
        tuple->args.push_back(parse_expression(true));
      }
      expect_op(")");
      return tuple;
    }
    if (is_op("[")) {
      next();
      auto list = make(ExprKind::kList, t);
      while (!is_op("]")) {
        if (!list->args.empty()) expect_op(",");
        if (is_op("]")) break;
        list->args.push_back(parse_expression(true));
      }
      next();
      return list;
    }
    if (is_op("{")) {
      next();
      auto dict = make(ExprKind::kDict, t);
      while (!is_op("}")) {
        if (!dict->args.empty()) expect_op(",");
        if (is_op("}")) break;
        dict->args.push_back(parse_expression(true));
        expect_op(":");
        dict->args.push_back(parse_expression(true));
      }
      next();
      return dict;
    }
    error(t, "unexpected " + describe(t) + " in expression");
  }

  ExprPtr parse_postfix(ExprPtr node) {
    while (true) {
      const Token& at = cur();
      if (is_op(".")) {
        next();
        if (cur().kind == TokKind::kInt) {
          auto e = make(ExprKind::kGetItem, at);
          e->args.push_back(std::move(node));
          auto key = make(ExprKind::kLiteral, cur());
          key->literal = Value::integer(next().int_value);
          e->args.push_back(std::move(key));
          node = std::move(e);
          continue;
        }
        auto e = make(ExprKind::kGetAttr, at);
        e->name = expect_name();
        e->args.push_back(std::move(node));
        node = std::move(e);
      } else if (is_op("[")) {
        next();
        node = parse_subscript(std::move(node), at);
        expect_op("]");
      } else if (is_op("(")) {
        auto e = make(ExprKind::kCall, at);
        e->args.push_back(std::move(node));
        parse_call_args(e.get());
        node = std::move(e);
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr object, const Token& at) {
    ExprPtr parts[3];
    int part = 0;
    bool slice = false;
    while (!is_op("]")) {
      if (is_op(":")) {
        next();
        slice = true;
        if (++part > 2) error(cur(), "too many ':' in slice");
        continue;
      }
      if (parts[part]) error(cur(), "expected ']' or ':', got " + describe(cur()));
      parts[part] = parse_expression(true);
    }
    if (!slice) {
      if (!parts[0]) error(cur(), "empty subscript");
      auto e = make(ExprKind::kGetItem, at);
      e->args.push_back(std::move(object));
      e->args.push_back(std::move(parts[0]));
      return e;
    }
    auto e = make(ExprKind::kSlice, at);
    e->args.push_back(std::move(object));
    for (auto& p : parts) e->args.push_back(std::move(p));
    return e;
  }

  // `(a, b, key=c)` appended to e->args / e->kwargs.
  void parse_call_args(Expr* e) {
    expect_op("(");
    bool first = true;
    while (!is_op(")")) {
      if (!first) expect_op(",");
      first = false;
      if (is_op(")")) break;
      if (is_op("*") || is_op("**")) error(cur(), "*args and **kwargs in calls are not supported");
      if (cur().kind == TokKind::kName && peek().kind == TokKind::kOp && peek().text == "=") {
        std::string key = next().text;
        next();
        e->kwargs.emplace_back(key, parse_expression(true));
      } else {
        if (!e->kwargs.empty()) error(cur(), "positional argument after keyword argument");
        e->args.push_back(parse_expression(true));
      }
    }
    next();
  }

  ExprPtr parse_filter_expr(ExprPtr node) {
    while (true) {
      const Token& at = cur();
      if (is_op("|")) {
        next();
        auto e = make(ExprKind::kFilter, at);
        const Token& name_tok = cur();
        e->name = expect_name();
        if (!has_filter(e->name)) {
          error(name_tok, jinja_knows_filter(e->name)
                              ? "filter '" + e->name + "' is not supported in chat templates"
                              : "no filter named '" + e->name + "'");
        }
        e->args.push_back(std::move(node));
        if (is_op("(")) parse_call_args(e.get());
        node = std::move(e);
      } else if (is_name("is")) {
        next();
        bool negated = false;
        if (is_name("not")) {
          next();
          negated = true;
        }
        auto e = make(ExprKind::kTest, at);
        const Token& name_tok = cur();
        e->name = expect_name();
        if (!has_test(e->name)) {
          error(name_tok, jinja_knows_test(e->name)
                              ? "test '" + e->name + "' is not supported in chat templates"
                              : "no test named '" + e->name + "'");
        }
        e->args.push_back(std::move(node));
        if (is_op("(")) {
          parse_call_args(e.get());
        } else if ((cur().kind == TokKind::kName && !is_name("else") && !is_name("or") && !is_name("and")) ||
                   cur().kind == TokKind::kString || cur().kind == TokKind::kInt ||
                   cur().kind == TokKind::kFloat || is_op("(") || is_op("[") || is_op("{")) {
          e->args.push_back(parse_postfix(parse_primary()));
        }
        node = std::move(e);
        if (negated) {
          auto n = make(ExprKind::kNot, at);
          n->args.push_back(std::move(node));
          node = std::move(n);
        }
      } else if (is_op("(")) {
        auto e = make(ExprKind::kCall, at);
        e->args.push_back(std::move(node));
        parse_call_args(e.get());
        node = std::move(e);
      } else {
        return node;
      }
    }
  }

  const std::vector<Token>& toks_;
  const std::string& where_;
  int max_depth_;
  int depth_ = 0;
  size_t pos_ = 0;
};

}  // namespace

Body parse_tokens(const std::vector<Token>& tokens, const std::string& where, int max_depth) {
  return Parser(tokens, where, max_depth).parse_all();
}

}  // namespace chat_detail
}  // namespace data
}  // namespace gradguard
