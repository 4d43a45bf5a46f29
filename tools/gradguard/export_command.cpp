// `gradguard export SOURCE --out DIR`: writes an HF-style directory (config.json +
// model.safetensors) from a checkpoint directory or from a run directory (its newest
// checkpoint that verifies). The tensors are loaded and validated against the config,
// then written anew and read back: every tensor of the written directory must equal the
// model's bit for bit before the command reports success.
//
// A LoRA checkpoint (its lora.json, model/lora.h) exports as the merged model in DIR (each
// adapted weight W + (alpha / r) B A) and the adapter alone, as PEFT writes it, in
// DIR/adapter/ (adapter_model.safetensors, adapter_config.json). The adapter is kept out of
// DIR itself, where a loader that finds adapter_config.json would apply it a second time
// on top of the merged weights. Checked before success: the merged tensors and the adapter
// tensors read back bit for bit, and the reloaded merged model's logits on a probe
// sequence equal the adapted model's to 1e-5 of their largest magnitude.
//
// --dtype: `auto` writes the weights the run computed with, in their dtype (the
// checkpoint's config.json torch_dtype: bf16 weights as bf16, even when the optimizer kept
// float32 masters; a LoRA export's merged weights are float32, as merging in bf16 would
// round W + (alpha / r) B A); `fp32` writes the float32 master
// weights of a run that kept them (memory.master_weights with bf16/fp16 weights, or
// offload; ZeRO's shards gathered), and the weights as float32 for a run whose weights
// were float32 already. A low-precision run without masters has no float32 weights to
// write: exit 2.
#include <cstdio>
#include <filesystem>

#include "commands.h"
#include "gradguard/checkpoint/hf_checkpoint.h"
#include "gradguard/checkpoint/optimizer_shards.h"
#include "gradguard/checkpoint/safetensors.h"
#include "gradguard/checkpoint/trainer_checkpoint.h"
#include "gradguard/core/error.h"
#include "gradguard/core/fs.h"
#include "gradguard/core/json_read.h"
#include "gradguard/core/run_dir.h"

namespace gradguard::cli {

namespace {

// --dtype fp32: the model in float32 with the checkpoint's master weights (where it kept
// them) in place of its working weights, which are stored as `saved`. Returns the note
// for the summary line.
std::string use_master_weights(const std::string& dir, at::ScalarType saved, model::LlamaForCausalLM& model) {
  const auto masters = checkpoint::load_master_weights(dir);
  if (masters.empty()) {
    if (saved != torch::kFloat)
      throw bad_input("--dtype", "fp32 writes the optimizer's float32 master weights, and " + dir +
                                     " has none: its weights are " + std::string(c10::toString(saved)) +
                                     " (trained with memory.master_weights false); export --dtype auto writes them");
    return ", float32 weights";
  }
  model->to(torch::kFloat);
  torch::NoGradGuard no_grad;
  auto params = model->named_parameters();
  for (const auto& [name, flat] : masters) {
    auto* p = params.find(name);
    if (p == nullptr || p->numel() != flat.numel())
      throw bad_input(dir + "/optimizer_shards.json",
                      "lists \"" + name + "\" of " + std::to_string(flat.numel()) +
                          " elements, which this checkpoint's model " + (p ? "has with another size" : "does not have"));
    p->copy_(flat.view_as(*p));
  }
  return ", float32 master weights of " + std::to_string(masters.size()) + " tensors";
}

}  // namespace

void add_export_command(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand("export", "Write an HF-style directory (config.json, model.safetensors) from a checkpoint");
  auto source = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  auto force = std::make_shared<bool>(false);
  auto dtype = std::make_shared<std::string>("auto");
  cmd->add_option("source", *source, "Checkpoint directory, or a run directory (its newest good checkpoint)")->required();
  cmd->add_option("-o,--out", *out, "Output directory")->required();
  cmd->add_flag("--force", *force, "Overwrite files in an existing output directory");
  cmd->add_option("--dtype", *dtype,
                  "auto (the weights the run computed with) | fp32 (the optimizer's float32 master weights)")
      ->check(CLI::IsMember({"auto", "fp32"}))
      ->capture_default_str();
  cmd->callback([&action, source, out, force, dtype] {
    action = [source, out, force, dtype] {
      namespace stdfs = std::filesystem;
      std::string dir = *source;
      if (stdfs::is_directory(RunDir(dir).checkpoints())) {
        std::vector<std::string> rejected;
        dir = checkpoint::find_resumable(dir, &rejected);
        for (const auto& r : rejected) std::fprintf(stderr, "skipped checkpoint: %s\n", r.c_str());
      } else if (fs::exists(dir + "/manifest.json")) {
        checkpoint::verify_checkpoint(dir);
      }
      // Never over its own source or any training state, whatever --force says: a
      // checkpoint rewritten in place no longer matches its manifest (and a LoRA one loses
      // its adapters), so everything is checked before the first byte is written.
      std::error_code ec;
      const auto out_path = stdfs::weakly_canonical(*out, ec);
      const auto src_path = stdfs::weakly_canonical(dir, ec);
      const auto inside = [](const stdfs::path& p, const stdfs::path& root) {
        const auto rel = p.lexically_relative(root);
        return !rel.empty() && *rel.begin() != "..";
      };
      if (stdfs::exists(*out) && !stdfs::is_directory(*out))
        throw bad_input(*out, "is a file, not a directory: --out names the directory to write the model into");
      if (inside(out_path, src_path))
        throw bad_input(*out, "is " + std::string(out_path == src_path ? "" : "inside ") + "the checkpoint being "
                              "exported (" + dir + "): writing there would destroy it; choose another --out");
      if (fs::exists(*out + "/manifest.json") || fs::exists(*out + "/trainer_state.json") ||
          fs::exists(*out + "/optimizer.pt"))
        throw bad_input(*out, "holds a training checkpoint (manifest.json, trainer_state.json or optimizer.pt): "
                              "export does not write over one, even with --force; choose another --out");
      if (stdfs::is_directory(RunDir(*out).checkpoints()) || RunDir(*out).holds_run())
        throw bad_input(*out, "is a run directory: export does not write into one, even with --force; choose "
                              "another --out");
      const std::string adapter_dir = *out + "/adapter";
      if (!*force && (fs::exists(*out + "/model.safetensors") || fs::exists(*out + "/config.json") ||
                      fs::exists(adapter_dir + "/adapter_model.safetensors")))
        throw bad_input(*out, "already holds a model; --force overwrites it");
      auto model = checkpoint::load_hf_model(dir, model::LlamaOptions{});
      model->eval();
      std::string precision;
      const auto working = checkpoint::saved_weights_dtype(dir);
      if (*dtype == "fp32") {
        precision = use_master_weights(dir, working, model);
      } else if (working != torch::kFloat && !model->lora().enabled()) {
        model->to(working);  // the loaded values are the checkpoint's, exactly
        precision = std::string(", ") + c10::toString(working) + " weights";
      }
      const bool lora = model->lora().enabled();
      checkpoint::save_hf_model(*out, *model, 0, /*merged=*/lora);
      std::string base;  // the directory the adapters were trained on
      if (lora) {
        const auto config = read_json_file(dir + "/lora.json");
        if (config.contains("base_model_name_or_path") && config["base_model_name_or_path"].is_string())
          base = config["base_model_name_or_path"].get<std::string>();
        checkpoint::save_peft_adapter(adapter_dir, *model, base);
      } else {
        // --force over an earlier LoRA export: its adapter does not belong to this model.
        for (const char* name : {"adapter_model.safetensors", "adapter_config.json"})
          std::filesystem::remove(adapter_dir + "/" + name);
      }
      // Read the written directory back as a user's init_from would and compare every
      // tensor bit for bit, so an export that would not reload exactly never reports success.
      auto reread = checkpoint::read_hf_config(*out, model::LlamaOptions{});
      model::LlamaForCausalLM copy(reread);
      checkpoint::load_hf_weights(*out, *copy);
      copy->eval();
      const auto written = model::merged_weights(*model);
      const auto loaded = copy->named_parameters();
      auto check_same = [&](const std::string& file, const std::string& name, const torch::Tensor& want,
                            const torch::Tensor* got) {
        // The reloaded model computes in float32: a bf16 file's values compare exactly there.
        if (got == nullptr || !got->sizes().equals(want.sizes()) || !torch::equal(*got, want.to(got->scalar_type())))
          throw runtime_error(file, "tensor '" + name + "' does not read back bit-identically after export");
      };
      for (const auto& [name, t] : written) check_same(*out, name, t, loaded.find(name));
      if (const auto want = model->model->embed_tokens->weight.scalar_type(); checkpoint::saved_weights_dtype(*out) != want)
        throw runtime_error(*out + "/config.json", std::string("names another torch_dtype than the ") +
                                                        c10::toString(want) + " weights written");
      std::string detail;
      if (lora) {
        const auto adapter = checkpoint::load_safetensors(adapter_dir + "/adapter_model.safetensors").tensors;
        const auto tensors = model::peft_adapter_tensors(*model);
        if (adapter.size() != tensors.size())
          throw runtime_error(adapter_dir, "adapter_model.safetensors holds " + std::to_string(adapter.size()) +
                                               " tensors, the model " + std::to_string(tensors.size()));
        for (const auto& [name, t] : tensors) {
          auto it = adapter.find(name);
          check_same(adapter_dir + "/adapter_model.safetensors", name, t, it == adapter.end() ? nullptr : &it->second);
        }
        torch::NoGradGuard no_grad;
        const int64_t T = std::min<int64_t>(16, model->options().max_seq_len);
        const auto probe = (torch::arange(T, torch::kLong) * 7919 % model->options().vocab_size).unsqueeze(0);
        const auto want = model->forward(probe), got = copy->forward(probe);
        const double scale = std::max(1.0, want.abs().max().item<double>());
        const double diff = (want - got).abs().max().item<double>();
        if (!(diff <= 1e-5 * scale))
          throw runtime_error(*out, "the merged model's logits differ from the adapted model's by " +
                                        format_number(diff) + " (largest logit " + format_number(scale) +
                                        "): the merge is wrong");
        char within[32];
        std::snprintf(within, sizeof within, "%.1e", diff / scale);
        detail = "; LoRA rank " + std::to_string(model->lora().rank) + " merged (logits within " + within +
                 "), adapter in " + adapter_dir;  // a path of any length, never cut
      }
      std::printf("exported %s -> %s (%lld parameters%s; reloaded bit-identically, %zu tensors%s)\n", dir.c_str(),
                  out->c_str(), (long long)model::count_parameters(*copy), precision.c_str(), written.size(),
                  detail.c_str());
      return 0;
    };
  });
}

}  // namespace gradguard::cli
