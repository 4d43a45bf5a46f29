// `gradguard tokenize --tokenizer DIR [--no-special] [--decode] FILE`: the ids of a text
// file as one JSON array, or (--decode) the text of a JSON array of ids. Users debug
// chat templates and tokenizers with it, and comparing with any reference
// implementation is one diff (tools/tokenizer_reference.mjs prints the same form).
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <iterator>

#include "commands.h"
#include "gradguard/core/error.h"
#include "gradguard/core/fs.h"
#include "gradguard/core/json_read.h"
#include "gradguard/data/tokenizer/tokenizer.h"

namespace gradguard::cli {

namespace {

struct TokenizeArgs {
  std::string tokenizer, file;
  bool no_special = false, decode = false;
};

std::string read_input(const std::string& file) {
  if (file != "-") return fs::read_file(file);
  return std::string(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
}

std::vector<int32_t> read_ids(const std::string& text, const std::string& where) {
  JsonLimits limits;
  limits.max_bytes = size_t{1} << 30;
  const nlohmann::json value = parse_json(text, where, limits, /*require_object=*/false);
  if (!value.is_array()) throw bad_input(where, "must be a JSON array of token ids, not " + describe(value));
  std::vector<int32_t> ids;
  ids.reserve(value.size());
  for (size_t i = 0; i < value.size(); ++i) {
    const auto& v = value[i];
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX) {
      throw bad_input(where, "element " + std::to_string(i) + " is " + describe(v) + ", not a token id (an integer >= 0)");
    }
    ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
  }
  return ids;
}

void write_all(const std::string& text) {
  if (std::fwrite(text.data(), 1, text.size(), stdout) != text.size() || std::fflush(stdout) != 0) {
    throw runtime_error("stdout", "write failed");
  }
}

}  // namespace

void add_tokenize_command(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand("tokenize", "Print the token ids of a text file as a JSON array (--decode: the reverse)");
  auto args = std::make_shared<TokenizeArgs>();
  cmd->add_option("-t,--tokenizer", args->tokenizer,
                  "Model directory (tokenizer.json or tokenizer.model), a tokenizer.json or a SentencePiece .model")
      ->required();
  cmd->add_option("file", args->file, "Text file to encode, or with --decode a JSON array of ids; - reads stdin")
      ->required();
  cmd->add_flag("--no-special", args->no_special,
                "Encode without the special tokens the tokenizer adds (<s>); with --decode, leave special tokens out");
  cmd->add_flag("--decode", args->decode, "Read a JSON array of ids and print its text");
  cmd->callback([&action, args] {
    action = [args] {
      const data::Tokenizer tokenizer = data::Tokenizer::load(args->tokenizer);
      const std::string input = read_input(args->file);
      const std::string where = args->file == "-" ? "stdin" : args->file;
      if (args->decode) {
        write_all(tokenizer.decode(read_ids(input, where), args->no_special));
        return 0;
      }
      const auto start = std::chrono::steady_clock::now();
      const std::vector<int32_t> ids = tokenizer.encode(input, !args->no_special);
      if (std::getenv("GRADGUARD_TOKENIZE_TIMING")) {
        // For bench/tokenizer_compare.sh: the encode call alone, as the reference script times it.
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        std::fprintf(stderr, "encode %.3f MB/s\n", static_cast<double>(input.size()) / seconds / 1e6);
      }
      std::string out = "[";
      for (size_t i = 0; i < ids.size(); ++i) {
        if (i) out += ',';
        out += std::to_string(ids[i]);
      }
      out += "]\n";
      write_all(out);
      return 0;
    };
  });
}

}  // namespace gradguard::cli
