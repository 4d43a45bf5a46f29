// `gradguard generate --model DIR --prompt TEXT`: text from a model directory (a run's
// checkpoint, an export, a downloaded model), streamed as it comes (apps/generate.h).
#include <cstdio>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "gradguard/apps/generate.h"

namespace gradguard::cli {

void add_generate_command(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand("generate", "Generate text from a model directory (chat template applied, KV cache)");
  auto o = std::make_shared<generate::GenerateOptions>();
  auto json = std::make_shared<bool>(false);
  cmd->add_option("-m,--model", o->model_dir, "Hugging Face model directory (config.json, weights, tokenizer.json)")
      ->required();
  cmd->add_option("-p,--prompt", o->prompt, "The user's text (one user turn of the chat template)")->required();
  cmd->add_option("-n,--max-new-tokens", o->max_new_tokens, "Tokens to generate at most")->capture_default_str();
  cmd->add_option("--temperature", o->temperature, "0 = greedy; > 0 samples")->capture_default_str();
  cmd->add_option("--top-p", o->top_p, "Nucleus sampling: the smallest set of tokens reaching this probability")
      ->capture_default_str();
  cmd->add_option("--seed", o->seed, "Seed of the sampling")->capture_default_str();
  cmd->add_flag("--raw", o->raw, "Plain text: no chat template");
  cmd->add_option("--device", o->device, "cpu | cuda | cuda:N")->capture_default_str();
  cmd->add_flag("--json", *json, "Print one JSON object (prompt, ids, text, stop) instead of streaming the text");
  cmd->callback([&action, o, json] {
    action = [o, json] {
      const auto print = [](const std::string& piece) {
        std::fputs(piece.c_str(), stdout);
        std::fflush(stdout);
      };
      const auto r = generate::generate(*o, *json ? std::function<void(const std::string&)>() : print);
      if (*json) {
        const nlohmann::ordered_json j = {{"prompt", r.prompt_text},    {"chat_template", r.chat_template},
                                          {"prompt_ids", r.prompt_ids}, {"new_ids", r.new_ids},
                                          {"text", r.text},             {"stop", r.stop}};
        std::printf("%s\n", j.dump().c_str());
      } else {
        std::printf("\n");
      }
      return 0;
    };
  });
}

}  // namespace gradguard::cli
