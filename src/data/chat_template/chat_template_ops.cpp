// Python operators and element access for chat-template values: obj.name and obj[key]
// as jinja2's sandbox resolves them (obj.name tries Python attributes such as dict.items
// before keys, obj[key] tries keys first; a miss is an Undefined carrying jinja2's message),
// slicing with Python's index adjustment, arithmetic with Python's int/float rules (floor
// division and modulo take the divisor's sign; int overflow fails instead of growing), and
// comparisons including `in`. Strings and lists built here are checked against
// max_output_bytes.
#include <cmath>

#include "chat_template_internal.h"

namespace gradguard {
namespace data {
namespace chat_detail {

Value call_value(Renderer& r, const Value& callee, CallArgs& args) {
  if (callee.kind == Kind::kCallable) return callee.callable->fn(r, args);
  if (callee.is_undefined()) fail(callee.s);
  fail("'" + type_name(callee) + "' object is not callable");
}

namespace {

std::string object_type_repr(const Value& v) {
  if (v.kind == Kind::kNone) return "None";
  if (v.kind == Kind::kNamespace) return "jinja2.utils.Namespace object";
  return type_name(v) + " object";
}

Value missing_attr(const Value& object, const std::string& name) {
  return Value::undefined("'" + object_type_repr(object) + "' has no attribute '" + name + "'");
}

Value missing_item(const Value& object, const Value& key) {
  if (key.kind == Kind::kString) return missing_attr(object, key.s);
  return Value::undefined(object_type_repr(object) + " has no element " + repr(key));
}

int64_t index_of(const Value& key) { return key.kind == Kind::kBool ? (key.b ? 1 : 0) : key.i; }

}  // namespace

Value getattr(const Value& object, const std::string& name) {
  if (object.is_undefined()) fail(object.s);
  if (object.kind == Kind::kNamespace) {
    const Value* v = object.dict->find(Value::string(name));
    return v ? *v : missing_attr(object, name);
  }
  Value method = get_method(object, name);
  if (!method.is_undefined()) return method;
  if (object.kind == Kind::kDict) {
    const Value* v = object.dict->find(Value::string(name));
    if (v) return *v;
  }
  return method.s.empty() ? missing_attr(object, name) : method;
}

Value getitem(const Value& object, const Value& key) {
  if (object.is_undefined()) fail(object.s);
  if (object.kind == Kind::kDict) {
    const Value* v = object.dict->find(key);
    if (v) return *v;
  } else if ((object.kind == Kind::kList && object.list->seq != SeqKind::kGenerator) ||
             object.kind == Kind::kString) {
    if (key.kind == Kind::kInt || key.kind == Kind::kBool) {
      int64_t k = index_of(key);
      if (object.kind == Kind::kList) {
        int64_t n = static_cast<int64_t>(object.list->data.size());
        if (k < 0) k += n;
        if (k >= 0 && k < n) return object.list->data[static_cast<size_t>(k)];
      } else {
        std::vector<uint32_t> cps = decode_utf8(object.s);
        int64_t n = static_cast<int64_t>(cps.size());
        if (k < 0) k += n;
        if (k >= 0 && k < n) return Value::string(encode_utf8(cps, static_cast<size_t>(k), static_cast<size_t>(k) + 1));
      }
    }
  }
  if (key.kind == Kind::kString) {
    if (object.kind == Kind::kNamespace) return missing_item(object, key);
    Value method = get_method(object, key.s);
    if (!method.is_undefined() || !method.s.empty()) return method;
  }
  return missing_item(object, key);
}

Value slice_value(const Value& object, const Value parts[3]) {
  if (object.is_undefined()) fail(object.s);
  int64_t bounds[3] = {0, 0, 1};
  bool given[3] = {false, false, false};
  for (int k = 0; k < 3; ++k) {
    const Value& v = parts[k];
    if (v.kind == Kind::kNone) continue;
    if (v.kind != Kind::kInt && v.kind != Kind::kBool)
      fail("slice indices must be integers or None or have an __index__ method");
    bounds[k] = index_of(v);
    given[k] = true;
  }
  int64_t step = given[2] ? bounds[2] : 1;
  if (step == 0) fail("slice step cannot be zero");
  bool is_string = object.kind == Kind::kString;
  if (!is_string && !(object.kind == Kind::kList && object.list->seq != SeqKind::kGenerator))
    fail("'" + type_name(object) + "' object is not subscriptable");
  std::vector<uint32_t> cps;
  if (is_string) cps = decode_utf8(object.s);
  const int64_t n = static_cast<int64_t>(is_string ? cps.size() : object.list->data.size());
  // Python's slice index adjustment.
  auto adjust = [&](int64_t v, bool present, int64_t dflt) {
    if (!present) return dflt;
    if (v < 0) {
      v += n;
      if (v < 0) v = step < 0 ? -1 : 0;
    } else if (v >= n) {
      v = step < 0 ? n - 1 : n;
    }
    return v;
  };
  int64_t start = adjust(bounds[0], given[0], step < 0 ? n - 1 : 0);
  int64_t stop = adjust(bounds[1], given[1], step < 0 ? -1 : n);
  std::vector<Value> items;
  std::string text;
  for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) {
    if (is_string) append_utf8(&text, cps[static_cast<size_t>(k)]);
    else items.push_back(object.list->data[static_cast<size_t>(k)]);
  }
  if (is_string) return Value::string(std::move(text));
  return Value::new_list(std::move(items), object.list->seq);
}

namespace {

[[noreturn]] void unsupported(const char* op, const Value& a, const Value& b) {
  if (a.is_undefined()) fail(a.s);
  if (b.is_undefined()) fail(b.s);
  fail(std::string("unsupported operand type(s) for ") + op + ": '" + type_name(a) + "' and '" +
       type_name(b) + "'");
}

int64_t as_int(const Value& v) { return v.kind == Kind::kBool ? (v.b ? 1 : 0) : v.i; }
bool is_intlike(const Value& v) { return v.kind == Kind::kInt || v.kind == Kind::kBool; }
[[noreturn]] void overflow() { fail("integer overflow (Python would use a big integer)"); }

Value repeat(Renderer& r, const Value& seq, int64_t times) {
  if (times < 0) times = 0;
  if (seq.kind == Kind::kString) {
    check_size(r, static_cast<int64_t>(seq.s.size()) * times);
    std::string out;
    for (int64_t k = 0; k < times; ++k) out += seq.s;
    return Value::string(std::move(out));
  }
  check_size(r, static_cast<int64_t>(seq.list->data.size()) * times * 16);
  std::vector<Value> items;
  for (int64_t k = 0; k < times; ++k) items.insert(items.end(), seq.list->data.begin(), seq.list->data.end());
  return Value::new_list(std::move(items), seq.list->seq);
}

}  // namespace

Value binary_op(Renderer& r, const std::string& op, const Value& a, const Value& b) {
  const bool ints = is_intlike(a) && is_intlike(b);
  const bool nums = a.is_number() && b.is_number();
  const bool list_a = a.kind == Kind::kList && a.list->seq != SeqKind::kGenerator;
  const bool list_b = b.kind == Kind::kList && b.list->seq != SeqKind::kGenerator;
  int64_t out = 0;
  if (op == "+") {
    if (ints) {
      if (__builtin_add_overflow(as_int(a), as_int(b), &out)) overflow();
      return Value::integer(out);
    }
    if (nums) return Value::number(as_double(a) + as_double(b));
    if (a.kind == Kind::kString && b.kind == Kind::kString) {
      check_size(r, static_cast<int64_t>(a.s.size() + b.s.size()));
      return Value::string(a.s + b.s);
    }
    if (list_a && list_b && a.list->seq == b.list->seq) {
      check_size(r, static_cast<int64_t>(a.list->data.size() + b.list->data.size()) * 16);
      std::vector<Value> items = a.list->data;
      items.insert(items.end(), b.list->data.begin(), b.list->data.end());
      return Value::new_list(std::move(items), a.list->seq);
    }
    if (a.kind == Kind::kString && !b.is_undefined())
      fail("can only concatenate str (not \"" + type_name(b) + "\") to str");
    if (list_a && !b.is_undefined())
      fail("can only concatenate " + type_name(a) + " (not \"" + type_name(b) + "\") to " + type_name(a));
    unsupported("+", a, b);
  }
  if (op == "-") {
    if (ints) {
      if (__builtin_sub_overflow(as_int(a), as_int(b), &out)) overflow();
      return Value::integer(out);
    }
    if (nums) return Value::number(as_double(a) - as_double(b));
    unsupported("-", a, b);
  }
  if (op == "*") {
    if (ints) {
      if (__builtin_mul_overflow(as_int(a), as_int(b), &out)) overflow();
      return Value::integer(out);
    }
    if (nums) return Value::number(as_double(a) * as_double(b));
    if ((a.kind == Kind::kString || list_a) && is_intlike(b)) return repeat(r, a, as_int(b));
    if ((b.kind == Kind::kString || list_b) && is_intlike(a)) return repeat(r, b, as_int(a));
    unsupported("*", a, b);
  }
  if (op == "/") {
    if (!nums) unsupported("/", a, b);
    if (as_double(b) == 0) fail("division by zero");
    return Value::number(as_double(a) / as_double(b));
  }
  if (op == "//" || op == "%") {
    if (!nums) {
      if (op == "%" && a.kind == Kind::kString) fail("'%' string formatting is not supported");
      unsupported(op.c_str(), a, b);
    }
    if (ints) {
      int64_t x = as_int(a), y = as_int(b);
      if (y == 0) fail("integer division or modulo by zero");
      if (x == INT64_MIN && y == -1) overflow();
      int64_t q = x / y, m = x % y;
      if (m != 0 && ((m < 0) != (y < 0))) {
        --q;
        m += y;
      }
      return Value::integer(op == "//" ? q : m);
    }
    // Python's float_divmod: fmod, then move the remainder to the divisor's sign.
    double x = as_double(a), y = as_double(b);
    if (y == 0) fail(op == "//" ? "float floor division by zero" : "float modulo");
    double m = std::fmod(x, y);
    double div = (x - m) / y;
    if (m != 0) {
      if ((y < 0) != (m < 0)) {
        m += y;
        div -= 1.0;
      }
    } else {
      m = std::copysign(0.0, y);
    }
    if (op == "%") return Value::number(m);
    double floor_div;
    if (div != 0) {
      floor_div = std::floor(div);
      if (div - floor_div > 0.5) floor_div += 1.0;
    } else {
      floor_div = std::copysign(0.0, x / y);
    }
    return Value::number(floor_div);
  }
  if (op == "**") {
    if (!nums) unsupported("** or pow()", a, b);
    if (ints && as_int(b) >= 0) {
      int64_t base = as_int(a), result = 1;
      for (int64_t e = as_int(b); e > 0; --e) {
        if (__builtin_mul_overflow(result, base, &result)) overflow();
        if (result == 0 || result == 1) break;
      }
      return Value::integer(result);
    }
    if (as_double(a) == 0 && as_double(b) < 0) fail("0.0 cannot be raised to a negative power");
    return Value::number(std::pow(as_double(a), as_double(b)));
  }
  fail("unknown operator " + op);
}

bool compare_op(const std::string& op, const Value& a, const Value& b) {
  if (op == "==") return equals(a, b);
  if (op == "!=") return !equals(a, b);
  if (op == "in" || op == "not in") {
    bool found = false;
    if (b.kind == Kind::kString) {
      if (a.kind != Kind::kString) fail("'in <string>' requires string as left operand, not " + type_name(a));
      found = b.s.find(a.s) != std::string::npos;
    } else if (b.kind == Kind::kDict) {
      found = b.dict->find(a) != nullptr;
    } else if (b.kind == Kind::kList || b.is_undefined()) {
      for (const Value& item : iterate(b)) found = found || equals(item, a);
    } else {
      fail("argument of type '" + type_name(b) + "' is not iterable");
    }
    return op == "in" ? found : !found;
  }
  int c = compare(a, b, op.c_str());
  if (op == "<") return c < 0;
  if (op == "<=") return c <= 0;
  if (op == ">") return c > 0;
  return c >= 0;
}

}  // namespace chat_detail
}  // namespace data
}  // namespace gradguard
