// Supervised fine-tuning records -> token ids with a per-token training flag. One JSONL
// line is one record in one of three shapes:
//
//   {"text": "..."}                               every token trained (plain language modelling)
//   {"prompt": "...", "completion": "..."}        prompt (with the tokenizer's special tokens,
//                                                 e.g. Llama's <s>) not trained; completion
//                                                 + eos trained
//   {"messages": [{"role", "content"}, ...]}      rendered through the model's chat template
//                                                 (tokenizer_config.json), assistant turns
//                                                 trained; optional "tools" is passed to it
//
// A "content" may be a list of parts, [{"type": "text", "text": "..."}, ...] (OpenAI's and
// HF's multimodal form): a template that loops over a message's content gets the list; one
// that expects a string gets the texts joined by "\n". A part of another type (image,
// audio) is an error naming file:line and messages[i].content[j].
//
// How a chat is split (docs/data.md): the whole conversation is rendered once. Assistant
// turn i starts where the rendering of messages[:i] with add_generation_prompt=true ends
// (it must be a prefix of the whole) and ends with the first special token after its
// content (<|im_end|>, <|eot_id|>, </s>: what the model must generate to stop; the last
// turn may also run to the end). Each piece is tokenized on its own (no special tokens
// added: the template writes them), which is how the model sees a prompt and then its own
// answer when it generates. A turn that cannot be delimited so (its prompt rendered alone
// is not a prefix of the conversation, or the template refuses it) stays untrained and
// is counted. A turn after a delimited one is found from the recent rounds only, checked
// against the whole rendering (docs/data.md), so a long conversation splits in linear
// time.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "gradguard/data/chat_template/chat_template.h"
#include "gradguard/data/tokenizer/tokenizer.h"

namespace gradguard::data {

enum class TrainOn { kCompletion, kAll };  // kCompletion: assistant turns / completions only

TrainOn parse_train_on(const std::string& name);  // "completion" | "all"; throws naming prepare.train_on
const char* name_of(TrainOn value);

// True for a record that is not plain text: it has "messages" or "prompt".
bool is_sft_record(const nlohmann::ordered_json& record);

struct EncodedSample {
  std::vector<int32_t> ids;
  std::vector<uint8_t> trained;  // [ids] 1 when the token is a training target
  int64_t undelimited_turns = 0; // assistant turns left untrained (see above)
  int64_t trained_tokens() const;
};

// Encodes one record. `chat` is the model's template (null when it has none: a messages
// record is then an error). Throws gradguard::Error (bad input) naming `where` (file:line)
// and the problem: a shape above not matched, a field of the wrong type, a message that is
// not an object with a string "role" in system/user/assistant/tool, a template that raises.
EncodedSample encode_record(const Tokenizer& tokenizer, const ChatTemplate* chat, const nlohmann::ordered_json& record,
                            TrainOn train_on, const std::string& where);

}  // namespace gradguard::data
