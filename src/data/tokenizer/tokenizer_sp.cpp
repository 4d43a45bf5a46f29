// The SentencePiece backend (see tokenizer.h): a .model file through libsentencepiece,
// reached through the plugin plugins/sentencepiece/ (why a plugin: its file comment),
// opened once per process with RTLD_LOCAL | RTLD_DEEPBIND. The plugin is looked for at
// $GRADGUARD_SENTENCEPIECE_PLUGIN, then where this build put it, then where
// `cmake --install` puts it. Ids are SentencePiece's own; with add_special_tokens the
// model's BOS id goes first, as Llama's tokenizer does. SentencePiece renders control
// tokens (<s>, </s>) as nothing; decode() without skip_special_tokens writes their piece
// text between the decoded runs.
#include <dlfcn.h>

#include <cstdlib>
#include <mutex>

#include "gradguard/core/error.h"
#include "gradguard/core/fs.h"
#include "tokenizer_internal.h"

#ifndef GRADGUARD_SENTENCEPIECE_PLUGIN_PATHS
#define GRADGUARD_SENTENCEPIECE_PLUGIN_PATHS ""
#endif

namespace gradguard::data::detail {

namespace {

struct PluginApi {
  int (*version)();
  void* (*load)(const char*, size_t, char*, size_t);
  void (*free)(void*);
  void (*release)(void*);
  void (*info)(void*, int*);
  int (*encode)(void*, const char*, size_t, int**, size_t*, char*, size_t);
  int (*decode)(void*, const int*, size_t, char**, size_t*, char*, size_t);
  char* (*piece)(void*, int, size_t*);
  int (*piece_id)(void*, const char*, size_t);
  int (*is_control)(void*, int);
};

template <class F>
void bind(void* handle, const char* name, F* out, const std::string& path) {
  *out = reinterpret_cast<F>(dlsym(handle, name));
  if (*out == nullptr) throw runtime_error(path, std::string("is not a gradguard SentencePiece plugin (no ") + name + ")");
}

// The plugin, opened on first use; its error when it cannot be.
const PluginApi& plugin() {
  static std::once_flag once;
  static PluginApi api;
  static std::string failure;
  std::call_once(once, [] {
    std::vector<std::string> candidates;
    if (const char* env = std::getenv("GRADGUARD_SENTENCEPIECE_PLUGIN"); env && *env) candidates.push_back(env);
    const std::string built = GRADGUARD_SENTENCEPIECE_PLUGIN_PATHS;
    for (size_t begin = 0; begin <= built.size();) {
      const size_t end = std::min(built.find(':', begin), built.size());
      if (end > begin) candidates.push_back(built.substr(begin, end - begin));
      begin = end + 1;
    }
    std::string tried;
    for (const std::string& path : candidates) {
      tried += (tried.empty() ? "" : ", ") + path;
      if (!fs::exists(path)) continue;
      void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
      if (handle == nullptr) {
        failure = std::string("cannot open the SentencePiece plugin ") + path + ": " + dlerror();
        return;
      }
      try {
        bind(handle, "gg_sp_version", &api.version, path);
        if (api.version() != 1) throw runtime_error(path, "is a SentencePiece plugin of another version");
        bind(handle, "gg_sp_load", &api.load, path);
        bind(handle, "gg_sp_free", &api.free, path);
        bind(handle, "gg_sp_release", &api.release, path);
        bind(handle, "gg_sp_info", &api.info, path);
        bind(handle, "gg_sp_encode", &api.encode, path);
        bind(handle, "gg_sp_decode", &api.decode, path);
        bind(handle, "gg_sp_piece", &api.piece, path);
        bind(handle, "gg_sp_piece_id", &api.piece_id, path);
        bind(handle, "gg_sp_is_control", &api.is_control, path);
        failure.clear();
      } catch (const Error& e) {
        failure = e.what();
      }
      return;
    }
    failure = "SentencePiece .model files need the plugin libgradguard_sentencepiece.so, built when "
              "libsentencepiece-dev is installed (scripts/setup.sh installs it); not found at " +
              (tried.empty() ? std::string("any configured path") : tried) +
              " (GRADGUARD_SENTENCEPIECE_PLUGIN names another)";
  });
  if (!failure.empty()) throw runtime_error("sentencepiece", failure);
  return api;
}

class SentencePieceTokenizer final : public TokenizerBackend {
 public:
  SentencePieceTokenizer(const std::string& model_bytes, const std::string& where) : api_(plugin()) {
    char error[512] = {};
    handle_ = api_.load(model_bytes.data(), model_bytes.size(), error, sizeof error);
    if (handle_ == nullptr) throw bad_input(where, std::string("is not a SentencePiece model: ") + error);
    int info[5];
    api_.info(handle_, info);
    size_ = info[0];
    bos_ = info[1];
    eos_ = info[2];
    pad_ = info[3];
    if (size_ <= 0) throw bad_input(where, "the SentencePiece model has no pieces");
    control_.assign(static_cast<size_t>(size_), false);
    for (int id = 0; id < size_; ++id) {
      if (api_.is_control(handle_, id)) {
        control_[static_cast<size_t>(id)] = true;
        control_texts_.push_back(token_text(id));
      }
    }
  }
  ~SentencePieceTokenizer() override { api_.free(handle_); }

  void encode(std::string_view text, bool add_special_tokens, std::vector<int32_t>* ids) const override {
    int* pieces = nullptr;
    size_t count = 0;
    char error[512] = {};
    if (api_.encode(handle_, text.data(), text.size(), &pieces, &count, error, sizeof error) != 0) {
      throw runtime_error("tokenizer", std::string("SentencePiece encode failed: ") + error);
    }
    if (add_special_tokens && bos_ >= 0) ids->push_back(bos_);
    ids->insert(ids->end(), pieces, pieces + count);
    api_.release(pieces);
  }

  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const override {
    std::string out;
    std::vector<int> run;
    const auto flush = [&] {
      if (run.empty()) return;
      char* text = nullptr;
      size_t length = 0;
      char error[512] = {};
      if (api_.decode(handle_, run.data(), run.size(), &text, &length, error, sizeof error) != 0) {
        throw runtime_error("tokenizer", std::string("SentencePiece decode failed: ") + error);
      }
      out.append(text, length);
      api_.release(text);
      run.clear();
    };
    for (const int32_t id : ids) {
      if (control_[static_cast<size_t>(id)]) {
        flush();
        if (!skip_special_tokens) out += token_text(id);
        continue;
      }
      run.push_back(id);
    }
    flush();
    return out;
  }

  int64_t vocab_size() const override { return size_; }
  int32_t token_id(std::string_view token) const override {
    return api_.piece_id(handle_, token.data(), token.size());
  }
  std::string token_text(int32_t id) const override {
    if (id < 0 || id >= size_) return "";
    size_t length = 0;
    char* text = api_.piece(handle_, id, &length);
    std::string out(text, length);
    api_.release(text);
    return out;
  }
  bool is_special(int32_t id) const override { return id >= 0 && id < size_ && control_[static_cast<size_t>(id)]; }
  bool contains_special_text(std::string_view text) const override {
    for (const std::string& control : control_texts_) {
      if (!control.empty() && text.find(control) != std::string_view::npos) return true;
    }
    return false;
  }
  int32_t builtin_bos() const override { return bos_; }
  int32_t builtin_eos() const override { return eos_; }
  int32_t builtin_pad() const override { return pad_; }

 private:
  const PluginApi& api_;
  void* handle_ = nullptr;
  int size_ = 0, bos_ = -1, eos_ = -1, pad_ = -1;
  std::vector<bool> control_;  // [id]
  std::vector<std::string> control_texts_;
};

}  // namespace

std::unique_ptr<TokenizerBackend> load_sentencepiece(const std::string& model_bytes, const std::string& where) {
  return std::make_unique<SentencePieceTokenizer>(model_bytes, where);
}

}  // namespace gradguard::data::detail
