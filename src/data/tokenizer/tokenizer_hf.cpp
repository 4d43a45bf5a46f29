// The tokenizer.json backend (see tokenizer.h). Encoding follows the reference's order:
//  1. split the text at added tokens whose "normalized" is false (greedy longest match
//     from the left; lstrip/rstrip trim the neighbouring text),
//  2. normalize each section between them,
//  3. split each normalized section at the normalized added tokens,
//  4. pre-tokenize each remaining part and run the BPE model over its pieces (unknown
//     tokens fused per part),
//  5. the post-processor's special tokens around the result.
// Decoding maps ids to their texts, drops special tokens on request, runs the decoder
// chain and, unless tokenizer_config.json turns it off, the reference's clean-up of
// spaces before punctuation.
#include <algorithm>
#include <array>
#include <map>
#include <unordered_set>

#include "gradguard/core/error.h"
#include "gradguard/core/json_read.h"
#include "tokenizer_hf_parts.h"
#include "tokenizer_internal.h"
#include "unicode_text.h"

namespace gradguard::data::detail {

using nlohmann::json;

namespace {

struct AddedToken {
  std::string content;
  int32_t id = kNoToken;
  bool lstrip = false, rstrip = false, special = false, normalized = false;
};

// Greedy longest-match splitting at a set of strings (a byte trie): from each position,
// the longest string starting there is taken; text between matches is kept as is.
class AddedTokenSplitter {
 public:
  void add(const std::string& text, size_t token_index) {
    if (text.empty()) return;
    size_t node = 0;
    for (const char c : text) {
      const uint64_t key = (static_cast<uint64_t>(node) << 8) | static_cast<unsigned char>(c);
      auto it = edges_.find(key);
      if (it == edges_.end()) {
        it = edges_.emplace(key, terminal_.size()).first;
        terminal_.push_back(kNone);
      }
      node = it->second;
    }
    terminal_[node] = token_index;
    first_byte_[static_cast<unsigned char>(text[0])] = true;
  }
  bool empty() const { return terminal_.size() == 1; }

  struct Section {
    std::string_view text;
    size_t token = kNone;  // index of the added token, or kNone for plain text
  };
  static constexpr size_t kNone = static_cast<size_t>(-1);

  std::vector<Section> split(std::string_view text) const {
    std::vector<Section> out;
    size_t start = 0, i = 0;
    while (i < text.size()) {
      if (!first_byte_[static_cast<unsigned char>(text[i])]) {
        ++i;
        continue;
      }
      size_t node = 0, match_len = 0, match_token = kNone;
      for (size_t j = i; j < text.size(); ++j) {
        const auto it = edges_.find((static_cast<uint64_t>(node) << 8) | static_cast<unsigned char>(text[j]));
        if (it == edges_.end()) break;
        node = it->second;
        if (terminal_[node] != kNone) {
          match_len = j + 1 - i;
          match_token = terminal_[node];
        }
      }
      if (match_token == kNone) {
        ++i;
        continue;
      }
      if (i > start) out.push_back({text.substr(start, i - start)});
      out.push_back({text.substr(i, match_len), match_token});
      i += match_len;
      start = i;
    }
    if (start < text.size()) out.push_back({text.substr(start)});
    return out;
  }

 private:
  std::unordered_map<uint64_t, size_t> edges_;  // (node << 8 | byte) -> child node
  std::vector<size_t> terminal_ = {kNone};      // [node] token index ending there
  std::array<bool, 256> first_byte_{};
};

// lstrip/rstrip of added tokens trim the whitespace of their neighbours.
void strip_around_added(std::vector<AddedTokenSplitter::Section>* sections, const std::vector<AddedToken>& added) {
  auto& s = *sections;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i].token == AddedTokenSplitter::kNone) continue;
    const AddedToken& token = added[s[i].token];
    if (token.lstrip && i > 0) s[i - 1].text = trim_js(s[i - 1].text, false, true);
    if (token.rstrip && i + 1 < s.size()) s[i + 1].text = trim_js(s[i + 1].text, true, false);
  }
}

class HfTokenizer final : public TokenizerBackend {
 public:
  HfTokenizer(const json& doc, const json& config, const std::string& where);

  void encode(std::string_view text, bool add_special_tokens, std::vector<int32_t>* ids) const override {
    if (add_special_tokens) ids->insert(ids->end(), prefix_ids_.begin(), prefix_ids_.end());
    const auto sections = split_unnormalized(text);
    for (size_t index = 0; index < sections.size(); ++index) {
      const auto& section = sections[index];
      if (section.text.empty()) continue;
      if (section.token != AddedTokenSplitter::kNone) {
        ids->push_back(added_[section.token].id);
        continue;
      }
      std::string normalized = normalizer_ ? normalizer_->apply(section.text) : std::string(section.text);
      if (normalized.empty()) continue;
      auto parts = normalized_splitter_.empty()
                       ? std::vector<AddedTokenSplitter::Section>{{normalized}}
                       : normalized_splitter_.split(normalized);
      strip_around_added(&parts, added_);
      for (const auto& part : parts) {
        if (part.text.empty()) continue;
        if (part.token != AddedTokenSplitter::kNone) {
          ids->push_back(added_[part.token].id);
          continue;
        }
        std::vector<Piece> pieces{{std::string(part.text)}};
        if (pre_tokenizer_) pre_tokenizer_->apply(&pieces, index);
        const size_t begin = ids->size();
        for (const Piece& piece : pieces) bpe_->encode_word(piece.text, piece.byte_level, ids);
        bpe_->fuse_unknown(ids, begin);
      }
    }
    if (add_special_tokens) ids->insert(ids->end(), suffix_ids_.begin(), suffix_ids_.end());
  }

  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const override {
    std::vector<std::string> tokens;
    tokens.reserve(ids.size());
    for (const int32_t id : ids) {
      const std::string& text = id_text_[static_cast<size_t>(id)];
      if (skip_special_tokens && special_texts_.count(text)) continue;
      tokens.push_back(text);
    }
    std::string text;
    if (decoder_) {
      decoder_->apply(&tokens);
      for (const std::string& t : tokens) text += t;
    } else {
      for (size_t i = 0; i < tokens.size(); ++i) text += (i ? " " : "") + tokens[i];
    }
    if (!end_of_word_suffix_.empty()) {
      text = replace_all(text, end_of_word_suffix_, " ");
      if (skip_special_tokens) text = std::string(trim_js(text, true, true));
    }
    if (clean_up_spaces_) text = clean_up_tokenization(std::move(text));
    return text;
  }

  int64_t vocab_size() const override { return static_cast<int64_t>(id_text_.size()); }
  int32_t token_id(std::string_view token) const override {
    const auto it = added_by_text_.find(std::string(token));
    return it != added_by_text_.end() ? it->second : bpe_->lookup(token);
  }
  std::string token_text(int32_t id) const override {
    return id >= 0 && static_cast<size_t>(id) < id_text_.size() ? id_text_[static_cast<size_t>(id)] : "";
  }
  bool is_special(int32_t id) const override {
    return id >= 0 && static_cast<size_t>(id) < id_text_.size() && special_texts_.count(id_text_[static_cast<size_t>(id)]);
  }
  bool contains_special_text(std::string_view text) const override {
    for (const auto& section : special_splitter_.split(text)) {
      if (section.token != AddedTokenSplitter::kNone) return true;
    }
    return false;
  }

 private:
  std::vector<AddedTokenSplitter::Section> split_unnormalized(std::string_view text) const {
    if (unnormalized_splitter_.empty()) return {{text}};
    auto sections = unnormalized_splitter_.split(text);
    strip_around_added(&sections, added_);
    return sections;
  }
  int32_t resolve(const std::string& token, const JsonPath& at) const {
    const int32_t id = token_id(token);
    if (id != kNoToken) return id;
    if (bpe_->unk_id() != kNoToken) return bpe_->unk_id();
    throw bad_input(at.where(), "\"" + token + "\" is not a token of this tokenizer");
  }
  void read_post_processor(const json& spec, const JsonPath& at);

  std::unique_ptr<Normalizer> normalizer_;
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  std::unique_ptr<Bpe> bpe_;
  std::unique_ptr<Decoder> decoder_;
  std::vector<AddedToken> added_;
  std::unordered_map<std::string, int32_t> added_by_text_;
  AddedTokenSplitter unnormalized_splitter_, normalized_splitter_, special_splitter_;
  std::vector<std::string> id_text_;           // [id] vocabulary form
  std::unordered_set<std::string> special_texts_;
  std::vector<int32_t> prefix_ids_, suffix_ids_;  // the post-processor's, around a text
  std::string end_of_word_suffix_;
  bool clean_up_spaces_ = true;
};

HfTokenizer::HfTokenizer(const json& doc, const json& config, const std::string& where) {
  const JsonPath root{where, ""};
  const auto model_it = doc.find("model");
  if (model_it == doc.end() || !model_it->is_object()) throw bad_input(where + ": model", "is missing or not an object");
  const json& model = *model_it;
  const JsonPath at_model = root.key("model");
  const std::string type = json_string(model, "type", at_model, model.contains("merges") ? "BPE" : "");
  if (type != "BPE") {
    throw bad_input(at_model.key("type").where(),
                    "\"" + type + "\" is not supported (supported: BPE)");
  }
  if (model.contains("dropout") && !model["dropout"].is_null() && model["dropout"] != 0 && model["dropout"] != 0.0) {
    throw bad_input(at_model.key("dropout").where(), "BPE dropout is not supported (tokenization must be deterministic)");
  }
  const auto vocab_it = model.find("vocab");
  if (vocab_it == model.end() || !vocab_it->is_object()) throw bad_input(at_model.key("vocab").where(), "must be an object");
  std::unordered_map<std::string, int32_t> vocab;
  vocab.reserve(vocab_it->size());
  int64_t max_id = -1;
  std::string max_where;  // the entry holding max_id, for the message below
  for (auto it = vocab_it->begin(); it != vocab_it->end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 || it.value().get<int64_t>() >= (int64_t{1} << 31)) {
      throw bad_input(at_model.key("vocab").where(), "the id of \"" + excerpt(it.key()) + "\" must be an integer in [0, 2^31)");
    }
    const int32_t id = static_cast<int32_t>(it.value().get<int64_t>());
    vocab[it.key()] = id;
    if (id > max_id) max_id = id, max_where = at_model.key("vocab").where() + " \"" + excerpt(it.key()) + "\"";
  }
  const auto merges_it = model.find("merges");
  std::vector<std::pair<std::string, std::string>> merges;
  if (merges_it != model.end() && !merges_it->is_null()) {
    if (!merges_it->is_array()) throw bad_input(at_model.key("merges").where(), "must be an array");
    merges.reserve(merges_it->size());
    for (size_t i = 0; i < merges_it->size(); ++i) {
      const json& m = (*merges_it)[i];
      if (m.is_string()) {
        // "a b": the reference splits at spaces and keeps the first two parts.
        const std::string& s = m.get_ref<const std::string&>();
        const size_t space = s.find(' ');
        if (space == std::string::npos) {
          throw bad_input(at_model.key("merges").index(i).where(), "\"" + excerpt(s) + "\" is not two tokens separated by a space");
        }
        const size_t second_end = s.find(' ', space + 1);
        merges.emplace_back(s.substr(0, space), s.substr(space + 1, second_end == std::string::npos ? std::string::npos
                                                                                                   : second_end - space - 1));
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
      } else {
        throw bad_input(at_model.key("merges").index(i).where(), "must be \"a b\" or [\"a\", \"b\"]");
      }
    }
  }
  Bpe::Options options;
  options.unk_token = json_string(model, "unk_token", at_model);
  options.byte_fallback = json_bool(model, "byte_fallback", at_model, false);
  options.fuse_unk = json_bool(model, "fuse_unk", at_model, false);
  options.ignore_merges = json_bool(model, "ignore_merges", at_model, false);
  if (!json_string(model, "continuing_subword_prefix", at_model).empty()) {
    throw bad_input(at_model.key("continuing_subword_prefix").where(), "is not supported (must be empty or null)");
  }
  end_of_word_suffix_ = json_string(model, "end_of_word_suffix", at_model);
  if (!end_of_word_suffix_.empty()) {
    throw bad_input(at_model.key("end_of_word_suffix").where(), "is not supported (must be empty or null)");
  }

  // Added tokens join the vocabulary (and take over an id's text).
  const auto added_it = doc.find("added_tokens");
  std::map<int32_t, std::string> added_texts;
  if (added_it != doc.end() && !added_it->is_null()) {
    if (!added_it->is_array()) throw bad_input(root.key("added_tokens").where(), "must be an array");
    for (size_t i = 0; i < added_it->size(); ++i) {
      const json& t = (*added_it)[i];
      const JsonPath at = root.key("added_tokens").index(i);
      if (!t.is_object()) throw bad_input(at.where(), "must be an object");
      AddedToken token;
      token.content = json_string(t, "content", at);
      if (token.content.empty()) throw bad_input(at.key("content").where(), "must be a non-empty string");
      const auto id_it = t.find("id");
      if (id_it == t.end() || !id_it->is_number_integer() || id_it->get<int64_t>() < 0 ||
          id_it->get<int64_t>() >= (int64_t{1} << 31)) {
        throw bad_input(at.key("id").where(), "must be an integer in [0, 2^31)");
      }
      token.id = static_cast<int32_t>(id_it->get<int64_t>());
      token.special = json_bool(t, "special", at, false);
      token.normalized = json_bool(t, "normalized", at, !token.special);
      token.lstrip = json_bool(t, "lstrip", at, false);
      token.rstrip = json_bool(t, "rstrip", at, false);
      if (token.id > max_id) max_id = token.id, max_where = at.key("id").where();
      added_.push_back(std::move(token));
    }
  }
  for (const AddedToken& token : added_) vocab[token.content] = token.id;
  bpe_ = std::make_unique<Bpe>(std::move(vocab), merges, options, where);
  merges.clear();

  normalizer_ = make_normalizer(doc.value("normalizer", json()), root.key("normalizer"));
  pre_tokenizer_ = make_pre_tokenizer(doc.value("pre_tokenizer", json()), root.key("pre_tokenizer"));

  // Ids are rows of the model's embedding matrix, so a real vocabulary is dense. A lone id
  // far beyond the number of entries (2,000,000,000 in a 100-token file) would size the
  // id table below by that id: refused before anything is allocated.
  const int64_t entries = static_cast<int64_t>(bpe_->vocab().size() + added_.size());
  if (max_id >= 2 * entries + 65536)
    throw bad_input(max_where, "id " + std::to_string(max_id) + " is far beyond the vocabulary's " +
                                   std::to_string(entries) + " entries (ids number the rows of the embedding matrix "
                                   "and must be about as many as the tokens)");
  id_text_.assign(static_cast<size_t>(max_id + 1), std::string());
  for (const auto& [text, id] : bpe_->vocab()) id_text_[static_cast<size_t>(id)] = text;
  auto added_set = std::make_shared<std::unordered_set<std::string>>();
  for (size_t i = 0; i < added_.size(); ++i) {
    AddedToken& token = added_[i];
    id_text_[static_cast<size_t>(token.id)] = token.content;
    added_by_text_[token.content] = token.id;
    added_set->insert(token.content);
    if (token.special) {
      special_texts_.insert(token.content);
      special_splitter_.add(token.content, i);
    }
    if (token.normalized && normalizer_) {
      const std::string form = normalizer_->apply(token.content);
      added_by_text_[form] = token.id;
      normalized_splitter_.add(form, i);
    } else {
      unnormalized_splitter_.add(token.content, i);
    }
  }
  // Holes in the id range decode as the unk token (as in the reference), else as "".
  const std::string unk_text = bpe_->unk_id() != kNoToken ? id_text_[static_cast<size_t>(bpe_->unk_id())] : "";
  for (std::string& text : id_text_) {
    if (text.empty()) text = unk_text;
  }
  if (config.is_object()) {
    const JsonPath at_config{"tokenizer_config.json", ""};
    const auto extra = config.find("additional_special_tokens");
    if (extra != config.end() && extra->is_array()) {
      for (const json& t : *extra) {
        if (t.is_string()) special_texts_.insert(t.get<std::string>());
      }
    }
    clean_up_spaces_ = json_bool(config, "clean_up_tokenization_spaces", at_config, true);
  }
  decoder_ = make_decoder(doc.value("decoder", json()), root.key("decoder"), added_set);
  read_post_processor(doc.value("post_processor", json()), root.key("post_processor"));
}

void HfTokenizer::read_post_processor(const json& spec, const JsonPath& at) {
  if (spec.is_null()) return;
  if (!spec.is_object()) throw bad_input(at.where(), "must be an object");
  const std::string type = json_string(spec, "type", at);
  if (type == "ByteLevel") return;  // offsets only
  if (type == "Sequence") {
    const auto it = spec.find("processors");
    if (it == spec.end() || !it->is_array()) throw bad_input(at.key("processors").where(), "must be an array");
    for (size_t i = 0; i < it->size(); ++i) read_post_processor((*it)[i], at.key("processors").index(i));
    return;
  }
  if (type == "TemplateProcessing") {
    const auto it = spec.find("single");
    if (it == spec.end() || !it->is_array()) throw bad_input(at.key("single").where(), "must be an array");
    bool seen_sequence = false;
    std::vector<int32_t> before, after;
    for (size_t i = 0; i < it->size(); ++i) {
      const json& item = (*it)[i];
      const JsonPath at_item = at.key("single").index(i);
      if (item.is_object() && item.contains("SpecialToken") && item["SpecialToken"].is_object()) {
        const std::string token = json_string(item["SpecialToken"], "id", at_item.key("SpecialToken"));
        (seen_sequence ? after : before).push_back(resolve(token, at_item.key("SpecialToken").key("id")));
      } else if (item.is_object() && item.contains("Sequence")) {
        if (seen_sequence) throw bad_input(at_item.where(), "a single-sequence template holds one Sequence");
        seen_sequence = true;
      } else {
        throw bad_input(at_item.where(), "must be {\"SpecialToken\": ...} or {\"Sequence\": ...}");
      }
    }
    // In a Sequence, a later processor wraps the earlier one's output.
    prefix_ids_.insert(prefix_ids_.begin(), before.begin(), before.end());
    suffix_ids_.insert(suffix_ids_.end(), after.begin(), after.end());
    return;
  }
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    for (const char* key : {"cls", "sep"}) {
      const auto it = spec.find(key);
      if (it == spec.end() || !it->is_array() || it->empty() || !(*it)[0].is_string()) {
        throw bad_input(at.key(key).where(), "must be [token, id]");
      }
      const int32_t id = resolve((*it)[0].get<std::string>(), at.key(key));
      if (std::string(key) == "cls") {
        prefix_ids_.insert(prefix_ids_.begin(), id);
      } else {
        suffix_ids_.push_back(id);
      }
    }
    return;
  }
  throw bad_input(at.key("type").where(), "\"" + type +
                                              "\" is not supported (supported: TemplateProcessing, ByteLevel, "
                                              "BertProcessing, RobertaProcessing, Sequence)");
}

}  // namespace

std::unique_ptr<TokenizerBackend> load_hf_tokenizer(const std::string& json_text, const std::string& config_text,
                                                    const std::string& where) {
  JsonLimits limits;
  limits.max_bytes = size_t{256} << 20;
  const json doc = parse_json(json_text, where, limits);
  json config;
  if (!config_text.empty()) config = parse_json(config_text, "tokenizer_config.json", JsonLimits{});
  return std::make_unique<HfTokenizer>(doc, config, where);
}

}  // namespace gradguard::data::detail
