#!/usr/bin/python3
"""Tokenizer speed, side by side in one run: `dtrain tokenize` against Hugging Face's JavaScript tokenizers
(npm @huggingface/tokenizers, the tokenizer of transformers.js) with bert-base-uncased's WordPiece
(../shared/data/bert/bert-base-uncased-vocab.txt, written here into the tokenizer.json a BertTokenizerFast
would save: BertNormalizer lowercase, BertPreTokenizer, WordPiece), over every text of the toxicity data
(Jigsaw comments and Davidson tweets), without special tokens.

Figures: tokens/s of each (dtrain: the whole command, vocabulary load and process start included, one thread;
JS: the encode loop alone, after loading), the ratio, and how many texts got identical ids.
The npm package is installed into a temporary directory (npm must reach its registry); without node or npm the
benchmark says so and stops.

    bench/tokenizer_vs_hf.py [--build build] [--reps 3]
"""
import argparse, csv, json, os, shutil, statistics, subprocess, sys, tempfile, time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from synthetic_vs_torch import cpu_line, loadavg  # noqa: E402

DATA = os.path.join(HERE, "..", "..", "shared", "data")
VOCAB = os.path.join(DATA, "bert", "bert-base-uncased-vocab.txt")

NODE = r'''
// node -e SCRIPT MODULE TOKENIZER_JSON TEXTS REPS OUT: process.argv[1] is MODULE
const fs = require("fs");
const { Tokenizer } = require(process.argv[1]);
const tok = new Tokenizer(JSON.parse(fs.readFileSync(process.argv[2], "utf8")), {do_lower_case: true});
const texts = fs.readFileSync(process.argv[3], "utf8").split("\0"); texts.pop();
const reps = parseInt(process.argv[4]);
let best = Infinity, out = null;
for (let r = 0; r < reps; r++) {
  const t0 = process.hrtime.bigint();
  const ids = texts.map(t => tok.encode(t, {add_special_tokens: false}).ids);
  const s = Number(process.hrtime.bigint() - t0) / 1e9;
  if (s < best) best = s;
  out = ids;
}
fs.writeFileSync(process.argv[5], out.map(x => x.join(" ")).join("\n") + "\n");
console.log(best);
'''


def tokenizer_json(path):
    vocab = {}
    for i, line in enumerate(open(VOCAB, encoding="utf-8")):
        vocab.setdefault(line.rstrip("\n"), i)
    specials = [{"id": vocab[t], "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                 "normalized": False, "special": True} for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")]
    cls, sep = vocab["[CLS]"], vocab["[SEP]"]
    post = {"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                       {"SpecialToken": {"id": "[SEP]", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": "[SEP]", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}},
                     {"SpecialToken": {"id": "[SEP]", "type_id": 1}}],
            "special_tokens": {"[CLS]": {"id": "[CLS]", "ids": [cls], "tokens": ["[CLS]"]},
                               "[SEP]": {"id": "[SEP]", "ids": [sep], "tokens": ["[SEP]"]}}}
    doc = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": specials,
           "normalizer": {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True,
                          "strip_accents": None, "lowercase": True},
           "pre_tokenizer": {"type": "BertPreTokenizer"}, "post_processor": post,
           "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": True},
           "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
                     "max_input_chars_per_word": 100, "vocab": vocab}}
    json.dump(doc, open(path, "w", encoding="utf-8"), ensure_ascii=False)


def texts():
    tox = os.path.join(DATA, "toxicity")
    out = []
    for name, col in (("jigsaw-toxic-sample.csv", "comment_text"), ("jigsaw-toxic-sample2.csv", "comment_text"),
                      ("davidson-hate-speech.csv", "tweet")):
        with open(os.path.join(tox, name), newline="", encoding="utf-8") as f:
            out += [r[col] for r in csv.DictReader(f)]
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default=os.path.join(HERE, "..", "build"))
    p.add_argument("--reps", type=int, default=3)
    a = p.parse_args()
    if not shutil.which("node") or not shutil.which("npm"):
        print("node or npm is missing: nothing to compare with")
        return 0
    print(f"# {cpu_line()}; load average before: {loadavg()}")
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["npm", "install", "--silent", "--prefix", tmp, "@huggingface/tokenizers"], check=True,
                       stdout=subprocess.DEVNULL)
        module = os.path.join(tmp, "node_modules", "@huggingface", "tokenizers")
        tj, data, js_out = os.path.join(tmp, "tokenizer.json"), os.path.join(tmp, "texts.bin"), os.path.join(tmp, "js.ids")
        tokenizer_json(tj)
        all_texts = texts()
        open(data, "wb").write(b"".join(t.encode("utf-8") + b"\0" for t in all_texts))
        js_s = float(subprocess.run(["node", "-e", NODE, module, tj, data, str(a.reps), js_out], check=True,
                                    capture_output=True, text=True).stdout.split()[-1])
        runs = []
        for _ in range(a.reps):
            t0 = time.perf_counter()
            ours = subprocess.run([os.path.join(a.build, "dtrain"), "tokenize", "--vocab", VOCAB, "--null"],
                                  stdin=open(data, "rb"), check=True, capture_output=True).stdout.decode()
            runs.append(time.perf_counter() - t0)
        dt_s = min(runs)
        mine = ours.split("\n")[:-1]
        theirs = open(js_out).read().split("\n")[:-1]
        same = sum(1 for x, y in zip(mine, theirs) if x == y)
        n_tok = sum(len(x.split()) for x in mine)
    print(f"# {len(all_texts)} texts, {n_tok} tokens; best of {a.reps}")
    print("| tokenizer | seconds | tokens/s |")
    print("|---|---:|---:|")
    print(f"| dtrain tokenize (whole command, 1 thread) | {dt_s:.3f} | {n_tok / dt_s:,.0f} |")
    print(f"| @huggingface/tokenizers (node, encode loop) | {js_s:.3f} | {n_tok / js_s:,.0f} |")
    print(f"# dtrain / JS: {js_s / dt_s:.1f}x; identical ids on {same} of {len(all_texts)} texts")
    print(f"# load average after: {loadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
