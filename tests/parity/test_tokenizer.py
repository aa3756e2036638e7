#!/usr/bin/env python3
"""dtrain tokenize against a reference BertTokenizer written here from transformers' algorithm
(tokenization_bert.py's BasicTokenizer + WordpieceTokenizer, and PreTrainedTokenizer.tokenize's split on the
special tokens and lower-casing before them), with Python's unicodedata for the Unicode properties:
  1. every comment of ../shared/data/toxicity/jigsaw-toxic-sample.csv and jigsaw-toxic-sample2.csv and every tweet
     of davidson-hate-speech.csv, uncased, with bert-base-uncased's vocabulary: the ids equal, text by text
     (records NUL-separated: comments span lines), and --special --max-len 128 gives [CLS] ... [SEP] truncated;
  2. hand-made cases through a small vocabulary written here: accents, CJK, punctuation, controls, the line and
     paragraph separators, a word over 100 characters, a special token inside a word, a capital sigma, and the
     cased tokenizer (--no-lower-case) on the same texts (it composes them first, NFC, as transformers does
     before its whitespace split: "e" + U+0301 is the vocabulary's "é");
  3. refusals: a vocabulary without [UNK], one line of invalid UTF-8, invalid UTF-8 input, each naming where.
The shared data is looked up at $DT_SOURCE_DIR/../shared/data; part 1 is skipped (saying so) without it."""
import csv
import os
import subprocess
import sys
import tempfile
import unicodedata

BUILD = os.environ.get("DT_BUILD_DIR", "")
SRC = os.environ.get("DT_SOURCE_DIR", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
DATA = os.path.join(SRC, "..", "shared", "data")
SPECIALS = ["[UNK]", "[SEP]", "[PAD]", "[CLS]", "[MASK]"]
failures = []


def is_whitespace(c):
    return c in " \t\n\r" or unicodedata.category(c) == "Zs"


def is_control(c):
    return c not in "\t\n\r" and unicodedata.category(c).startswith("C")


def is_punct(c):
    cp = ord(c)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(c).startswith("P")


def is_cjk(cp):
    return (0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF or 0x2A700 <= cp <= 0x2B73F
            or 0x2B740 <= cp <= 0x2B81F or 0x2B820 <= cp <= 0x2CEAF or 0xF900 <= cp <= 0xFAFF
            or 0x2F800 <= cp <= 0x2FA1F)


class Reference:
    def __init__(self, path, lower):
        self.vocab = {}
        with open(path, encoding="utf-8") as f:
            for i, line in enumerate(f):
                self.vocab[line.rstrip("\n")] = i
        self.lower = lower
        self.specials = SPECIALS  # split off whether in the vocabulary or not

    def basic(self, text):
        out = []
        for c in text:
            if ord(c) == 0 or ord(c) == 0xFFFD or is_control(c):
                continue
            out.append(" " if is_whitespace(c) else f" {c} " if is_cjk(ord(c)) else c)
        pieces = []
        for tok in unicodedata.normalize("NFC", "".join(out)).split():
            if self.lower:
                tok = "".join(c for c in unicodedata.normalize("NFD", tok.lower()) if unicodedata.category(c) != "Mn")
            run = ""
            for c in tok:
                if is_punct(c):
                    pieces += [run, c] if run else [c]
                    run = ""
                else:
                    run += c
            if run:
                pieces.append(run)
        return " ".join(pieces).split()

    def wordpiece(self, word):
        if len(word) > 100:
            return [self.vocab["[UNK]"]]
        out, start = [], 0
        while start < len(word):
            end, cur = len(word), None
            while start < end:
                sub = ("##" if start else "") + word[start:end]
                if sub in self.vocab:
                    cur = self.vocab[sub]
                    break
                end -= 1
            if cur is None:
                return [self.vocab["[UNK]"]]
            out.append(cur)
            start = end
        return out

    def ids(self, text):
        """Split on the special tokens first (PreTrainedTokenizer.tokenize), then the rest lower-cased."""
        segs, i, seg = [], 0, 0
        while i < len(text):
            hit = next((s for s in self.specials if text.startswith(s, i)), None)
            if hit:
                segs += [text[seg:i], hit]
                i += len(hit)
                seg = i
            else:
                i += 1
        segs.append(text[seg:])
        out = []
        for s in segs:
            if s in self.specials:
                out.append(self.vocab.get(s, self.vocab["[UNK]"]))
                continue
            # BertTokenizer.tokenize lower-cases with re.sub(r"(special)|(.+?)", ...): one character at a time
            for w in self.basic("".join(c.lower() for c in s) if self.lower else s):
                out += self.wordpiece(w)
        return out


def dtrain_ids(vocab, texts, *flags):
    data = b"".join(t.encode("utf-8") + b"\0" for t in texts)
    r = subprocess.run([os.path.join(BUILD, "dtrain"), "tokenize", "--vocab", vocab, "--null", *flags], input=data,
                       capture_output=True, check=False)
    if r.returncode != 0:
        failures.append(f"dtrain tokenize {' '.join(flags)}: exit {r.returncode}: {r.stderr.decode()[:300]}")
        return None
    return [[int(x) for x in line.split()] for line in r.stdout.decode().split("\n")[:-1]]


def compare(name, vocab, texts, lower=True):
    ref = Reference(vocab, lower)
    got = dtrain_ids(vocab, texts, *([] if lower else ["--no-lower-case"]))
    if got is None:
        return
    if len(got) != len(texts):
        failures.append(f"{name}: {len(got)} lines for {len(texts)} texts")
        return
    bad = [i for i, t in enumerate(texts) if got[i] != ref.ids(t)]
    for i in bad[:3]:
        print(f"FAIL {name} text {i}: {texts[i][:80]!r}\n  dtrain {got[i][:20]}\n  ref    {ref.ids(texts[i])[:20]}")
    if bad:
        failures.append(f"{name}: {len(bad)} of {len(texts)} texts differ")
    else:
        print(f"ok   {name}: {len(texts)} texts, {sum(len(g) for g in got)} ids, all equal")


def column(path, name):
    with open(path, newline="", encoding="utf-8") as f:
        return [row[name] for row in csv.DictReader(f)]


def shared_data():
    vocab = os.path.join(DATA, "bert", "bert-base-uncased-vocab.txt")
    if not os.path.exists(vocab):
        print(f"skipped part 1: no shared data at {DATA}")
        return
    tox = os.path.join(DATA, "toxicity")
    texts = (column(os.path.join(tox, "jigsaw-toxic-sample.csv"), "comment_text") +
             column(os.path.join(tox, "jigsaw-toxic-sample2.csv"), "comment_text"))
    compare("jigsaw samples", vocab, texts)
    compare("davidson tweets", vocab, column(os.path.join(tox, "davidson-hate-speech.csv"), "tweet"))
    ref = Reference(vocab, True)
    got = dtrain_ids(vocab, texts[:300], "--special", "--max-len", "128")
    want = [[ref.vocab["[CLS]"]] + ref.ids(t)[:126] + [ref.vocab["[SEP]"]] for t in texts[:300]]
    if got != want:
        failures.append("--special --max-len 128 differs from [CLS] + the first 126 ids + [SEP]")
    else:
        print("ok   --special --max-len 128: [CLS] + the first 126 ids + [SEP], 300 texts")


SMALL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hello", "##lo", "hel", "world", "un", "##aff", "##able",
         ",", "!", ".", "'", "cafe", "café", "Hello", "HeLLo", "中", "σας", "##s", "a", "##a", "naive", "x", "##x",
         "é", "\u00c5"]
HAND = ["Hello, world!", "HeLLo", "Héllo café naïve", "unaffable", "中文 中", "tab\there\nnew\r\nline",
        "ctrl\x07char\u200bzw", "line\u2028para\u2029sep", "a" * 101, "x" * 100, "in[SEP]side [CLS]", "[sep] [Sep] [MASK]",
        "ΣΑΣ σας", "don't", "", "   ", "\u00a0nbsp\u3000ideo", "e\u0301", "ǅ ǈ İ", "caf\u00e9 cafe\u0301 \u212b"]


def hand_cases(tmp):
    vocab = os.path.join(tmp, "small.txt")
    with open(vocab, "w", encoding="utf-8") as f:
        f.write("\n".join(SMALL) + "\n")
    compare("hand-made cases, uncased", vocab, HAND)
    compare("hand-made cases, cased", vocab, HAND, lower=False)


def refusals(tmp):
    exe = os.path.join(BUILD, "dtrain")
    bad_vocab = os.path.join(tmp, "nounk.txt")
    with open(bad_vocab, "w") as f:
        f.write("[PAD]\n[CLS]\n[SEP]\nhello\n")
    utf = os.path.join(tmp, "badutf.txt")
    with open(utf, "wb") as f:
        f.write(b"[PAD]\n[UNK]\n[CLS]\n[SEP]\nok\n\xff\xfe\n")
    good = os.path.join(tmp, "small.txt")
    cases = [([exe, "tokenize", "--vocab", bad_vocab], b"hi\n", "no [UNK] token"),
             ([exe, "tokenize", "--vocab", utf], b"hi\n", "badutf.txt:6: the token is not valid UTF-8"),
             ([exe, "tokenize", "--vocab", good], b"fine\nbad \xc3\x28 here\n", "record 2 of the input"),
             ([exe, "tokenize", "--vocab", os.path.join(tmp, "missing.txt")], b"", "missing.txt"),
             ([exe, "tokenize"], b"", "--vocab FILE is required")]
    for cmd, stdin, want in cases:
        r = subprocess.run(cmd, input=stdin, capture_output=True, check=False)
        err = r.stderr.decode()
        if r.returncode == 0 or want not in err or err.count("\n") != 1:
            failures.append(f"{' '.join(cmd[1:])}: exit {r.returncode}, stderr {err!r} (want one line with {want!r})")
        else:
            print(f"ok   refused: {err.strip()}")


def main():
    if not BUILD:
        print("DT_BUILD_DIR is not set (run through ctest)")
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        hand_cases(tmp)
        refusals(tmp)
    shared_data()
    if failures:
        print("FAILED:", "; ".join(failures[:10]))
        return 1
    print("tokenizer parity: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
