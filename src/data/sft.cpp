// Records to ids and training flags (sft.h). The chat split renders prefixes of the
// conversation and checks each is a prefix of the whole rendering, so it needs nothing
// from the template but determinism: no generation tags, no per-template rules.
#include "gradguard/data/sft.h"

#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

#include "gradguard/core/error.h"

namespace gradguard::data {
namespace {

using ojson = nlohmann::ordered_json;

bool starts_with(const std::string& text, const std::string& prefix) {
  return text.size() >= prefix.size() && text.compare(0, prefix.size(), prefix) == 0;
}

// Appends the ids of text[begin, end) with flag `trained`.
void append_piece(const Tokenizer& tokenizer, const std::string& text, size_t begin, size_t end, bool trained,
                  EncodedSample& out) {
  if (end <= begin) return;
  const auto ids = tokenizer.encode(std::string_view(text).substr(begin, end - begin), /*add_special_tokens=*/false);
  out.ids.insert(out.ids.end(), ids.begin(), ids.end());
  out.trained.insert(out.trained.end(), ids.size(), trained ? 1 : 0);
}

void append_eos(const Tokenizer& tokenizer, bool trained, EncodedSample& out) {
  if (tokenizer.eos_id() < 0 || (!out.ids.empty() && out.ids.back() == tokenizer.eos_id())) return;
  out.ids.push_back(tokenizer.eos_id());
  out.trained.push_back(trained ? 1 : 0);
}

const std::string& string_field(const ojson& record, const char* key, const std::string& where) {
  const auto it = record.find(key);
  if (it == record.end() || !it->is_string()) {
    throw bad_input(where, std::string("\"") + key + "\" must be a string, got " +
                               (it == record.end() ? std::string("nothing") : std::string(it->type_name())));
  }
  return it->get_ref<const std::string&>();
}

// The text of a content given as a list of parts: [{"type": "text", "text": "..."}, ...]
// (OpenAI's and HF's multimodal messages). A part of another type (an image, audio) is
// refused naming it: the model trains on text.
std::vector<std::string> text_parts(const ojson& content, const std::string& at) {
  std::vector<std::string> texts;
  for (size_t j = 0; j < content.size(); ++j) {
    const ojson& part = content[j];
    const std::string here = at + ".content[" + std::to_string(j) + "]";
    if (!part.is_object())
      throw bad_input(here, std::string("must be a {\"type\": \"text\", \"text\": ...} part, got ") +
                                part.type_name());
    const auto type = part.find("type");
    if (type == part.end() || !type->is_string()) throw bad_input(here, "has no string \"type\"");
    if (*type != "text")
      throw bad_input(here, "has type \"" + type->get<std::string>() +
                                "\": only text parts can be trained on (drop the part, or the message)");
    const auto text = part.find("text");
    if (text == part.end() || !text->is_string()) throw bad_input(here, "is a text part without a string \"text\"");
    texts.push_back(text->get<std::string>());
  }
  return texts;
}

// Checks the messages and returns them as the template takes them: a content given as a
// list of text parts stays a list for a template that loops over it
// (ChatTemplate::iterates_message_content) and becomes the parts' texts joined by "\n"
// for one that expects a string (as vLLM renders such templates), so no Python-looking
// list reaches the training text.
ojson checked_messages(const ojson& messages, const ChatTemplate& chat, const std::string& where) {
  if (!messages.is_array() || messages.empty()) {
    throw bad_input(where, "\"messages\" must be a non-empty list of {\"role\", \"content\"} objects");
  }
  ojson out = messages;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ojson& m = messages[i];
    const std::string at = where + ": messages[" + std::to_string(i) + "]";
    if (!m.is_object()) throw bad_input(at, std::string("must be an object, got ") + m.type_name());
    const auto role = m.find("role");
    if (role == m.end() || !role->is_string()) throw bad_input(at, "has no string \"role\"");
    const std::string& r = role->get_ref<const std::string&>();
    if (r != "system" && r != "user" && r != "assistant" && r != "tool") {
      throw bad_input(at, "unknown role \"" + r + "\" (known: system, user, assistant, tool)");
    }
    const auto content = m.find("content");
    const bool has_tool_calls = m.contains("tool_calls");
    if (content == m.end() ? !has_tool_calls : !(content->is_string() || content->is_null() || content->is_array())) {
      throw bad_input(at, "\"content\" must be a string, a list of {\"type\": \"text\", \"text\": ...} parts, "
                          "or null/absent with \"tool_calls\"");
    }
    if (content == m.end() || !content->is_array()) continue;
    const auto texts = text_parts(*content, at);
    if (chat.iterates_message_content()) continue;
    std::string joined;
    for (size_t j = 0; j < texts.size(); ++j) joined += (j ? "\n" : "") + texts[j];
    out[i]["content"] = joined;
  }
  return out;
}

// The text a message's content puts into the rendering last: the string, or the last
// text part of a list ("" when there is none).
std::string last_text(const ojson& message) {
  const auto content = message.find("content");
  if (content == message.end()) return "";
  if (content->is_string()) return content->get<std::string>();
  if (content->is_array() && !content->empty()) return content->back().value("text", "");
  return "";
}

std::string render(const ChatTemplate& chat, const Tokenizer& tokenizer, const ojson& record, const ojson& messages,
                   bool add_generation_prompt, const std::string& where) {
  ojson context = ojson::object();
  context["messages"] = messages;
  context["add_generation_prompt"] = add_generation_prompt;
  context["bos_token"] = tokenizer.bos_token();
  context["eos_token"] = tokenizer.eos_token();
  if (record.contains("tools")) context["tools"] = record["tools"];
  try {
    return chat.render(context);
  } catch (const Error& e) {
    throw bad_input(where, "the chat template failed: " + std::string(e.what()));
  }
}

// End of the first special token's text in text[from, ...), npos when there is none.
// Whether a prefix holds one is monotone in its length: binary search on it, inside the
// shortest doubling window that holds one (the token is near, the text may be long: a
// search over the whole rest per turn would make a long conversation quadratic).
// `none_from` (optional) remembers the first `from` past which the text holds none.
size_t end_of_first_special(const Tokenizer& tokenizer, const std::string& text, size_t from,
                            size_t* none_from = nullptr) {
  if (none_from != nullptr && from >= *none_from) return std::string::npos;
  const std::string_view all = std::string_view(text).substr(from);
  std::string_view rest = all.substr(0, 256);
  while (!tokenizer.contains_special_text(rest)) {
    if (rest.size() == all.size()) {
      if (none_from != nullptr) *none_from = from;
      return std::string::npos;
    }
    rest = all.substr(0, 2 * rest.size());
  }
  size_t lo = 0, hi = rest.size();  // rest[0, hi) holds one, rest[0, lo) does not
  while (hi - lo > 1) {
    const size_t mid = lo + (hi - lo) / 2;
    (tokenizer.contains_special_text(rest.substr(0, mid)) ? hi : lo) = mid;
  }
  return from + hi;
}

// Where the text of assistant message i's content ends in `text`, searching from `from`
// (its prompt's end): the end of the content's last text, or `from` when it has none or
// the template changed it past recognition.
size_t content_end(const std::string& text, const ojson& message, size_t from) {
  const std::string content = last_text(message);
  if (content.empty()) return from;
  const size_t at = text.find(content, from);
  return at == std::string::npos ? from : at + content.size();
}

ojson slice(const ojson& messages, size_t begin, size_t end) {
  return ojson(messages.begin() + static_cast<std::ptrdiff_t>(begin), messages.begin() + static_cast<std::ptrdiff_t>(end));
}

// One assistant turn of the whole rendering: its prompt ends at prompt_end, the trained
// text runs to end.
struct DelimitedTurn {
  size_t index = 0;  // in messages
  size_t round = 0;  // the first message after the assistant turn before it (or after the system message)
  size_t prompt_end = 0, end = 0;
};

// The end of assistant turn i's prompt in `full`, from a rendering of the recent rounds
// only: the system message (if any), then messages from the round of the previous
// delimited turn `prev` to i. That rendering must give `prev`'s turn the same text as the
// whole conversation does, and what follows it must be the whole rendering's text at the
// same place; then the prompt of i ends where that text ends. Nullopt when the template
// renders the window differently (a turn counter, a system prompt moved to the last user
// message): the caller renders the whole prefix. Cost: the length of the window, so a
// long conversation splits in linear time.
std::optional<size_t> prompt_end_from_window(const ChatTemplate& chat, const Tokenizer& tokenizer,
                                             const ojson& record, const ojson& messages, const std::string& full,
                                             size_t head, const DelimitedTurn& prev, size_t i,
                                             const std::string& where) {
  if (prev.round <= head) return std::nullopt;  // the window is the whole prefix
  ojson window = slice(messages, 0, head);
  for (size_t k = prev.round; k < prev.index; ++k) window.push_back(messages[k]);
  std::string prev_prompt, text;
  try {
    prev_prompt = render(chat, tokenizer, record, window, true, where);
    for (size_t k = prev.index; k < i; ++k) window.push_back(messages[k]);
    text = render(chat, tokenizer, record, window, true, where);
  } catch (const Error&) {
    return std::nullopt;
  }
  if (!starts_with(text, prev_prompt)) return std::nullopt;
  const size_t prev_end = end_of_first_special(tokenizer, text, content_end(text, messages[prev.index], prev_prompt.size()));
  if (prev_end == std::string::npos) return std::nullopt;
  const size_t turn_length = prev.end - prev.prompt_end;
  if (prev_end - prev_prompt.size() != turn_length ||
      text.compare(prev_prompt.size(), turn_length, full, prev.prompt_end, turn_length) != 0) {
    return std::nullopt;
  }
  const size_t tail = text.size() - prev_end;
  if (full.compare(prev.end, tail, text, prev_end, tail) != 0) return std::nullopt;
  return prev.end + tail;
}

EncodedSample encode_chat(const Tokenizer& tokenizer, const ChatTemplate* chat, const ojson& record, TrainOn train_on,
                          const std::string& where) {
  if (chat == nullptr) {
    throw bad_input(where, "a \"messages\" record needs the tokenizer's chat template, and " + tokenizer.path() +
                               " has none (tokenizer_config.json \"chat_template\")");
  }
  const ojson messages = checked_messages(record["messages"], *chat, where);
  const std::string full = render(*chat, tokenizer, record, messages, false, where);
  EncodedSample out;
  if (train_on == TrainOn::kAll) {
    append_piece(tokenizer, full, 0, full.size(), true, out);
    return out;
  }
  const size_t n = messages.size();
  const size_t head = messages[0]["role"] == "system" ? 1 : 0;
  size_t pos = 0;        // full[0, pos) is encoded
  size_t none_from = std::string::npos;  // full holds no special token from here on
  size_t round = head;   // the first message after the last assistant turn
  std::optional<DelimitedTurn> prev;  // the assistant turn before, when it was delimited
  for (size_t i = 0; i < n; ++i) {
    if (messages[i]["role"] != "assistant") continue;
    const size_t this_round = round;
    round = i + 1;
    std::optional<size_t> prompt_end;
    if (prev) prompt_end = prompt_end_from_window(*chat, tokenizer, record, messages, full, head, *prev, i, where);
    if (!prompt_end) {
      try {
        const std::string prompt = render(*chat, tokenizer, record, slice(messages, 0, i), true, where);
        if (starts_with(full, prompt) && prompt.size() >= pos) prompt_end = prompt.size();
      } catch (const Error&) {
        // e.g. a template that refuses a conversation without a user turn: undelimited
      }
    }
    prev.reset();
    if (!prompt_end) {
      ++out.undelimited_turns;
      continue;
    }
    // The turn ends with the first special token after its content (<|im_end|>,
    // <|eot_id|>, </s>, <end_of_turn>): what the model must generate to stop.
    const size_t end = end_of_first_special(tokenizer, full, content_end(full, messages[i], *prompt_end), &none_from);
    if (end == std::string::npos && i + 1 != n) {
      ++out.undelimited_turns;
      continue;
    }
    append_piece(tokenizer, full, pos, *prompt_end, false, out);
    pos = end == std::string::npos ? full.size() : end;
    append_piece(tokenizer, full, *prompt_end, pos, true, out);
    prev = DelimitedTurn{i, this_round, *prompt_end, pos};
  }
  append_piece(tokenizer, full, pos, full.size(), false, out);
  return out;
}

}  // namespace

TrainOn parse_train_on(const std::string& name) {
  if (name == "completion") return TrainOn::kCompletion;
  if (name == "all") return TrainOn::kAll;
  throw bad_input("prepare.train_on", "unknown value \"" + name + "\" (valid: completion, all)");
}

const char* name_of(TrainOn value) { return value == TrainOn::kAll ? "all" : "completion"; }

bool is_sft_record(const nlohmann::ordered_json& record) {
  return record.is_object() && (record.contains("messages") || record.contains("prompt"));
}

int64_t EncodedSample::trained_tokens() const {
  // The first token is never a target (nothing precedes it), whatever its flag.
  int64_t n = 0;
  for (size_t i = 1; i < trained.size(); ++i) n += trained[i];
  return n;
}

EncodedSample encode_record(const Tokenizer& tokenizer, const ChatTemplate* chat, const nlohmann::ordered_json& record,
                            TrainOn train_on, const std::string& where) {
  if (!record.is_object()) throw bad_input(where, std::string("expected a JSON object, got ") + record.type_name());
  const int shapes = int(record.contains("messages")) + int(record.contains("prompt")) + int(record.contains("text"));
  if (shapes != 1) {
    throw bad_input(where, shapes == 0 ? "expected one of {\"text\"}, {\"prompt\", \"completion\"} or {\"messages\"}"
                                       : "has more than one of \"text\", \"prompt\" and \"messages\": which one to train on "
                                         "is ambiguous");
  }
  if (record.contains("messages")) return encode_chat(tokenizer, chat, record, train_on, where);
  EncodedSample out;
  if (record.contains("text")) {
    const std::string& text = string_field(record, "text", where);
    out.ids = tokenizer.encode(text, true);
    out.trained.assign(out.ids.size(), 1);
    append_eos(tokenizer, true, out);
    return out;
  }
  const std::string& prompt = string_field(record, "prompt", where);
  const std::string& completion = string_field(record, "completion", where);
  out.ids = tokenizer.encode(prompt, true);
  // A template processor that appends eos to every encode (rare) would end the prompt
  // with it: drop it, the sample's eos comes after the completion.
  if (!out.ids.empty() && tokenizer.eos_id() >= 0 && out.ids.back() == tokenizer.eos_id()) out.ids.pop_back();
  out.trained.assign(out.ids.size(), train_on == TrainOn::kAll ? 1 : 0);
  const auto answer = tokenizer.encode(completion, false);
  out.ids.insert(out.ids.end(), answer.begin(), answer.end());
  out.trained.insert(out.trained.end(), answer.size(), 1);
  append_eos(tokenizer, true, out);
  return out;
}

}  // namespace gradguard::data
