// `gradguard export SOURCE --out DIR`: writes an HF-style directory (config.json +
// model.safetensors) from a checkpoint directory or from a run directory (its newest
// checkpoint that verifies). The tensors are loaded and validated against the config,
// then written anew and read back: every tensor of the written directory must equal the
// model's bit for bit before the command reports success.
#include <cstdio>
#include <filesystem>

#include "commands.h"
#include "gradguard/checkpoint/hf_checkpoint.h"
#include "gradguard/checkpoint/trainer_checkpoint.h"
#include "gradguard/core/error.h"
#include "gradguard/core/fs.h"
#include "gradguard/core/run_dir.h"

namespace gradguard::cli {

void add_export_command(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand("export", "Write an HF-style directory (config.json, model.safetensors) from a checkpoint");
  auto source = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  auto force = std::make_shared<bool>(false);
  cmd->add_option("source", *source, "Checkpoint directory, or a run directory (its newest good checkpoint)")->required();
  cmd->add_option("-o,--out", *out, "Output directory")->required();
  cmd->add_flag("--force", *force, "Overwrite files in an existing output directory");
  cmd->callback([&action, source, out, force] {
    action = [source, out, force] {
      namespace stdfs = std::filesystem;
      std::string dir = *source;
      if (stdfs::is_directory(RunDir(dir).checkpoints())) {
        std::vector<std::string> rejected;
        dir = checkpoint::find_resumable(dir, &rejected);
        for (const auto& r : rejected) std::fprintf(stderr, "skipped checkpoint: %s\n", r.c_str());
      } else if (fs::exists(dir + "/manifest.json")) {
        checkpoint::verify_checkpoint(dir);
      }
      if (!*force && (fs::exists(*out + "/model.safetensors") || fs::exists(*out + "/config.json")))
        throw bad_input(*out, "already holds a model; --force overwrites it");
      auto options = checkpoint::read_hf_config(dir, model::LlamaOptions{});
      model::LlamaForCausalLM model(options);
      checkpoint::load_hf_weights(dir, *model);
      checkpoint::save_hf_model(*out, *model);
      // Read the written directory back as a user's init_from would and compare every
      // tensor bit for bit, so an export that would not reload exactly never reports success.
      auto reread = checkpoint::read_hf_config(*out, model::LlamaOptions{});
      model::LlamaForCausalLM copy(reread);
      checkpoint::load_hf_weights(*out, *copy);
      const auto written = model->named_parameters();
      const auto loaded = copy->named_parameters();
      for (const auto& item : written) {
        const auto* other = loaded.find(item.key());
        if (other == nullptr || other->scalar_type() != item.value().scalar_type() ||
            !other->sizes().equals(item.value().sizes()) || !torch::equal(*other, item.value()))
          throw runtime_error(*out, "tensor '" + item.key() + "' does not read back bit-identically after export");
      }
      std::printf("exported %s -> %s (%lld parameters; reloaded bit-identically, %zu tensors)\n", dir.c_str(),
                  out->c_str(), (long long)model::count_parameters(*model), written.size());
      return 0;
    };
  });
}

}  // namespace gradguard::cli
