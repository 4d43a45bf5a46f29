// Reference ids for `gradguard tokenize`: the same file through the JavaScript
// implementation of Hugging Face tokenizers (npm @huggingface/tokenizers), printed the
// same way (one JSON array). Usage:
//   node tools/tokenizer_reference.mjs DIR [--no-special] FILE
//   node tools/tokenizer_reference.mjs DIR --decode [--no-special] IDS.json
// The file is read as bytes and decoded as TextDecoder does (ill-formed UTF-8 -> U+FFFD,
// a byte-order mark kept as text), which is what gradguard does with the same bytes.
import { readFileSync } from "node:fs";
import { Tokenizer } from "@huggingface/tokenizers";

const args = process.argv.slice(2);
const flag = (name) => {
  const i = args.indexOf(name);
  if (i >= 0) args.splice(i, 1);
  return i >= 0;
};
const decodeMode = flag("--decode");
const noSpecial = flag("--no-special");
if (args.length !== 2) {
  console.error("usage: node tools/tokenizer_reference.mjs DIR [--decode] [--no-special] FILE");
  process.exit(2);
}
const [dir, file] = args;
const json = JSON.parse(readFileSync(`${dir}/tokenizer.json`, "utf8"));
let config = {};
try {
  config = JSON.parse(readFileSync(`${dir}/tokenizer_config.json`, "utf8"));
} catch {}
const tokenizer = new Tokenizer(json, config);
if (decodeMode) {
  const ids = JSON.parse(readFileSync(file, "utf8"));
  process.stdout.write(ids.length ? tokenizer.decode(ids, { skip_special_tokens: noSpecial }) : "");
} else {
  const text = new TextDecoder("utf-8", { ignoreBOM: true }).decode(readFileSync(file));
  const t0 = process.hrtime.bigint();
  const { ids } = tokenizer.encode(text, { add_special_tokens: !noSpecial });
  const seconds = Number(process.hrtime.bigint() - t0) / 1e9;
  if (process.env.GRADGUARD_REFERENCE_TIMING) {
    console.error(`encode ${(Buffer.byteLength(text) / seconds / 1e6).toFixed(3)} MB/s`);
  }
  process.stdout.write(JSON.stringify(ids) + "\n");
}
