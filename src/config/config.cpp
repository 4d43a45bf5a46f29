// YAML -> typed options. Each options struct lists its own fields with their keys and
// meanings (core/option_fields.h); fields() below collects those lists into one table
// of keys, references into the Config and descriptions, and reading a file, applying
// --set overrides, printing the effective config and generating docs/config.md all walk
// that one table, so they cannot disagree. Choice keys are parsed into their enums here,
// once (core/choice.h).
#include "gradguard/config/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <functional>
#include <set>
#include <sstream>
#include <variant>

#include "gradguard/checkpoint/hf_config.h"
#include "gradguard/core/error.h"
#include "gradguard/core/fs.h"

namespace gradguard::config {
namespace {

constexpr size_t kMaxConfigBytes = size_t{16} << 20;  // a config file is a few KiB; this bounds a hostile one

// A choice key, type-erased: the enum behind it is parsed and printed through its
// choices() table (core/choice.h).
struct ChoiceRef {
  std::function<std::string()> get;
  std::function<void(const std::string& text, const std::string& where)> set;
  std::vector<std::string> names;  // every accepted name, aliases included
};
// A list of choices (guard.recovery.ladder).
struct ChoiceListRef {
  std::function<std::vector<std::string>()> get;
  std::function<void(const std::vector<std::string>& texts, const std::string& where)> set;
  std::vector<std::string> names;
};

using FieldPtr = std::variant<int64_t*, uint64_t*, double*, bool*, std::string*, std::array<double, 2>*,
                              std::vector<int64_t>*, ChoiceRef, ChoiceListRef>;

struct Field {
  std::string section;
  std::string key;
  FieldPtr ptr;
  std::string doc;
  std::string full() const { return section + "." + key; }
};

template <class E>
ChoiceRef choice_ref(E& value) {
  return {[&value] { return std::string(name_of(value)); },
          [&value](const std::string& text, const std::string& where) { value = parse_choice<E>(text, where); },
          choice_names<E>()};
}

template <class E>
ChoiceListRef choice_list_ref(std::vector<E>& values) {
  return {[&values] {
            std::vector<std::string> out;
            for (E v : values) out.emplace_back(name_of(v));
            return out;
          },
          [&values](const std::vector<std::string>& texts, const std::string& where) {
            std::vector<E> parsed;
            for (const auto& t : texts) parsed.push_back(parse_choice<E>(t, where));
            values = std::move(parsed);
          },
          choice_names<E>()};
}

template <class T>
struct is_choice_vector : std::false_type {};
template <class E>
struct is_choice_vector<std::vector<E>> : std::bool_constant<is_choice_v<E>> {};

// Collects one section's fields (the options structs list them: core/option_fields.h).
struct Collector {
  std::vector<Field>& out;
  std::string section;
  template <class T>
  void operator()(const char* key, T& value, const char* doc) {
    if constexpr (is_choice_v<T>)
      out.push_back({section, key, choice_ref(value), doc});
    else if constexpr (is_choice_vector<T>::value)
      out.push_back({section, key, choice_list_ref(value), doc});
    else
      out.push_back({section, key, &value, doc});
  }
};

const std::vector<std::string> kSections = {"run",  "model", "lora", "data",       "batch", "loss", "optim",
                                            "schedule", "clip", "amp", "memory", "eval", "checkpoint", "log",
                                            "guard", "telemetry", "dist"};

// Every configurable field, in the order config files, `config show` and
// docs/config.md list them. The pointers refer into `c`.
std::vector<Field> fields(Config& c) {
  std::vector<Field> out;
  auto section = [&](const char* name, auto& options) { options.fields(Collector{out, name}); };
  section("run", c.run);
  section("model", c.model);
  section("lora", c.lora);
  section("data", c.data);
  section("batch", c.batch);
  section("loss", c.loss);
  section("optim", c.optim);
  section("schedule", c.schedule);
  section("clip", c.clip);
  section("amp", c.amp);
  section("memory", c.memory);
  section("eval", c.eval);
  section("checkpoint", c.checkpoint);
  section("log", c.log);
  section("guard", c.guard);
  section("telemetry", c.telemetry);
  section("dist", c.dist);
  return out;
}

std::string type_name(const FieldPtr& p) {
  return std::visit(
      [](const auto& v) -> std::string {
        using T = std::remove_cv_t<std::remove_pointer_t<std::decay_t<decltype(v)>>>;
        if constexpr (std::is_same_v<T, int64_t>) return "integer";
        if constexpr (std::is_same_v<T, uint64_t>) return "non-negative integer";
        if constexpr (std::is_same_v<T, double>) return "number";
        if constexpr (std::is_same_v<T, bool>) return "boolean";
        if constexpr (std::is_same_v<T, std::string>) return "string";
        if constexpr (std::is_same_v<T, std::vector<int64_t>>) return "list of integers";
        if constexpr (std::is_same_v<T, ChoiceRef>) return "choice";
        if constexpr (std::is_same_v<T, ChoiceListRef>) return "list of choices";
        return "list of 2 numbers";
      },
      p);
}

std::string format_double(double v) {
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), v);
  std::string s(buf, res.ptr);
  // Keep a float-looking form so YAML readers see a number with a fraction.
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

std::string quote(const std::string& s) {
  std::string out = "\"";
  for (char ch : s) {
    if (ch == '"' || ch == '\\') out += '\\';
    out += ch;
  }
  return out + "\"";
}

std::string format_value(const FieldPtr& p) {
  return std::visit(
      [](const auto& v) -> std::string {
        using T = std::remove_cv_t<std::remove_pointer_t<std::decay_t<decltype(v)>>>;
        if constexpr (std::is_same_v<T, int64_t> || std::is_same_v<T, uint64_t>) return std::to_string(*v);
        if constexpr (std::is_same_v<T, double>) return format_double(*v);
        if constexpr (std::is_same_v<T, bool>) return *v ? "true" : "false";
        if constexpr (std::is_same_v<T, std::string>) return quote(*v);
        if constexpr (std::is_same_v<T, std::array<double, 2>>)
          return "[" + format_double((*v)[0]) + ", " + format_double((*v)[1]) + "]";
        if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
          std::string out = "[";
          for (size_t i = 0; i < v->size(); ++i) out += (i ? ", " : "") + std::to_string((*v)[i]);
          return out + "]";
        }
        if constexpr (std::is_same_v<T, ChoiceRef>) return v.get();
        if constexpr (std::is_same_v<T, ChoiceListRef>) {
          const auto names = v.get();
          std::string out = "[";
          for (size_t i = 0; i < names.size(); ++i) out += (i ? ", " : "") + names[i];
          return out + "]";
        }
      },
      p);
}

std::string node_text(const YAML::Node& node) {
  YAML::Emitter e;
  e << YAML::Flow << node;
  return e.c_str();
}

// Every number option is finite: inf and NaN (and 1e400, which overflows) are refused
// here for all of them, whatever each option's own range is.
double parse_double(const YAML::Node& node, const std::string& where) {
  if (!node.IsScalar()) throw bad_input(where, "expected a number, got " + node_text(node));
  const std::string s = node.Scalar();
  double v;
  try {
    size_t used = 0;
    v = std::stod(s, &used);
    if (used != s.size()) throw std::invalid_argument(s);
  } catch (const std::out_of_range&) {
    throw bad_input(where, "'" + s + "' is out of range: expected a finite number");
  } catch (const std::exception&) {
    throw bad_input(where, "expected a number, got '" + s + "'");
  }
  if (!std::isfinite(v)) throw bad_input(where, "expected a finite number, got '" + s + "'");
  return v;
}

// Assigns `node` to the field, checking its type. `where` names the key for messages.
void assign(const Field& f, const YAML::Node& node, const std::string& where) {
  std::visit(
      [&](const auto& v) {
        using T = std::remove_cv_t<std::remove_pointer_t<std::decay_t<decltype(v)>>>;
        if constexpr (std::is_same_v<T, ChoiceRef>) {
          if (!node.IsScalar()) throw bad_input(where, "expected one name, got " + node_text(node));
          v.set(node.Scalar(), where);
        } else if constexpr (std::is_same_v<T, ChoiceListRef>) {
          if (!node.IsSequence()) throw bad_input(where, "expected a list of names like [a, b], got " + node_text(node));
          std::vector<std::string> texts;
          for (const auto& item : node) {
            if (!item.IsScalar()) throw bad_input(where, "expected a list of names, got element " + node_text(item));
            texts.push_back(item.Scalar());
          }
          v.set(texts, where);
        } else if constexpr (std::is_same_v<T, std::string>) {
          if (node.IsNull()) *v = "";
          else if (node.IsScalar()) *v = node.Scalar();
          else throw bad_input(where, "expected a string, got " + node_text(node));
        } else if constexpr (std::is_same_v<T, bool>) {
          bool b;
          if (!node.IsScalar() || !YAML::convert<bool>::decode(node, b))
            throw bad_input(where, "expected a boolean (true or false), got '" + node_text(node) + "'");
          *v = b;
        } else if constexpr (std::is_same_v<T, int64_t> || std::is_same_v<T, uint64_t>) {
          const std::string s = node.IsScalar() ? node.Scalar() : node_text(node);
          T parsed{};
          auto res = std::from_chars(s.data(), s.data() + s.size(), parsed);
          if (!node.IsScalar() || res.ec != std::errc() || res.ptr != s.data() + s.size())
            throw bad_input(where, "expected " + type_name(f.ptr) + ", got '" + s + "'");
          *v = parsed;
        } else if constexpr (std::is_same_v<T, double>) {
          *v = parse_double(node, where);
        } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
          if (!node.IsSequence()) throw bad_input(where, "expected a list of integers like [3, 7], got " + node_text(node));
          v->clear();
          for (const auto& item : node) {
            const std::string t = item.IsScalar() ? item.Scalar() : node_text(item);
            int64_t parsed = 0;
            auto res = std::from_chars(t.data(), t.data() + t.size(), parsed);
            if (!item.IsScalar() || res.ec != std::errc() || res.ptr != t.data() + t.size())
              throw bad_input(where, "expected a list of integers, got element '" + t + "'");
            v->push_back(parsed);
          }
        } else {
          if (!node.IsSequence() || node.size() != 2)
            throw bad_input(where, "expected a list of 2 numbers like [0.9, 0.95], got " + node_text(node));
          (*v)[0] = parse_double(node[0], where);
          (*v)[1] = parse_double(node[1], where);
        }
      },
      f.ptr);
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string unknown_key_message(const std::string& key, const std::vector<std::string>& candidates) {
  std::string near = nearest_key(key, candidates);
  return near.empty() ? "unknown key" : "unknown key (did you mean '" + near + "'?)";
}

std::vector<std::string> all_keys(std::vector<Field>& table) {
  std::vector<std::string> keys;
  for (const auto& f : table) keys.push_back(f.full());
  return keys;
}

Field* find_field(std::vector<Field>& table, const std::string& full) {
  for (auto& f : table)
    if (f.full() == full) return &f;
  return nullptr;
}

// Assigns every entry of `map` under `prefix`; a nested mapping is a sub-section
// ("amp: {scaler: {mode: dynamic}}" sets amp.scaler.mode) when no field takes a map.
// Every bad key is collected in `errors` rather than thrown, so a file is reported whole.
void apply_map(std::vector<Field>& table, const std::vector<std::string>& keys, const std::string& path,
               const std::string& prefix, const YAML::Node& map, std::vector<Error>* errors,
               std::set<std::string>* given) {
  for (const auto& entry : map) try {
    const std::string full = prefix + "." + entry.first.Scalar();
    Field* f = find_field(table, full);
    if (f == nullptr && entry.second.IsMap()) {
      const bool is_section = std::any_of(keys.begin(), keys.end(),
                                          [&](const std::string& k) { return k.rfind(full + ".", 0) == 0; });
      if (is_section) {
        apply_map(table, keys, path, full, entry.second, errors, given);
        continue;
      }
    }
    if (f == nullptr) throw bad_input(path + ": " + full, unknown_key_message(full, keys));
    assign(*f, entry.second, path + ": " + full);
    given->insert(full);
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::kBadInput) throw;
    errors->push_back(e);
  }
}

// `given` collects the keys assigned (by the file here, by --set below).
void apply_file(Config& c, const std::string& path, std::set<std::string>* given) {
  // A preset name misspelled: say which files its directory does hold.
  if (!std::filesystem::exists(path)) {
    const auto dir = std::filesystem::path(path).parent_path();
    std::vector<std::string> presets;
    std::error_code ec;
    if (!dir.empty() && std::filesystem::is_directory(dir, ec))
      for (const auto& e : std::filesystem::directory_iterator(dir, ec))
        if (e.path().extension() == ".yaml") presets.push_back(e.path().filename().string());
    std::sort(presets.begin(), presets.end());
    std::string list;
    for (const auto& p : presets) list += (list.empty() ? "" : ", ") + p;
    throw bad_input(path, "cannot open: no such file" + (list.empty() ? "" : " (" + dir.string() + " holds " + list + ")"));
  }
  const std::string text = fs::read_file(path, kMaxConfigBytes);
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw bad_input(path, "invalid YAML at line " + std::to_string(e.mark.line + 1) + ", column " +
                              std::to_string(e.mark.column + 1) + ": " + e.msg);
  }
  if (root.IsNull()) return;
  if (!root.IsMap()) throw bad_input(path, "the top level must be a mapping of sections (run:, model:, ...)");
  auto table = fields(c);
  auto keys = all_keys(table);
  std::vector<Error> errors;  // every bad key of the file, in order
  for (const auto& section : root) {
    const std::string name = section.first.Scalar();
    if (std::find(kSections.begin(), kSections.end(), name) == kSections.end()) {
      errors.push_back(bad_input(path + ": " + name, unknown_key_message(name, kSections)));
      continue;
    }
    if (section.second.IsNull()) continue;
    if (!section.second.IsMap()) {
      errors.push_back(
          bad_input(path + ": " + name, "a section must be a mapping of keys, got " + node_text(section.second)));
      continue;
    }
    apply_map(table, keys, path, name, section.second, &errors, given);
  }
  if (errors.size() == 1) throw errors.front();
  if (errors.size() > 1) {
    std::string all = std::to_string(errors.size()) + " bad keys:";
    for (const auto& e : errors) all += std::string("\n  ") + e.what();
    throw bad_input(path, all);
  }
}

void apply_override(Config& c, const std::string& assignment, std::set<std::string>* given) {
  const auto eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0)
    throw bad_input("--set " + assignment, "expected key.path=value, e.g. optim.lr=1e-3");
  const std::string key = assignment.substr(0, eq);
  const std::string where = "--set " + key;
  auto table = fields(c);
  Field* f = find_field(table, key);
  if (f == nullptr) throw bad_input(where, unknown_key_message(key, all_keys(table)));
  YAML::Node node;
  try {
    node = YAML::Load(assignment.substr(eq + 1));
  } catch (const YAML::Exception& e) {
    throw bad_input(where, "value is not valid YAML: " + e.msg);
  }
  assign(*f, node, where);
  given->insert(key);
}

bool is_pow2(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

// Pairs of keys where the first, when in use, replaces the second.
struct Alternative {
  const char* primary;
  const char* secondary;
  bool (*active)(const Config&);  // the primary is in use
  void (*drop)(Config&);          // the primary back to "not in use"
  const char* advice;
};
const std::vector<Alternative>& alternatives() {
  static const std::vector<Alternative> all = {
      {"schedule.epochs", "schedule.total_steps", [](const Config& c) { return c.schedule.epochs > 0; },
       [](Config& c) { c.schedule.epochs = 0; }, "give the run's length one way (epochs derives total_steps from the data)"},
      {"schedule.warmup_ratio", "schedule.warmup_steps", [](const Config& c) { return c.schedule.warmup_ratio > 0; },
       [](Config& c) { c.schedule.warmup_ratio = 0; }, "give the warmup one way (the ratio sets warmup_steps)"},
      {"schedule.min_lr", "schedule.min_lr_ratio", [](const Config& c) { return c.schedule.min_lr >= 0; },
       [](Config& c) { c.schedule.min_lr = -1; }, "give the floor one way (min_lr -1 uses min_lr_ratio)"},
  };
  return all;
}

}  // namespace

std::string nearest_key(const std::string& key, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = std::string::npos;
  for (const auto& c : candidates) {
    size_t d = edit_distance(key, c);
    // Also compare the last component alone, so "lrr" finds "optim.lr".
    auto dot = c.rfind('.');
    if (dot != std::string::npos && key.find('.') == std::string::npos)
      d = std::min(d, edit_distance(key, c.substr(dot + 1)));
    // The right name in the wrong section ("optim.min_lr" for schedule.min_lr) is one
    // step away, nearer than a shorter name of the section it was written in.
    const auto key_dot = key.rfind('.');
    if (key_dot != std::string::npos && dot != std::string::npos && key.substr(key_dot + 1) == c.substr(dot + 1))
      d = std::min<size_t>(d, 1);
    // A truncated or extended key ("schedule.warmup", "optimizer") is a near miss too.
    const size_t common = std::min(key.size(), c.size());
    if (common >= 3 && key.compare(0, common, c, 0, common) == 0) d = std::min<size_t>(d, 1);
    if (d < best_d) best_d = d, best = c;
  }
  const size_t limit = std::max<size_t>(2, key.size() / 3);
  return best_d <= limit ? best : "";
}

void Config::validate_memory(int64_t world_size) const {
  const auto& m = memory;
  const bool low_precision = m.weights_dtype != amp::AmpDtype::kFp32;
  if (low_precision && amp.dtype != m.weights_dtype)
    throw bad_input("memory.weights_dtype", std::string(name_of(m.weights_dtype)) +
                                                " weights compute in that dtype: set amp.dtype to " +
                                                name_of(m.weights_dtype) + " too (it is " + name_of(amp.dtype) + ")");
  if (low_precision && world_size > 1 && dist.hook == dist::CommHook::kPowerSgd)
    throw bad_input("dist.hook", std::string("powersgd needs float32 gradients; with memory.weights_dtype ") +
                                     name_of(m.weights_dtype) + " use none (summed in float32) or bf16");
  if (m.sharded_optimizer() && optim.name != optim::OptimizerKind::kAdamW &&
      optim.name != optim::OptimizerKind::kAdamAtan2)
    throw bad_input("optim.name", std::string(name_of(optim.name)) +
                                      " needs whole tensors for its trust ratio; memory.zero_stage, "
                                      "memory.offload_optimizer and master weights run adamw and adam_atan2");
  const auto& ladder = guard.recovery.ladder;
  if (low_precision && std::find(ladder.begin(), ladder.end(), guard::RecoveryAction::kPrecision) != ladder.end())
    throw bad_input("guard.recovery.ladder", std::string("the precision rung computes wider than the ") +
                                                 name_of(m.weights_dtype) +
                                                 " weights (memory.weights_dtype) allow: drop it or keep fp32 weights");
  if (m.zero_stage > 0 && optim.update_clipping && world_size > 1)
    throw bad_input("optim.update_clipping", "needs each tensor whole on one rank; memory.zero_stage " +
                                                 std::to_string(m.zero_stage) + " on " + std::to_string(world_size) +
                                                 " ranks splits them: turn one off");
  if (m.zero_stage == 2 && world_size > 1 && dist.hook != dist::CommHook::kNone)
    throw bad_input("dist.hook", std::string(name_of(dist.hook)) +
                                     " compresses whole all-reduced buckets; memory.zero_stage 2 reduces float32 "
                                     "pieces to their owners: use none");

}

void Config::finalize(int64_t world_size) {
  // A fine-tune's model is the one in model.init_from (docs/models.md: its architecture
  // wins), so its config.json is read before any rule looks at model.* - a 4096-position
  // model takes data.seq_len=4096 whatever the default max_seq_len says.
  if (!model.init_from.empty()) {
    const std::string from = model.init_from;
    if (!std::filesystem::is_regular_file(from + "/config.json"))
      throw bad_input("model.init_from", from + "/config.json does not exist: model.init_from is a Hugging Face "
                                         "model directory (config.json and model.safetensors), e.g. a run's "
                                         "checkpoints/step-N or an exported model");
    model = checkpoint::read_hf_config(from, model);
  }
  run.validate();
  model.validate();
  lora.validate(model.activation_checkpointing);
  data.validate();
  batch.validate();
  loss.validate();
  optim.validate();
  schedule.resolve();
  schedule.validate();
  clip.validate();
  amp.validate();
  memory.validate();
  eval.validate();
  checkpoint.validate();
  log.validate();
  guard.validate();
  telemetry.validate();
  dist.validate();
  validate_memory(world_size);
  if (schedule.min_lr >= 0 && schedule.min_lr > optim.lr)
    throw bad_input("schedule.min_lr", "must be <= optim.lr (" + format_double(optim.lr) + "), got " +
                                           format_double(schedule.min_lr) +
                                           " (-1 makes the floor schedule.min_lr_ratio x optim.lr)");
  if (data.seq_len > model.max_seq_len)
    throw bad_input("data.seq_len", "must be <= model.max_seq_len (" + std::to_string(model.max_seq_len) +
                                        "), got " + std::to_string(data.seq_len));
  // One rule (config/run_options.h): global_batch 0 is micro_batch x accum_steps x ranks,
  // decided again whenever the rank count is known; a given global_batch stays fixed and
  // sets accum_steps.
  const int64_t per_step = batch.micro_batch * world_size;
  if (batch.global_batch == 0) batch.global_from_accum = true;
  if (!batch.global_from_accum) {
    if (batch.global_batch % per_step != 0)
      throw bad_input("batch.global_batch",
                      std::to_string(batch.global_batch) + " is not a multiple of batch.micro_batch (" +
                          std::to_string(batch.micro_batch) + ") x ranks (" + std::to_string(world_size) + ")");
    batch.accum_steps = batch.global_batch / per_step;
  } else {
    batch.global_batch = per_step * batch.accum_steps;
  }
  warnings.clear();
  if (!batch.require_pow2 && !is_pow2(batch.global_batch))
    warnings.push_back("batch.global_batch " + std::to_string(batch.global_batch) +
                       " is not a power of two: per-rank shards and accumulation windows can come out uneven "
                       "and GPU kernels run less efficiently; set batch.require_pow2=true to make this an error");
  // bench natural (docs/natural.md): fine-tuning a trained model without warmup, Adam's
  // first updates are full-size whatever the gradient (m-hat / sqrt(v-hat) = +-1), and
  // one step takes the default model from loss 2.14 to 4.45 at lr 1e-2; 3 warmup steps
  // halve that jump, clipping of any kind does not change it.
  const bool provisional = schedule.epochs > 0 && schedule.warmup_ratio > 0 && !length_from_data;
  if (!model.init_from.empty() && schedule.warmup_steps < kFinetuneWarmupSteps && !provisional)
    warnings.push_back("schedule.warmup_steps " + std::to_string(schedule.warmup_steps) +
                       " while fine-tuning (model.init_from): without a warmup of at least " +
                       std::to_string(kFinetuneWarmupSteps) +
                       " steps Adam's first updates are full-size and can throw the trained model out of its "
                       "basin in one step (docs/natural.md); gradient clipping does not prevent that");
  if (batch.require_pow2) {
    for (auto [key, v] : {std::pair<const char*, int64_t>{"batch.micro_batch", batch.micro_batch},
                          {"batch.accum_steps", batch.accum_steps},
                          {"batch.global_batch", batch.global_batch}})
      if (!is_pow2(v))
        throw bad_input(key, std::to_string(v) + " is not a power of 2 (batch.require_pow2 is true)");
  }
}

Config default_config() { return Config{}; }

std::vector<ChoiceKey> choice_keys() {
  Config c = default_config();
  std::vector<ChoiceKey> out;
  for (const auto& f : fields(c)) {
    if (const auto* choice = std::get_if<ChoiceRef>(&f.ptr)) out.push_back({f.full(), choice->names, f.doc});
    if (const auto* list = std::get_if<ChoiceListRef>(&f.ptr)) out.push_back({f.full(), list->names, f.doc});
  }
  return out;
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  Config c = default_config();
  std::set<std::string> in_file, in_sets;
  if (!path.empty()) apply_file(c, path, &in_file);
  for (const auto& o : overrides) apply_override(c, o, &in_sets);
  // Keys that say one thing two ways (alternatives()): a --set of one replaces the file's
  // other (a preset in epochs runs with `--set schedule.total_steps=50`); both in one
  // place cannot be guessed.
  for (const auto& alt : alternatives()) {
    if (!alt.active(c)) continue;
    const bool both_set = in_sets.count(alt.primary) && in_sets.count(alt.secondary);
    const bool both_file = in_file.count(alt.primary) && in_file.count(alt.secondary) &&
                           !in_sets.count(alt.primary) && !in_sets.count(alt.secondary);
    if (both_set || both_file)
      throw bad_input((both_set ? std::string("--set ") : path + ": ") + alt.primary,
                      std::string("and ") + alt.secondary + " are both set: " + alt.advice);
    if (in_sets.count(alt.secondary) && !in_sets.count(alt.primary)) alt.drop(c);
  }
  c.finalize();
  return c;
}

std::string to_yaml(const Config& config) {
  Config copy = config;
  auto table = fields(copy);
  std::ostringstream out;
  out << "# gradguard effective configuration (gradguard " GRADGUARD_VERSION ")\n";
  std::string section, sub;
  for (const auto& f : table) {
    if (f.section != section) {
      section = f.section;
      sub.clear();
      out << section << ":\n";
    }
    const auto dot = f.key.rfind('.');
    const std::string f_sub = dot == std::string::npos ? "" : f.key.substr(0, dot);
    const std::string leaf = dot == std::string::npos ? f.key : f.key.substr(dot + 1);
    if (f_sub != sub) {
      sub = f_sub;
      if (!sub.empty()) out << "  " << sub << ":\n";
    }
    // A key that its alternative replaces (schedule.total_steps under schedule.epochs) is
    // shown commented out, so that loading the file back does not set both.
    bool derived = false;
    for (const auto& alt : alternatives()) derived = derived || (f.full() == alt.secondary && alt.active(copy));
    std::string line = std::string(sub.empty() ? 2 : 4, ' ') + (derived ? "# " : "") + leaf + ": " + format_value(f.ptr);
    if (line.size() < 40) line.append(40 - line.size(), ' ');
    out << line << "  # " << f.doc << "\n";
  }
  return out.str();
}

std::string reference_markdown() {
  Config defaults = default_config();
  auto table = fields(defaults);
  std::ostringstream out;
  out << "# Configuration reference\n\n"
      << "Generated by `gradguard config docs`; a test keeps this file in step with the code.\n\n"
      << "A run's configuration is the built-in default, then the YAML file given with\n"
      << "`--config FILE`, then each `--set key.path=value` (the value is read as YAML, so\n"
      << "`--set optim.betas=[0.9,0.95]` works). `gradguard config show` prints the result,\n"
      << "and every run directory keeps it as `config.yaml`. Unknown keys, wrong types and\n"
      << "out-of-range values stop the program with exit code 2 and a message naming the key.\n";
  std::string section;
  for (const auto& f : table) {
    if (f.section != section) {
      section = f.section;
      out << "\n## `" << section << "`\n\n| key | type | default | meaning |\n|---|---|---|---|\n";
    }
    // A '|' inside a cell would end it: escape the choice separators.
    std::string doc;
    for (char ch : f.doc) doc += ch == '|' ? std::string("\\|") : std::string(1, ch);
    out << "| `" << f.full() << "` | " << type_name(f.ptr) << " | `" << format_value(f.ptr) << "` | " << doc
        << " |\n";
  }
  return out.str();
}

}  // namespace gradguard::config
