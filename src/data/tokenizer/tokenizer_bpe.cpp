// See tokenizer_internal.h (Bpe). Merging keeps the symbols of a word in a linked list
// and the candidate pairs in a heap ordered by (rank, position of the pair's left
// symbol): the lowest rank merges first and, among equal ranks, the leftmost, which is
// the order the reference's heap (rank plus a position fraction) produces. A merged
// symbol keeps its left part's position. Stale heap entries (a part already merged
// away) are recognised on pop and dropped. That makes a word of n symbols O(n log n),
// so a 100,000-character run of spaces costs milliseconds, not minutes.
//
// Symbols are ids: each character (or byte) is looked up once, merges are a hash map
// from an id pair to (rank, merged id). A character that is not in the vocabulary is an
// unknown symbol (-1 - its byte offset) that never merges; it is emitted as byte-fallback
// tokens <0xHH> when all of its bytes have one, else as the unk token, else dropped, as
// the reference does.
#include <algorithm>
#include <atomic>
#include <cstdio>

#include "gradguard/core/error.h"
#include "tokenizer_internal.h"
#include "unicode_text.h"

namespace gradguard::data::detail {

namespace {
std::atomic<uint64_t> g_next_bpe_serial{1};

uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

// Per-thread cache of encoded words: [Bpe serial] -> (byte_level flag + word) -> ids.
struct WordCache {
  uint64_t serial = 0;
  std::unordered_map<std::string, std::vector<int32_t>> words;
};
constexpr size_t kCacheMaxWords = 1 << 18;
constexpr size_t kCacheMaxWordBytes = 256;
}  // namespace

Bpe::Bpe(std::unordered_map<std::string, int32_t> vocab,
         const std::vector<std::pair<std::string, std::string>>& merges, Options options, const std::string& where)
    : vocab_(std::move(vocab)), options_(std::move(options)), serial_(g_next_bpe_serial++) {
  if (!options_.unk_token.empty()) {
    const auto it = vocab_.find(options_.unk_token);
    if (it == vocab_.end()) {
      throw bad_input(where, "model.unk_token \"" + options_.unk_token + "\" is not in model.vocab");
    }
    unk_id_ = it->second;
  }
  merges_.reserve(merges.size() * 2);
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [left, right] = merges[rank];
    const int32_t l = lookup(left), r = lookup(right), m = lookup(left + right);
    if (l == kNoToken || r == kNoToken || m == kNoToken) {
      throw bad_input(where, "model.merges[" + std::to_string(rank) + "]: \"" + left + " " + right + "\": " +
                                 (l == kNoToken   ? "\"" + left + "\" is not in model.vocab"
                                  : r == kNoToken ? "\"" + right + "\" is not in model.vocab"
                                                  : "the merged token is not in model.vocab"));
    }
    // A pair listed twice takes its last rank, as in the reference's map.
    merges_[pair_key(l, r)] = std::make_pair(static_cast<int32_t>(rank), m);
  }
  const ByteLevelTable& table = byte_level_table();
  byte_ids_.assign(256, kNoToken);
  fallback_ids_.assign(256, kNoToken);
  has_all_fallback_ = true;
  for (int b = 0; b < 256; ++b) {
    byte_ids_[b] = lookup(table.byte_to_utf8[b]);
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    fallback_ids_[b] = lookup(name);
    has_all_fallback_ = has_all_fallback_ && fallback_ids_[b] != kNoToken;
  }
  if (options_.ignore_merges) {
    // Byte-level words arrive as raw bytes: index the vocabulary by the bytes its
    // GPT-2-character forms stand for.
    for (const auto& [text, id] : vocab_) {
      std::string bytes;
      bool all_mapped = true;
      for (size_t pos = 0; pos < text.size() && all_mapped;) {
        const int b = table.char_to_byte(next_code_point(text, &pos));
        all_mapped = b >= 0;
        bytes.push_back(static_cast<char>(b));
      }
      if (all_mapped && !bytes.empty()) byte_level_words_.emplace(std::move(bytes), id);
    }
  }
}

int32_t Bpe::lookup(std::string_view token) const {
  const auto it = vocab_.find(std::string(token));
  return it == vocab_.end() ? kNoToken : it->second;
}

void Bpe::emit_unknown(std::string_view text, std::vector<int32_t>* ids) const {
  if (options_.byte_fallback) {
    bool all = true;
    for (const char c : text) all = all && fallback_ids_[static_cast<unsigned char>(c)] != kNoToken;
    if (all) {
      for (const char c : text) ids->push_back(fallback_ids_[static_cast<unsigned char>(c)]);
      return;
    }
  }
  if (unk_id_ != kNoToken) ids->push_back(unk_id_);
}

void Bpe::merge_symbols(std::vector<int32_t>* symbols) const {
  const size_t n = symbols->size();
  if (n < 2) return;
  std::vector<int32_t>& id = *symbols;
  std::vector<int32_t> next(n), prev(n);
  for (size_t i = 0; i < n; ++i) {
    next[i] = i + 1 < n ? static_cast<int32_t>(i + 1) : -1;
    prev[i] = static_cast<int32_t>(i) - 1;
  }
  struct Candidate {
    int32_t rank, left, right, left_id, right_id;
  };
  // A min-heap on (rank, left position).
  const auto later = [](const Candidate& a, const Candidate& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.left > b.left;
  };
  std::vector<Candidate> heap;
  const auto consider = [&](int32_t left) {
    if (left < 0) return;
    const int32_t right = next[left];
    if (right < 0 || id[left] < 0 || id[right] < 0) return;
    const auto it = merges_.find(pair_key(id[left], id[right]));
    if (it == merges_.end()) return;
    heap.push_back({it->second.first, left, right, id[left], id[right]});
    std::push_heap(heap.begin(), heap.end(), later);
  };
  for (size_t i = 0; i + 1 < n; ++i) consider(static_cast<int32_t>(i));
  std::vector<bool> alive(n, true);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    const Candidate c = heap.back();
    heap.pop_back();
    if (!alive[c.left] || !alive[c.right] || next[c.left] != c.right || id[c.left] != c.left_id ||
        id[c.right] != c.right_id) {
      continue;  // stale: one side has merged since
    }
    id[c.left] = merges_.at(pair_key(c.left_id, c.right_id)).second;
    alive[c.right] = false;
    next[c.left] = next[c.right];
    if (next[c.left] >= 0) prev[next[c.left]] = c.left;
    consider(prev[c.left]);
    consider(c.left);
  }
  size_t out = 0;
  for (size_t i = 0; i < n; ++i) {
    if (alive[i]) id[out++] = id[i];
  }
  id.resize(out);
}

void Bpe::encode_word(std::string_view word, bool byte_level, std::vector<int32_t>* ids) const {
  if (word.empty()) return;
  if (options_.ignore_merges) {
    const auto& words = byte_level ? byte_level_words_ : vocab_;
    const auto it = words.find(std::string(word));
    if (it != words.end()) {
      ids->push_back(it->second);
      return;
    }
  }
  thread_local WordCache cache;
  const bool cacheable = word.size() <= kCacheMaxWordBytes;
  std::string key;
  if (cacheable) {
    if (cache.serial != serial_ || cache.words.size() >= kCacheMaxWords) {
      cache.words.clear();
      cache.serial = serial_;
    }
    key.reserve(word.size() + 1);
    key.push_back(byte_level ? 'b' : 't');
    key.append(word);
    const auto it = cache.words.find(key);
    if (it != cache.words.end()) {
      ids->insert(ids->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  // Symbols: ids, or -1 - (byte offset of the unknown character) for an unknown one.
  std::vector<int32_t> symbols;
  std::vector<uint32_t> offsets;  // [symbol] byte offset in `word` (for unknown ones)
  symbols.reserve(word.size());
  if (byte_level) {
    for (size_t i = 0; i < word.size(); ++i) {
      symbols.push_back(byte_ids_[static_cast<unsigned char>(word[i])]);
      offsets.push_back(static_cast<uint32_t>(i));
    }
  } else {
    for (size_t pos = 0; pos < word.size();) {
      const size_t begin = pos;
      next_code_point(word, &pos);
      symbols.push_back(lookup(word.substr(begin, pos - begin)));
      offsets.push_back(static_cast<uint32_t>(begin));
    }
  }
  std::vector<int32_t> result;
  const bool any_unknown = std::find(symbols.begin(), symbols.end(), kNoToken) != symbols.end();
  if (!any_unknown) {
    merge_symbols(&symbols);
    result = std::move(symbols);
  } else {
    // Unknown symbols never merge: merge each known stretch between them on its own.
    size_t i = 0;
    while (i < symbols.size()) {
      if (symbols[i] == kNoToken) {
        const size_t begin = offsets[i];
        size_t end = i + 1 < offsets.size() ? offsets[i + 1] : word.size();
        if (byte_level) {
          emit_unknown(byte_level_table().byte_to_utf8[static_cast<unsigned char>(word[begin])], &result);
        } else {
          emit_unknown(word.substr(begin, end - begin), &result);
        }
        ++i;
        continue;
      }
      size_t j = i;
      while (j < symbols.size() && symbols[j] != kNoToken) ++j;
      std::vector<int32_t> stretch(symbols.begin() + i, symbols.begin() + j);
      merge_symbols(&stretch);
      result.insert(result.end(), stretch.begin(), stretch.end());
      i = j;
    }
  }
  ids->insert(ids->end(), result.begin(), result.end());
  if (cacheable) cache.words.emplace(std::move(key), std::move(result));
}

void Bpe::fuse_unknown(std::vector<int32_t>* ids, size_t begin) const {
  if (!options_.fuse_unk || unk_id_ == kNoToken) return;
  size_t out = begin;
  for (size_t i = begin; i < ids->size(); ++i) {
    if ((*ids)[i] == unk_id_ && out > begin && (*ids)[out - 1] == unk_id_) continue;
    (*ids)[out++] = (*ids)[i];
  }
  ids->resize(out);
}

}  // namespace gradguard::data::detail
