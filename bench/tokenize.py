#!/usr/bin/python3
"""Tokenization throughput: strata's byte-level BPE against the JavaScript implementations on the
same text and the same GPT-2 vocabulary, measured alternately in one run.

The text is the GPL-3 (English prose) repeated, interleaved with the multilingual edge texts of
tests/tokenizer (CJK, emoji, combining marks, whitespace runs). The tokenizer is GPT-2's real
vocabulary rebuilt from js-tiktoken's ranks (tests/tokenizer/js/make_fixtures.mjs). Each round
runs, in rotating order: `strata tokenize --json` (its encode time, not loading or writing), and
node timing one encode call of @huggingface/tokenizers and of js-tiktoken (not loading either).
All three must produce the same number of tokens. Reports MB/s medians over rounds and the ratios.
Usage: /usr/bin/python3 bench/tokenize.py --strata build/strata [--mb 8] [--rounds 5]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
JS = os.path.join(HERE, "..", "tests", "tokenizer", "js")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--strata", required=True)
    parser.add_argument("--mb", type=float, default=8.0, help="size of the text in MB")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with open("/usr/share/common-licenses/GPL-3", encoding="utf-8") as f:
        prose = f.read()
    edge = ("日本語のテキストを分割します。中文文本也在这里。 emoji: 😀 👍🏽 👨‍👩‍👧‍👦 🇫🇷 combining: e\u0301 a\u0308 "
            "numbers 1234567 they're   many    spaces\n\n")
    unit = prose + edge
    text = unit * max(1, int(args.mb * 1e6 / len(unit.encode("utf-8"))))
    size_bytes = len(text.encode("utf-8"))
    with tempfile.TemporaryDirectory() as folder:
        subprocess.run(["node", os.path.join(JS, "make_fixtures.mjs"), folder, "/usr/share/common-licenses/GPL-3"],
                       check=True, capture_output=True)
        tokenizer = os.path.join(folder, "gpt2.json")
        corpus = os.path.join(folder, "corpus.txt")
        with open(corpus, "w", encoding="utf-8") as f:
            f.write(text)

        def strata():
            done = subprocess.run([args.strata, "tokenize", "--tokenizer", tokenizer, "--in", corpus, "--out",
                                   os.path.join(folder, "out.tok"), "--no-special", "--json"],
                                  check=True, capture_output=True, text=True)
            result = json.loads(done.stdout)
            return result["encode_seconds"], result["tokens"]

        def node(mode):
            done = subprocess.run(["node", "--max-old-space-size=8192", os.path.join(JS, "reference.mjs"), mode,
                                   tokenizer, corpus], check=True, capture_output=True, text=True)
            result = json.loads(done.stdout)
            return result["seconds"], result["tokens"]

        sides = {"strata": strata, "hf-js": lambda: node("bench-hf"), "js-tiktoken": lambda: node("bench-tiktoken-gpt2")}
        names = list(sides)
        rates = {name: [] for name in names}
        tokens = {}
        for round_index in range(args.rounds):
            order = names[round_index % len(names):] + names[:round_index % len(names)]
            for name in order:
                seconds, count = sides[name]()
                rates[name].append(size_bytes / 1e6 / seconds)
                tokens[name] = count
            print(f"round {round_index + 1}: " + ", ".join(f"{n} {rates[n][-1]:.2f} MB/s" for n in names), file=sys.stderr)
        if len(set(tokens.values())) != 1:
            sys.exit(f"the sides disagree on the token count: {tokens}")
        medians = {name: statistics.median(values) for name, values in rates.items()}
        print(json.dumps({"text_bytes": size_bytes, "tokens": tokens["strata"], "rounds": args.rounds,
                          "median_mb_per_s": medians,
                          "strata_over_hf_js": medians["strata"] / medians["hf-js"],
                          "strata_over_js_tiktoken": medians["strata"] / medians["js-tiktoken"]}, indent=1))


if __name__ == "__main__":
    main()
