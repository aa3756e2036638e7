"""Parity of dtrain's CSV/TSV reader and text source with Python's csv module.

Drives tests/parity/dump_text.c. The reader: every field and every record's first line of generated files
(quotes, doubled quotes, delimiters and CR/LF/CRLF inside quoted fields, empty fields, non-ASCII text, CSV
and TSV) and of the real files in ../shared/data/toxicity must equal what csv.reader returns. The source:
row counts, classes and every target of the real files equal what Python computes from csv.DictReader
(Jigsaw labels: value >= 0.5; Davidson: class 0/1/2), and every row's token ids are [CLS], the reference
BertTokenizer's ids of its text (test_tokenizer.py's, cut to max_len - 2), [SEP], then [PAD]. Files missing from ../shared/data are skipped with a
message; the generated checks always run.
"""
import csv
import io
import json
import os
import random
import subprocess
import sys
import tempfile

BUILD = os.environ.get("DT_BUILD_DIR", "build")
SRC = os.environ.get("DT_SOURCE_DIR", ".")
TOOL = os.path.join(BUILD, "tests", "dump_text")
DATA = os.path.join(SRC, "..", "shared", "data")
failures = []


def check(name, ok, detail=""):
    print(("ok   " if ok else "FAIL ") + name + ("" if ok else f": {detail}"))
    if not ok:
        failures.append(name)


def dump(*args):
    r = subprocess.run([TOOL, *args], capture_output=True, text=True, encoding="utf-8")
    if r.returncode != 0:
        raise RuntimeError(f"dump_text {' '.join(args)} failed ({r.returncode}): {r.stderr.strip()}")
    return json.loads(r.stdout)


def python_records(path, delimiter):
    """csv.reader's records (blank lines dropped, as dtrain drops them) and the line each starts on."""
    with open(path, newline="", encoding="utf-8-sig") as f:
        reader = csv.reader(f, delimiter=delimiter, strict=True)
        rows, lines, end = [], [], 0
        for row in reader:
            start = end + 1
            end = reader.line_num
            if row:
                rows.append(row)
                lines.append(start)
    return rows, lines


def compare_reader(name, path, delimiter):
    want, want_lines = python_records(path, delimiter)
    got = dump("csv", path)
    same = got["rows"] == want
    detail = ""
    if not same:
        bad = next((i for i, (a, b) in enumerate(zip(got["rows"], want)) if a != b), min(len(got["rows"]), len(want)))
        detail = f"{len(got['rows'])} vs {len(want)} records; first difference at record {bad}: " \
                 f"{got['rows'][bad] if bad < len(got['rows']) else None!r} vs {want[bad] if bad < len(want) else None!r}"
    check(f"{name}: fields equal csv.reader's ({len(want) - 1} records)", same, detail)
    # blank lines before a record shift where Python's count starts; the generated files have none
    check(f"{name}: record start lines", got["lines"] == want_lines,
          next((f"record {i}: {a} vs {b}" for i, (a, b) in enumerate(zip(got["lines"], want_lines)) if a != b), ""))


def random_field(rng):
    pieces = ["plain", "two words", "comma, inside", 'a "quote"', '""', "line\nbreak", "crlf\r\nbreak", "tab\there",
              "caf\u00e9", "\u20ac 5", "\U0001F600", "", " ", "'single'", "x" * rng.randint(1, 300)]
    return "".join(rng.choice(pieces) for _ in range(rng.randint(0, 4)))


def generated(tmp):
    rng = random.Random(7)
    for delimiter, ext, terminator in ((",", "csv", "\r\n"), (",", "csv", "\n"), ("\t", "tsv", "\n")):
        path = os.path.join(tmp, f"gen_{len(terminator)}.{ext}")
        with open(path, "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f, delimiter=delimiter, lineterminator=terminator, quoting=csv.QUOTE_MINIMAL)
            w.writerow(["text", "label", "other"])
            for _ in range(3000):
                w.writerow([random_field(rng), str(rng.randint(0, 2)), random_field(rng)])
        compare_reader(f"generated {ext} ({terminator!r})", path, delimiter)
    # a lone CR ends a record, as in Python; the last record needs no line break
    path = os.path.join(tmp, "cr.csv")
    with open(path, "w", newline="", encoding="utf-8") as f:
        f.write('a,b\r1,"x\ry"\r3,4')
    compare_reader("lone CR line breaks", path, ",")
    # records with the wrong field count: skipped, counted
    path = os.path.join(tmp, "counts.csv")
    with open(path, "w", newline="", encoding="utf-8") as f:
        f.write("a,b\n1,2\n3\n4,5,6\n7,8\n")
    got = dump("csv", path, "skip")
    check("wrong field counts are left out with skip", len(got["rows"]) == 3 and got["skipped"] == 2, str(got))


def reference_ids(texts, vocab_path):
    """[CLS] ids [SEP] of each text by test_tokenizer.py's reference BertTokenizer (uncased), max_len 128."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import test_tokenizer
    ref = test_tokenizer.Reference(vocab_path, True)
    cls, sep = ref.vocab["[CLS]"], ref.vocab["[SEP]"]
    return [[cls] + ref.ids(t)[:126] + [sep] for t in texts]


def real_files():
    vocab = os.path.join(DATA, "bert", "bert-base-uncased-vocab.txt")
    tox = os.path.join(DATA, "toxicity")
    if not os.path.isdir(tox) or not os.path.isfile(vocab):
        print(f"(skipped the real files: {tox} or {vocab} missing)")
        return
    labels = ["toxic", "severe_toxic", "obscene", "threat", "insult", "identity_hate"]
    for name, text in (("jigsaw-toxic-sample.csv", "comment_text"), ("jigsaw-toxic-sample2.csv", "comment_text"),
                       ("davidson-hate-speech.csv", "tweet")):
        path = os.path.join(tox, name)
        compare_reader(name, path, ",")
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
        if name.startswith("davidson"):
            got = dump("source", path, vocab, text, "--label-column", "class")
            want = [int(r["class"]) for r in rows]
            check(f"{name}: classes 0,1,2", got["meta"].get("classes") == "0,1,2" and got["outputs"] == 3, str(got["meta"]))
        else:
            got = dump("source", path, vocab, text, "--label-columns", ",".join(labels))
            want = [[1.0 if float(r[k]) >= 0.5 else 0.0 for k in labels] for r in rows]
            check(f"{name}: multilabel with 6 outputs", got["task"] == "multilabel" and got["outputs"] == 6)
        check(f"{name}: {len(rows)} rows", got["n"] == len(rows) and got["skipped"] == 0, f"dtrain {got['n']}")
        check(f"{name}: every target", got["targets"] == want,
              next((f"row {i}: {a} vs {b}" for i, (a, b) in enumerate(zip(got["targets"], want)) if a != b), ""))
        check(f"{name}: vocabulary size 30522", got["vocab_size"] == 30522, str(got["vocab_size"]))
        check(f"{name}: token types 0, mask then [PAD]", got["layout_ok"])
        want_ids = reference_ids([r[text] for r in rows], vocab)
        check(f"{name}: every row's token ids equal the reference BertTokenizer's", got["ids"] == want_ids,
              next((f"row {i}: {a[:12]}... vs {b[:12]}..." for i, (a, b) in enumerate(zip(got["ids"], want_ids))
                    if a != b), ""))


def main():
    if not os.path.isfile(TOOL):
        print(f"{TOOL} is not built")
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        generated(tmp)
    real_files()
    print(f"{len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
