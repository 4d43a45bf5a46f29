// How an options struct lists its fields. Each XxxOptions has
//
//   template <class Field> void fields(Field&& field) {
//     field("max_norm", max_norm, "L2 threshold ...; > 0");
//     ...
//   }
//
// right under its members: the key of each field in its config section, a reference to
// it, and the one text that says what it means, its unit, its range and how to turn it
// off. The config loader (config/config.cpp) walks these lists to read YAML and --set,
// print `config show` and write docs/config.md, so a field's meaning is written once,
// beside the field. A sub-section is listed through `nested`, which prefixes its keys
// ("scaler." + "init_scale" under amp).
#pragma once

#include <string>
#include <utility>

namespace gradguard {

template <class Field>
class NestedFields {
 public:
  NestedFields(Field& field, std::string prefix) : field_(field), prefix_(std::move(prefix)) {}
  template <class T>
  void operator()(const char* key, T& value, const char* doc) {
    field_((prefix_ + key).c_str(), value, doc);
  }

 private:
  Field& field_;
  std::string prefix_;
};

// Lists `options`' fields under "<prefix>.<key>".
template <class Options, class Field>
void nested(Field& field, const char* prefix, Options& options) {
  options.fields(NestedFields<Field>(field, std::string(prefix) + "."));
}

}  // namespace gradguard
