// The SentencePiece plugin: libsentencepiece behind a small C interface, built as its own
// shared object (libgradguard_sentencepiece.so) and opened by src/data/tokenizer/tokenizer_sp.cpp
// with RTLD_LOCAL | RTLD_DEEPBIND.
//
// Why a plugin: Debian's libsentencepiece carries its own protobuf and exports those
// symbols; LibTorch loads the system libprotobuf (through ONNX). Linked into one program,
// each library's protobuf calls resolve into the other's copy and the process crashes in
// static initialisation, before main. Opened with RTLD_DEEPBIND, this object and
// libsentencepiece resolve their symbols among themselves first, and nothing of theirs
// enters the program's global scope, so the two protobufs never meet. Only C types cross
// the boundary; memory handed out here is released by gg_sp_release.
#include <sentencepiece_processor.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

void set_error(char* error, size_t capacity, const std::string& message) {
  if (error == nullptr || capacity == 0) return;
  const size_t n = std::min(capacity - 1, message.size());
  std::memcpy(error, message.data(), n);
  error[n] = '\0';
}

char* copy_out(const std::string& text, size_t* length) {
  char* out = static_cast<char*>(std::malloc(text.size() + 1));
  if (out == nullptr) return nullptr;
  std::memcpy(out, text.data(), text.size());
  out[text.size()] = '\0';
  *length = text.size();
  return out;
}

sentencepiece::SentencePieceProcessor* processor(void* handle) {
  return static_cast<sentencepiece::SentencePieceProcessor*>(handle);
}

}  // namespace

extern "C" {

// The interface version; the loader refuses a plugin of another.
int gg_sp_version() { return 1; }

// A processor for the serialized model `bytes`, or null with `error` filled.
void* gg_sp_load(const char* bytes, size_t size, char* error, size_t error_capacity) {
  auto* p = new (std::nothrow) sentencepiece::SentencePieceProcessor();
  if (p == nullptr) return nullptr;
  const auto status = p->LoadFromSerializedProto(std::string(bytes, size));
  if (!status.ok()) {
    set_error(error, error_capacity, status.ToString());
    delete p;
    return nullptr;
  }
  return p;
}

void gg_sp_free(void* handle) { delete processor(handle); }
void gg_sp_release(void* memory) { std::free(memory); }

// [size, bos, eos, pad, unk] ids (-1 where the model has none).
void gg_sp_info(void* handle, int* out) {
  auto* p = processor(handle);
  out[0] = p->GetPieceSize();
  out[1] = p->bos_id();
  out[2] = p->eos_id();
  out[3] = p->pad_id();
  out[4] = p->unk_id();
}

// 0 and *ids (gg_sp_release it) on success; -1 with `error` filled.
int gg_sp_encode(void* handle, const char* text, size_t size, int** ids, size_t* count, char* error,
                 size_t error_capacity) {
  std::vector<int> pieces;
  const auto status = processor(handle)->Encode(std::string(text, size), &pieces);
  if (!status.ok()) {
    set_error(error, error_capacity, status.ToString());
    return -1;
  }
  *ids = static_cast<int*>(std::malloc(std::max<size_t>(1, pieces.size()) * sizeof(int)));
  if (*ids == nullptr) return -1;
  if (!pieces.empty()) std::memcpy(*ids, pieces.data(), pieces.size() * sizeof(int));
  *count = pieces.size();
  return 0;
}

// 0 and *text (gg_sp_release it) on success; -1 with `error` filled.
int gg_sp_decode(void* handle, const int* ids, size_t count, char** text, size_t* length, char* error,
                 size_t error_capacity) {
  std::string out;
  const auto status = processor(handle)->Decode(std::vector<int>(ids, ids + count), &out);
  if (!status.ok()) {
    set_error(error, error_capacity, status.ToString());
    return -1;
  }
  *text = copy_out(out, length);
  return *text == nullptr ? -1 : 0;
}

// The piece of `id` (gg_sp_release it).
char* gg_sp_piece(void* handle, int id, size_t* length) { return copy_out(processor(handle)->IdToPiece(id), length); }

// The id of a piece, or -1 (PieceToId answers unk for unknown pieces; only the unk piece
// itself maps there).
int gg_sp_piece_id(void* handle, const char* piece, size_t size) {
  auto* p = processor(handle);
  const std::string text(piece, size);
  const int id = p->PieceToId(text);
  return id == p->unk_id() && p->IdToPiece(id) != text ? -1 : id;
}

int gg_sp_is_control(void* handle, int id) { return processor(handle)->IsControl(id) ? 1 : 0; }

}  // extern "C"
