#!/usr/bin/python3
# tests/tokenizer/test_tokenizer.py — strata's tokenizers against independent implementations,
# id for id: (gpt2) GPT-2's real vocabulary, rebuilt from js-tiktoken's ranks, against js-tiktoken
# and @huggingface/tokenizers (JavaScript); (llama3) a Llama-3-shaped tokenizer.json (Split regex
# in a Sequence, ignore_merges, [a, b] merges, added tokens) against @huggingface/tokenizers;
# (qwen2) Qwen 2's form (NFC normalizer, its Split regex, ByteLevel) and (llama2) both of
# transformers' Llama 2 / Mistral forms (Prepend + Replace normalizer, or Metaspace; byte_fallback;
# the Replace/ByteFallback/Fuse/Strip decoder) against @huggingface/tokenizers, ids and decoded
# text, on edge texts (accents NFC composes, characters outside the vocab, leading spaces,
# newlines, emoji, added tokens inside the text); (config) tokenizer_config.json's bos_token /
# eos_token / add_bos_token override the guess, frame `strata tokenize`'s documents and refuse
# malformed values in one line;
# (sentencepiece) BPE and unigram models trained here by Debian's python3-sentencepiece against
# that library's own encode, and a Llama-like BPE converted to tokenizer.json as transformers
# does it, strata's ids on the JSON against the library's on the .model; each with
# decode(encode(x)) == x (or the reference's decode) on ASCII, CJK, emoji, combining marks,
# whitespace runs, digits, contractions and newlines. (cli) `strata tokenize` writes the
# ids framed by BOS/EOS, picks u16/u32, refuses u16 for a larger vocabulary, and `strata train`
# runs on the token file and on data.format text; (bad_files) malformed tokenizer files (charsmaps
# too: bad base64, truncated, offsets outside the pool, a cycle) are refused with one line naming
# the file and key, exit 2; (normalizers) Lowercase, Strip, StripAccents and BertNormalizer on
# Qwen 2's byte-level form against @huggingface/tokenizers, ids and normalized (decoded) text, on
# ~270 texts; (precompiled) the Precompiled normalizer with the charsmap of SentencePiece models
# trained here (nmt_nfkc, nfkc_cf), its normalized text against SentencePiece's own (the npm
# package only approximates Precompiled with NFKC, so it is no reference for it); (pretokenizers)
# Whitespace, WhitespaceSplit, Digits and Punctuation before ByteLevel and before Metaspace
# against @huggingface/tokenizers, and the cuts only Rust's versions make, by hand.
#
# Usage: test_tokenizer.py STRATA_BINARY PROBE_BINARY CASE. Exit 77 (skip) only when node, the
# npm packages (scripts/setup.sh installs them) or python3-sentencepiece are missing.
import json
import os
import shutil
import subprocess
import sys
import tempfile

STRATA = os.path.abspath(sys.argv[1])
PROBE = os.path.abspath(sys.argv[2])
CASE = sys.argv[3]
HERE = os.path.dirname(os.path.abspath(__file__))
JS = os.path.join(HERE, "js")
CORPUS = "/usr/share/common-licenses/GPL-3"

TEXTS = [
    "Hello world",
    "Hello, world! How's it going? They're here; we've done it, I'm sure you'll see it'd work.",
    "THE CAT'S HAT'S 'S 'Re",
    "numbers: 1 12 123 1234 12345 3.14159 1,000,000 0x1F 2024-11-23",
    "  leading spaces, trailing spaces   ",
    "tabs\tand\t\tmore\ttabs",
    "line one\nline two\n\nline four\r\nwindows line\n\n\n",
    "many     spaces      between   words",
    "日本語のテキストを分割します。中文文本也在这里。한국어 텍스트",
    "emoji: 😀 👍🏽 👨‍👩‍👧‍👦 🇫🇷 ❤️ end",
    "combining: e\u0301 a\u0308 n\u0303 — Z\u0351\u0302a\u0300lgo",
    "Ελληνικά και русский текст, עברית, العربية",
    "mixed 123abc abc123 _under_score__ CamelCaseWord",
    "punctuation!!! ??? ... --- ((nested)) [brackets] {braces} @#$%^&*",
    "<|endoftext|> between <|endoftext|>documents",
    "<|begin_of_text|>Hello<|end_of_text|> and <|eot_id|>",
    "",
    " ",
    "\n",
    "a",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "   \n   \n\t\t  x",
]


# Edge texts for the normalizing and SentencePiece-style forms, besides TEXTS.
EXTRA_TEXTS = [
    "cafe\u0301 vs caf\u00e9, A\u030angstr\u00f6m and the \u212b sign",
    "<s>Hello</s> and <s> again <unk>",
    " <s> x",
    "tab\there  two  spaces",
    "   ",
    "\u2581already\u2581meta \u2581",
    "\n\nnew\nlines\n",
    "r\u00e9sum\u00e9 na\u00efve stra\u00dfe \u00fcber",
    "\U0001F600\U0001F600 \u6f22\u5b57 \u0915\u094d\u0937",
]


def fail(message):
    print("FAIL: " + message, file=sys.stderr)
    sys.exit(1)


def skip(message):
    print("SKIP: " + message, file=sys.stderr)
    sys.exit(77)


def run(args, expect=0, **kwargs):
    result = subprocess.run(args, capture_output=True, text=True, timeout=600, **kwargs)
    if expect is not None and result.returncode != expect:
        fail(f"{' '.join(args)} exited {result.returncode} (expected {expect}):\n{result.stderr[-3000:]}")
    return result


def need_node():
    if shutil.which("node") is None:
        skip("node is not installed (scripts/setup.sh installs nodejs)")
    for package in ("@huggingface/tokenizers", "js-tiktoken"):
        if not os.path.isdir(os.path.join(JS, "node_modules", package)):
            skip(f"npm package {package} is missing in tests/tokenizer/js (scripts/setup.sh installs it)")


def fixtures(folder, only="gpt2,llama3"):
    """Makes the fixtures named (make_fixtures.mjs), returns the paths of gpt2.json and llama3.json."""
    need_node()
    run(["node", os.path.join(JS, "make_fixtures.mjs"), folder, CORPUS, only])
    return os.path.join(folder, "gpt2.json"), os.path.join(folder, "llama3.json")


def fixture(folder, name):
    """Makes one fixture, returns the path of NAME.json."""
    fixtures(folder, name)
    return os.path.join(folder, name + ".json")


def probe(tokenizer, texts, folder):
    path = os.path.join(folder, "texts.json")
    with open(path, "w") as f:
        json.dump(texts, f)
    return json.loads(run([PROBE, tokenizer, path]).stdout)


def js_reference(mode, tokenizer, texts, folder):
    path = os.path.join(folder, "texts.json")
    with open(path, "w") as f:
        json.dump(texts, f)
    return json.loads(run(["node", os.path.join(JS, "reference.mjs"), mode, tokenizer, path]).stdout)


def compare(name, texts, ours, theirs):
    mismatches = [i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b]
    for i in mismatches[:5]:
        print(f"{name}: text {texts[i]!r}\n  strata    {ours[i]}\n  reference {theirs[i]}", file=sys.stderr)
    if mismatches:
        fail(f"{name}: {len(mismatches)} of {len(texts)} texts encode differently")


def check_round_trip(name, texts, decoded):
    for text, back in zip(texts, decoded):
        if back != text:
            fail(f"{name}: decode(encode({text!r})) = {back!r}")


def corpus_paragraphs():
    with open(CORPUS, encoding="utf-8") as f:
        return [p for p in f.read().split("\n\n") if p.strip()][:150]


def case_gpt2():
    with tempfile.TemporaryDirectory() as folder:
        gpt2, _ = fixtures(folder, "gpt2")
        texts = TEXTS + corpus_paragraphs()
        ours = probe(gpt2, texts, folder)
        if ours["vocab_size"] != 50257 or ours["eos"] != 50256 or ours["bos"] is not None:
            fail(f"gpt2: vocab {ours['vocab_size']}, bos {ours['bos']}, eos {ours['eos']} (expected 50257, none, 50256)")
        compare("gpt2 vs js-tiktoken", texts, ours["ids"], js_reference("tiktoken-gpt2", "-", texts, folder)["ids"])
        hf = js_reference("hf", gpt2, texts, folder)
        compare("gpt2 vs @huggingface/tokenizers", texts, ours["ids"], hf["ids"])
        check_round_trip("gpt2", texts, ours["decoded"])
        # Spot check against ids known from GPT-2 itself, so a fixture bug cannot hide in both sides.
        if ours["ids"][0] != [15496, 995]:
            fail(f"gpt2: 'Hello world' is {ours['ids'][0]}, not GPT-2's [15496, 995]")
        print(f"gpt2: {len(texts)} texts, {sum(map(len, ours['ids']))} tokens equal js-tiktoken and @huggingface/tokenizers")


def case_llama3():
    with tempfile.TemporaryDirectory() as folder:
        _, llama3 = fixtures(folder, "llama3")
        texts = TEXTS + corpus_paragraphs()
        ours = probe(llama3, texts, folder)
        hf = js_reference("hf", llama3, texts, folder)
        compare("llama3 vs @huggingface/tokenizers", texts, ours["ids"], hf["ids"])
        check_round_trip("llama3", texts, ours["decoded"])
        check_round_trip("llama3 (JS decode)", texts, hf["decoded"])
        with open(llama3) as f:
            spec = json.load(f)
        begin = next(t["id"] for t in spec["added_tokens"] if t["content"] == "<|begin_of_text|>")
        end = next(t["id"] for t in spec["added_tokens"] if t["content"] == "<|end_of_text|>")
        if ours["bos"] != begin or ours["eos"] != end:
            fail(f"llama3: bos {ours['bos']} eos {ours['eos']}, expected {begin} and {end}")
        # The case-insensitive contractions of the Llama-3 regex: "'S" splits off like "'s".
        if len(ours["ids"][2]) < 6:
            fail(f"llama3: {TEXTS[2]!r} gave too few pieces: {ours['ids'][2]}")
        print(f"llama3: {len(texts)} texts, {sum(map(len, ours['ids']))} tokens equal @huggingface/tokenizers")


def case_qwen2():
    import unicodedata
    with tempfile.TemporaryDirectory() as folder:
        qwen2 = fixture(folder, "qwen2")
        texts = TEXTS + EXTRA_TEXTS + corpus_paragraphs()
        ours = probe(qwen2, texts, folder)
        hf = js_reference("hf", qwen2, texts, folder)
        compare("qwen2 vs @huggingface/tokenizers", texts, ours["ids"], hf["ids"])
        compare("qwen2 decode vs @huggingface/tokenizers", texts, ours["decoded"], hf["decoded"])
        # Decoding gives the normalized text back, byte for byte.
        check_round_trip("qwen2 (NFC)", [unicodedata.normalize("NFC", t) for t in texts], ours["decoded"])
        with open(qwen2) as f:
            spec = json.load(f)
        ids_of = {t["content"]: t["id"] for t in spec["added_tokens"]}
        if ours["bos"] is not None or ours["eos"] != ids_of["<|endoftext|>"] or ours["add_bos"]:
            fail(f"qwen2: bos {ours['bos']} eos {ours['eos']} add_bos {ours['add_bos']} (expected none, "
                 f"{ids_of['<|endoftext|>']}, false)")
        # The normalizer is what makes a decomposed accent encode like the composed one.
        pair = ["cafe\u0301", "caf\u00e9"]
        normalized = probe(qwen2, pair, folder)["ids"]
        spec["normalizer"] = None
        plain_path = os.path.join(folder, "qwen2-plain.json")
        with open(plain_path, "w") as f:
            json.dump(spec, f)
        plain = probe(plain_path, pair, folder)["ids"]
        if normalized[0] != normalized[1] or plain[0] == plain[1]:
            fail(f"qwen2: NFC made no difference: with {normalized}, without {plain}")
        print(f"qwen2: {len(texts)} texts, {sum(map(len, ours['ids']))} tokens and their decoded text equal "
              f"@huggingface/tokenizers")


def case_llama2():
    with tempfile.TemporaryDirectory() as folder:
        legacy = fixture(folder, "llama2")
        metaspace = os.path.join(folder, "llama2_metaspace.json")
        texts = TEXTS + EXTRA_TEXTS + corpus_paragraphs()
        for name, path in (("llama2 (Prepend+Replace)", legacy), ("llama2 (Metaspace)", metaspace)):
            ours = probe(path, texts, folder)
            hf = js_reference("hf", path, texts, folder)
            compare(f"{name} vs @huggingface/tokenizers", texts, ours["ids"], hf["ids"])
            compare(f"{name} decode vs @huggingface/tokenizers", texts, ours["decoded"], hf["decoded"])
            if ours["bos"] != 1 or ours["eos"] != 2 or not ours["add_bos"] or ours["vocab_size"] < 300:
                fail(f"{name}: bos {ours['bos']} eos {ours['eos']} add_bos {ours['add_bos']} vocab {ours['vocab_size']}")
            # Characters outside the vocabulary (CJK, emoji) became their <0xNN> byte tokens (ids 3-258).
            cjk = texts.index(TEXTS[8])
            if not any(3 <= i < 259 for i in ours["ids"][cjk]) or 0 in ours["ids"][cjk]:
                fail(f"{name}: no byte fallback for {TEXTS[8]!r}: {ours['ids'][cjk]}")
            print(f"{name}: {len(texts)} texts, {sum(map(len, ours['ids']))} tokens and their decoded text equal "
                  f"@huggingface/tokenizers")
        # The legacy form gives every text back (Strip takes off the '▁' Prepend added), except
        # around added tokens, where each stretch gets its own '▁', and where the text holds '▁'
        # itself (decoded as a space) — Hugging Face's behaviour too.
        ours = probe(legacy, texts, folder)
        plain = [(t, d) for t, d in zip(texts, ours["decoded"])
                 if not any(special in t for special in ("<s>", "</s>", "<unk>", "\u2581"))]
        check_round_trip("llama2 (Prepend+Replace)", [t for t, _ in plain], [d for _, d in plain])


def case_config():
    with tempfile.TemporaryDirectory() as folder:
        fixtures(folder, "llama3,qwen2,llama2")
        txt = os.path.join(folder, "in.txt")
        text = "Config decides the framing.\nSecond line."
        with open(txt, "w") as f:
            f.write(text)

        def model_folder(name, source, config):
            path = os.path.join(folder, name)
            os.makedirs(path)
            shutil.copy(os.path.join(folder, source + ".json"), os.path.join(path, "tokenizer.json"))
            if config is not None:
                with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
                    f.write(config if isinstance(config, str) else json.dumps(config))
            return path

        def tokenize(path):
            out = os.path.join(folder, "out.tok")
            run([STRATA, "tokenize", "--tokenizer", path, "--in", txt, "--out", out, "--format", "tokens-u32"])
            return read_tokens(out, 4)

        # Llama 2: the AddedToken-object form, add_bos_token true → <s> ids </s>.
        llama2 = model_folder("llama2", "llama2", {
            "add_bos_token": True, "add_eos_token": False,
            "bos_token": {"__type": "AddedToken", "content": "<s>", "lstrip": False, "normalized": False},
            "eos_token": {"__type": "AddedToken", "content": "</s>"}, "unk_token": "<unk>"})
        got = probe(llama2, [text], folder)
        if (got["bos"], got["eos"], got["add_bos"]) != (1, 2, True) or tokenize(llama2) != [1] + got["ids"][0] + [2]:
            fail(f"llama2 with its tokenizer_config.json: {got['bos']} {got['eos']} {got['add_bos']}, {tokenize(llama2)[:4]}")
        # Qwen 2 chat: no BOS, EOS <|im_end|> — not the <|endoftext|> the names suggest.
        qwen2 = model_folder("qwen2", "qwen2", {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"})
        got = probe(qwen2, [text], folder)
        with open(os.path.join(folder, "qwen2.json")) as f:
            im_end = next(t["id"] for t in json.load(f)["added_tokens"] if t["content"] == "<|im_end|>")
        if got["bos"] is not None or got["eos"] != im_end or tokenize(qwen2) != got["ids"][0] + [im_end]:
            fail(f"qwen2 with its tokenizer_config.json: bos {got['bos']} eos {got['eos']} (expected none, {im_end})")
        # add_bos_token false wins over the template's BOS (Llama 3 shape); the file's own folder is read.
        llama3 = model_folder("llama3", "llama3", {"add_bos_token": False})
        got = probe(os.path.join(llama3, "tokenizer.json"), [text], folder)
        if got["add_bos"] or got["bos"] is None or tokenize(llama3) != got["ids"][0] + [got["eos"]]:
            fail(f"llama3 with add_bos_token false: add_bos {got['add_bos']}, {tokenize(llama3)[:3]}")
        # data.format text frames the file as strata tokenize does: training on either is the same run.
        out = os.path.join(folder, "corpus.tok")
        with open(CORPUS, encoding="utf-8") as f:
            corpus = f.read()
        corpus_txt = os.path.join(folder, "corpus.txt")
        with open(corpus_txt, "w", encoding="utf-8") as f:
            f.write(corpus)
        run([STRATA, "tokenize", "--tokenizer", llama2, "--in", corpus_txt, "--out", out, "--format", "tokens-u16"])
        vocab = probe(llama2, ["x"], folder)["vocab_size"]
        losses = []
        for name, data in (("tokens", {"path": out, "format": "tokens-u16"}),
                           ("text", {"path": corpus_txt, "format": "text", "tokenizer": llama2})):
            run_dir = os.path.join(folder, "run-" + name)
            os.makedirs(run_dir)
            result = run([STRATA, "train", train_config(run_dir, data, vocab), "--json"])
            losses.append(json.loads(result.stdout.strip().splitlines()[-1])["last_loss"])
        if losses[0] != losses[1]:
            fail(f"training on the token file ({losses[0]}) and on the text ({losses[1]}) differ")
        # Malformed tokenizer_config.json: one line naming the file and the key, exit 2.
        bad_cases = [
            ("not json", "{\"bos_token\": ", "not valid JSON"),
            ("bos number", {"bos_token": 5}, "'bos_token'"),
            ("eos unknown", {"eos_token": "<nope>"}, "'eos_token'"),
            ("eos object", {"eos_token": {"__type": "AddedToken"}}, "'eos_token.content'"),
            ("add_bos string", {"add_bos_token": "yes"}, "'add_bos_token'"),
            ("add_bos without bos", {"bos_token": None, "add_bos_token": True}, "'add_bos_token'"),
            ("add_eos number", {"add_eos_token": 1}, "'add_eos_token'"),
        ]
        for i, (name, config, needle) in enumerate(bad_cases):
            path = model_folder(f"bad{i}", "llama2", config)
            out = os.path.join(folder, f"bad{i}.tok")
            result = run([STRATA, "tokenize", "--tokenizer", path, "--in", txt, "--out", out], expect=None)
            lines = result.stderr.strip().splitlines()
            if result.returncode != 2 or len(lines) != 1 or "tokenizer_config.json" not in lines[0] or needle not in lines[0]:
                fail(f"tokenizer_config {name}: exit {result.returncode}, {result.stderr!r} (expected one line with {needle})")
            if os.path.exists(out):
                fail(f"tokenizer_config {name}: a refused run left {out} behind")
        print(f"config: tokenizer_config.json framing for Llama 2, Qwen 2, Llama 3; text data = token file "
              f"(loss {losses[0]:.6f}); {len(bad_cases)} malformed configs refused")


def llama_tokenizer_json(sp):
    """A SentencePiece BPE model as transformers' LlamaConverter writes its tokenizer.json (legacy):
    every piece in the vocabulary; a merge (l, r) for every split of a piece into two pieces,
    ordered by the merged piece's score, highest first (then by the ids of l and r)."""
    vocab = {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}
    scores = {sp.id_to_piece(i): sp.get_score(i) for i in range(sp.get_piece_size())}
    merges = []
    for piece, score in scores.items():
        local = [(piece[:k], piece[k:], score) for k in range(1, len(piece)) if piece[:k] in vocab and piece[k:] in vocab]
        merges += sorted(local, key=lambda m: (vocab[m[0]], vocab[m[1]]))
    merges = sorted(merges, key=lambda m: m[2], reverse=True)
    meta = "\u2581"
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": i, "content": sp.id_to_piece(i), "special": True, "normalized": False} for i in range(3)],
        "normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": meta},
                                                           {"type": "Replace", "pattern": {"String": " "}, "content": meta}]},
        "pre_tokenizer": None,
        "post_processor": None,
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": meta}, "content": " "}, {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "fuse_unk": True, "byte_fallback": True,
                  "vocab": vocab, "merges": [f"{l} {r}" for l, r, _ in merges]},
    }


def case_sentencepiece():
    try:
        import sentencepiece as spm
    except ImportError:
        skip("python3-sentencepiece is not installed (scripts/setup.sh installs it)")
    texts = [t for t in TEXTS if t] + corpus_paragraphs()
    with tempfile.TemporaryDirectory() as folder:
        for model_type in ("bpe", "unigram"):
            prefix = os.path.join(folder, model_type)
            spm.SentencePieceTrainer.train(input=CORPUS, model_prefix=prefix, vocab_size=600, model_type=model_type,
                                           character_coverage=1.0, byte_fallback=True, minloglevel=2)
            reference = spm.SentencePieceProcessor(model_file=prefix + ".model")
            ours = probe(prefix + ".model", texts, folder)
            if ours["kind"] != "sentencepiece" or ours["vocab_size"] != reference.get_piece_size():
                fail(f"sentencepiece {model_type}: kind {ours['kind']}, vocab {ours['vocab_size']}")
            if ours["bos"] != reference.bos_id() or ours["eos"] != reference.eos_id():
                fail(f"sentencepiece {model_type}: bos/eos {ours['bos']}/{ours['eos']}")
            compare(f"sentencepiece {model_type} vs python3-sentencepiece", texts, ours["ids"],
                    [reference.encode(t) for t in texts])
            # SentencePiece normalizes (NFKC, whitespace runs), so decode equals its own decode.
            expected = [reference.decode(reference.encode(t)) for t in texts]
            mismatched = [t for t, a, b in zip(texts, ours["decoded"], expected) if a != b]
            if mismatched:
                fail(f"sentencepiece {model_type}: decode differs on {mismatched[0]!r}")
            print(f"sentencepiece {model_type}: {len(texts)} texts equal python3-sentencepiece")
        # A SentencePiece BPE trained as Llama's was (identity normalization, spaces kept, byte
        # fallback), turned into tokenizer.json as transformers' LlamaConverter does it (legacy
        # form; merges from the pieces, by the merged piece's score): strata's ids on the JSON
        # equal the library's own on the .model.
        prefix = os.path.join(folder, "llama-like")
        spm.SentencePieceTrainer.train(input=CORPUS, model_prefix=prefix, vocab_size=800, model_type="bpe",
                                       character_coverage=0.9995, byte_fallback=True, minloglevel=2,
                                       normalization_rule_name="identity", remove_extra_whitespaces=False,
                                       add_dummy_prefix=True, allow_whitespace_only_pieces=True)
        reference = spm.SentencePieceProcessor(model_file=prefix + ".model")
        converted = os.path.join(folder, "converted.json")
        with open(converted, "w") as f:
            json.dump(llama_tokenizer_json(reference), f)
        # (SentencePiece reads "<s>" in a text as three characters, the JSON as the added token.)
        more = texts + [t for t in EXTRA_TEXTS if "<" not in t]
        ours = probe(converted, more, folder)
        compare("tokenizer.json converted from a SentencePiece BPE vs python3-sentencepiece", more, ours["ids"],
                [reference.encode(t) for t in more])
        check_round_trip("converted SentencePiece BPE", [t for t in more if "\u2581" not in t],
                         [d for t, d in zip(more, ours["decoded"]) if "\u2581" not in t])
        print(f"sentencepiece → tokenizer.json (LlamaConverter's way): {len(more)} texts equal python3-sentencepiece")
        # A model folder (Llama 2, Mistral) holds a tokenizer.json beside tokenizer.model; when
        # strata refuses the JSON (here: it is empty), the folder loads the .model.
        model_dir = os.path.join(folder, "model-dir")
        os.makedirs(model_dir)
        shutil.copy(os.path.join(folder, "bpe.model"), os.path.join(model_dir, "tokenizer.model"))
        with open(os.path.join(model_dir, "tokenizer.json"), "w") as f:
            json.dump({"model": {"type": "BPE", "vocab": {}, "merges": []}, "pre_tokenizer": {"type": "Metaspace"}}, f)
        if probe(model_dir, ["x"], folder)["kind"] != "sentencepiece":
            fail("a folder with an unsupported tokenizer.json and a tokenizer.model did not load the .model")


def read_tokens(path, width):
    with open(path, "rb") as f:
        data = f.read()
    return [int.from_bytes(data[i:i + width], "little") for i in range(0, len(data), width)]


def train_config(folder, data, vocab_size):
    nvme = os.path.join(folder, "nvme")
    os.makedirs(nvme, exist_ok=True)
    cfg = {
        "model": {"n_layer": 1, "n_head": 2, "n_embd": 32, "vocab_size": vocab_size, "seq_len": 16, "init": "random",
                  "seed": 3},
        "data": data,
        "batch_size": 2,
        "steps": 3,
        "optimizer": {"lr": 1.0e-3},
        "precision": "fp32",
        "device": {"kind": "cpu", "memory": "64MiB"},
        "host": {"memory": "64MiB"},
        "nvme": {"paths": [nvme]},
        "placement": {"params": "host", "grads": "host", "optimizer": "host"},
        "checkpoint_every": 3,
    }
    path = os.path.join(folder, "train.yaml")
    with open(path, "w") as f:
        json.dump(cfg, f)
    return path


def case_cli():
    with tempfile.TemporaryDirectory() as folder:
        gpt2, llama3 = fixtures(folder)
        docs = ["First document.\nIt has two lines.", "Second one: 日本語 😀", "third's the charm"]
        jsonl = os.path.join(folder, "corpus.jsonl")
        with open(jsonl, "w") as f:
            for i, d in enumerate(docs):
                f.write(json.dumps({"text": d, "id": i}) + "\n")
            f.write("\n")  # a blank line is no document
        expected = probe(gpt2, docs, folder)["ids"]
        out = os.path.join(folder, "corpus.u16")
        summary = json.loads(run([STRATA, "tokenize", "--tokenizer", gpt2, "--in", jsonl, "--out", out, "--json"]).stdout)
        if summary["format"] != "tokens-u16" or summary["documents"] != 3:
            fail(f"tokenize: {summary}")
        framed = [i for ids in expected for i in ids + [50256]]  # GPT-2 has an EOS, no BOS
        if read_tokens(out, 2) != framed:
            fail(f"tokenize jsonl: the file holds {read_tokens(out, 2)[:20]}..., expected {framed[:20]}...")
        run([STRATA, "tokenize", "--tokenizer", gpt2, "--in", jsonl, "--out", out + "32", "--format", "tokens-u32", "--no-special"])
        if read_tokens(out + "32", 4) != [i for ids in expected for i in ids]:
            fail("tokenize --format tokens-u32 --no-special: wrong ids")
        # A .txt is one document; Llama-3 style frames it with <|begin_of_text|> ... <|end_of_text|>.
        txt = os.path.join(folder, "corpus.txt")
        with open(CORPUS, encoding="utf-8") as f:
            corpus = f.read()
        with open(txt, "w", encoding="utf-8") as f:
            f.write(corpus)
        llama_probe = probe(llama3, [corpus], folder)
        out_llama = os.path.join(folder, "llama.tok")
        run([STRATA, "tokenize", "--tokenizer", llama3, "--in", txt, "--out", out_llama])
        if read_tokens(out_llama, 2) != [llama_probe["bos"]] + llama_probe["ids"][0] + [llama_probe["eos"]]:
            fail("tokenize txt with the llama3 fixture: wrong ids or framing")
        # A vocabulary beyond 65,536 ids: auto picks u32, and u16 is refused in one line, exit 2.
        with open(llama3) as f:
            spec = json.load(f)
        spec["added_tokens"].append({"id": 70000, "content": "<|far|>", "special": True})
        big = os.path.join(folder, "big.json")
        with open(big, "w") as f:
            json.dump(spec, f)
        summary = json.loads(run([STRATA, "tokenize", "--tokenizer", big, "--in", jsonl, "--out", out + "big", "--json"]).stdout)
        if summary["format"] != "tokens-u32" or summary["vocab_size"] != 70001:
            fail(f"tokenize with a 70,001-token vocabulary: {summary}")
        refused = run([STRATA, "tokenize", "--tokenizer", big, "--in", jsonl, "--out", out + "no", "--format", "tokens-u16"], expect=2)
        if len(refused.stderr.strip().splitlines()) != 1 or "tokens-u32" not in refused.stderr or os.path.exists(out + "no"):
            fail(f"u16 for a large vocabulary: {refused.stderr!r}")
        # A .jsonl line without the text key: one line naming file:line and the key, exit 2.
        bad = os.path.join(folder, "bad.jsonl")
        with open(bad, "w") as f:
            f.write('{"text": "fine"}\n{"body": "no text key"}\n')
        refused = run([STRATA, "tokenize", "--tokenizer", gpt2, "--in", bad, "--out", out + "bad"], expect=2)
        if "bad.jsonl:2" not in refused.stderr or "'text'" not in refused.stderr or os.path.exists(out + "bad"):
            fail(f"jsonl without the text key: {refused.stderr!r}")

        # strata train on the token file (tokens-u16), and on the text through the tokenizer.
        vocab = llama_probe["vocab_size"]
        run_dir = os.path.join(folder, "run1")
        os.makedirs(run_dir)
        result = run([STRATA, "train", train_config(run_dir, {"path": out_llama, "format": "tokens-u16"}, vocab), "--json"])
        first = json.loads(result.stdout.strip().splitlines()[-1])
        run_dir = os.path.join(folder, "run2")
        os.makedirs(run_dir)
        result = run([STRATA, "train", train_config(run_dir, {"path": txt, "format": "text", "tokenizer": llama3}, vocab), "--json"])
        second = json.loads(result.stdout.strip().splitlines()[-1])
        # The same ids (the text file is encoded whole; the token file adds BOS/EOS at its ends,
        # so windows differ by one token and the losses are close, not equal).
        if not (first["last_loss"] > 0 and second["last_loss"] > 0):
            fail(f"train on tokens: {first}, on text: {second}")
        # The model's vocabulary must cover the tokenizer's.
        run_dir = os.path.join(folder, "run3")
        os.makedirs(run_dir)
        refused = run([STRATA, "train", train_config(run_dir, {"path": txt, "format": "text", "tokenizer": llama3}, vocab - 1)], expect=2)
        if len(refused.stderr.strip().splitlines()) != 1 or "vocab_size" not in refused.stderr:
            fail(f"a model vocabulary smaller than the tokenizer's: {refused.stderr!r}")
        refused = run([STRATA, "train", train_config(run_dir, {"path": out_llama, "format": "tokens-u16"}, 300)], expect=2)
        if len(refused.stderr.strip().splitlines()) != 1 or "outside the vocabulary" not in refused.stderr:
            fail(f"a token file beyond the model's vocabulary: {refused.stderr!r}")
        # The end-of-run sample goes through the run's tokenizer (data.tokenizer) ...
        run_dir = os.path.join(folder, "run4")
        os.makedirs(run_dir)
        path = train_config(run_dir, {"path": txt, "format": "text", "tokenizer": llama3}, vocab)
        with open(path) as f:
            cfg = json.load(f)
        cfg["sample"] = {"tokens": 6, "prompt": "The"}
        with open(path, "w") as f:
            json.dump(cfg, f)
        sampled = run([STRATA, "train", path])
        if "sample from the trained model" not in sampled.stderr:
            fail(f"sample through the tokenizer: {sampled.stderr[-400:]!r}")
        # ... and token data with no tokenizer to be found is refused before any work.
        path = train_config(run_dir, {"path": out_llama, "format": "tokens-u16"}, vocab)
        with open(path) as f:
            cfg = json.load(f)
        cfg["sample"] = {"tokens": 10}
        with open(path, "w") as f:
            json.dump(cfg, f)
        refused = run([STRATA, "train", path], expect=2)
        if len(refused.stderr.strip().splitlines()) != 1 or "sample.tokens" not in refused.stderr:
            fail(f"sample with token data: {refused.stderr!r}")
        print("cli: tokenize (jsonl, txt, u16, u32, refusals) and train on tokens-u16 and text")


def case_bad_files():
    with tempfile.TemporaryDirectory() as folder:
        _, llama3 = fixtures(folder, "llama3,llama2")
        with open(llama3) as f:
            good = json.load(f)
        txt = os.path.join(folder, "in.txt")
        with open(txt, "w") as f:
            f.write("some text\n")

        def mutate(change):
            spec = json.loads(json.dumps(good))
            change(spec)
            return spec

        def drop_byte(spec):
            del spec["model"]["vocab"]["Ġ"]

        def set_path(keys, value):
            def change(spec):
                node = spec
                for key in keys[:-1]:
                    node = node[key]
                node[keys[-1]] = value
            return change

        cases = [
            ("not json", "{\"model\": ", "not valid JSON"),
            ("an array", "[1, 2]", "not an object"),
            ("no model", mutate(lambda s: s.pop("model")), "'model'"),
            ("wordpiece", mutate(set_path(["model", "type"], "WordPiece")), "'model.type'"),
            ("vocab id string", mutate(set_path(["model", "vocab", "a"], "7")), "model.vocab[\"a\"]"),
            ("vocab id negative", mutate(set_path(["model", "vocab", "a"], -1)), "model.vocab[\"a\"]"),
            ("duplicate id", mutate(set_path(["model", "vocab", "a"], 0)), "model.vocab"),
            ("missing byte", mutate(drop_byte), "'model.vocab'"),
            ("merge unknown", mutate(lambda s: s["model"]["merges"].insert(3, ["zzzq", "q"])), "'model.merges[3]'"),
            ("merge shape", mutate(lambda s: s["model"]["merges"].insert(0, ["a", "b", "c"])), "'model.merges[0]'"),
            ("merge string", mutate(lambda s: s["model"]["merges"].insert(1, "ab")), "'model.merges[1]'"),
            ("merges not array", mutate(set_path(["model", "merges"], {})), "'model.merges'"),
            ("byte fallback", mutate(set_path(["model", "byte_fallback"], "yes")), "'model.byte_fallback'"),
            ("normalizer", mutate(set_path(["normalizer"], {"type": "Nmt"})), "'normalizer.type'"),
            ("normalizer in sequence", mutate(set_path(["normalizer"], {"type": "Sequence", "normalizers": [
                {"type": "NFC"}, {"type": "ByteLevel"}]})), "'normalizer.normalizers[1].type'"),
            ("strip keys", mutate(set_path(["normalizer"], {"type": "Strip", "strip_right": True})),
             "'normalizer.strip_left'"),
            ("bert lowercase", mutate(set_path(["normalizer"], {"type": "BertNormalizer", "lowercase": "yes"})),
             "'normalizer.lowercase'"),
            ("no charsmap", mutate(set_path(["normalizer"], {"type": "Precompiled"})), "'normalizer.precompiled_charsmap'"),
            ("replace regex", mutate(set_path(["normalizer"], {"type": "Replace", "pattern": {"Regex": "(x"}, "content": ""})),
             "'normalizer.pattern'"),
            ("replace content", mutate(set_path(["normalizer"], {"type": "Replace", "pattern": {"String": " "}})),
             "'normalizer.content'"),
            ("prepend", mutate(set_path(["normalizer"], {"type": "Prepend", "prepend": 3})), "'normalizer.prepend'"),
            ("bad regex", mutate(lambda s: s["pre_tokenizer"]["pretokenizers"][0]["pattern"].update(Regex="(unclosed")),
             "'pre_tokenizer.pretokenizers[0].pattern'"),
            ("behavior", mutate(lambda s: s["pre_tokenizer"]["pretokenizers"][0].update(behavior="Contiguous")),
             "'pre_tokenizer.pretokenizers[0].behavior'"),
            ("no byte level", mutate(lambda s: s["pre_tokenizer"]["pretokenizers"].pop(1)), "'pre_tokenizer'"),
            ("bert pre", mutate(set_path(["pre_tokenizer"], {"type": "BertPreTokenizer"})), "'pre_tokenizer.type'"),
            ("punctuation behavior", mutate(lambda s: s["pre_tokenizer"]["pretokenizers"].insert(
                0, {"type": "Punctuation", "behavior": "MergedWithNext"})), "'pre_tokenizer.pretokenizers[0].behavior'"),
            ("digits flag", mutate(lambda s: s["pre_tokenizer"]["pretokenizers"].insert(
                0, {"type": "Digits", "individual_digits": 1})), "'pre_tokenizer.pretokenizers[0].individual_digits'"),
            ("added id string", mutate(lambda s: s["added_tokens"][0].update(id="x")), "'added_tokens[0].id'"),
            ("added empty", mutate(lambda s: s["added_tokens"][1].update(content="")), "'added_tokens[1].content'"),
            ("added clash", mutate(lambda s: s["added_tokens"][0].update(id=5)), "'added_tokens[0].id'"),
            ("decoder", mutate(set_path(["decoder"], {"type": "WordPiece"})), "'decoder'"),
        ]
        # The SentencePiece-style form's own keys.
        with open(os.path.join(folder, "llama2.json")) as f:
            good2 = json.load(f)

        def mutate2(change):
            spec = json.loads(json.dumps(good2))
            change(spec)
            return spec

        cases += [
            ("unk not in vocab", mutate2(set_path(["model", "unk_token"], "<nope>")), "'model.unk_token'"),
            ("no byte tokens", mutate2(lambda s: [s["model"]["vocab"].pop(f"<0x{b:02X}>") for b in range(256)]),
             "'model.byte_fallback'"),
            ("metaspace scheme", mutate2(set_path(["pre_tokenizer"], {"type": "Metaspace", "prepend_scheme": "sometimes"})),
             "'pre_tokenizer.prepend_scheme'"),
            ("metaspace replacement", mutate2(set_path(["pre_tokenizer"], {"type": "Metaspace", "replacement": "ab"})),
             "'pre_tokenizer.replacement'"),
            ("strip content", mutate2(lambda s: s["decoder"]["decoders"][3].update(content="ab")),
             "'decoder.decoders[3].content'"),
            ("strip count", mutate2(lambda s: s["decoder"]["decoders"][3].update(start=-1)), "'decoder.decoders[3].start'"),
            ("decoder type", mutate2(lambda s: s["decoder"]["decoders"].insert(0, {"type": "WordPiece"})),
             "'decoder.decoders[0].type'"),
            ("byte-level decoder", mutate2(set_path(["decoder"], {"type": "ByteLevel"})), "'pre_tokenizer'"),
            ("normalized added", mutate2(lambda s: s["added_tokens"][2].update(normalized="yes")),
             "'added_tokens[2].normalized'"),
        ]
        # Malformed SentencePiece charsmaps, alone and inside a Sequence (the key names the step).
        for name, charsmap, reason in bad_charsmaps():
            cases.append((name, mutate(set_path(["normalizer"], {"type": "Precompiled", "precompiled_charsmap": charsmap})),
                          ("'normalizer.precompiled_charsmap'", reason)))
            cases.append((name + " in sequence", mutate(set_path(["normalizer"], {"type": "Sequence", "normalizers": [
                {"type": "NFC"}, {"type": "Precompiled", "precompiled_charsmap": charsmap}]})),
                "'normalizer.normalizers[1].precompiled_charsmap'"))
        for name, spec, needle in cases:
            path = os.path.join(folder, "bad.json")
            with open(path, "w") as f:
                f.write(spec if isinstance(spec, str) else json.dumps(spec))
            out = os.path.join(folder, "out.tok")
            result = run([STRATA, "tokenize", "--tokenizer", path, "--in", txt, "--out", out], expect=None)
            lines = result.stderr.strip().splitlines()
            needles = needle if isinstance(needle, tuple) else (needle,)
            if result.returncode != 2 or len(lines) != 1 or "bad.json" not in lines[0] or not all(n in lines[0] for n in needles):
                fail(f"{name}: exit {result.returncode}, stderr {result.stderr!r} (expected one line naming bad.json and {needle})")
            if os.path.exists(out) or os.path.exists(out + ".tmp"):
                fail(f"{name}: a refused run left {out} behind")
        # Not a SentencePiece model either.
        path = os.path.join(folder, "bad.model")
        with open(path, "wb") as f:
            f.write(b"\x00\x01garbage\xff" * 10)
        result = run([STRATA, "tokenize", "--tokenizer", path, "--in", txt, "--out", os.path.join(folder, "o")], expect=None)
        if result.returncode != 2 or len(result.stderr.strip().splitlines()) != 1 or "bad.model" not in result.stderr:
            fail(f"bad SentencePiece model: exit {result.returncode}, {result.stderr!r}")
        # Invalid UTF-8 input: one line with the byte offset.
        with open(txt, "wb") as f:
            f.write(b"valid then \xc3\x28 broken")
        result = run([STRATA, "tokenize", "--tokenizer", llama3, "--in", txt, "--out", os.path.join(folder, "o")], expect=2)
        if "byte 11" not in result.stderr or len(result.stderr.strip().splitlines()) != 1:
            fail(f"invalid UTF-8: {result.stderr!r}")
        print(f"bad_files: {len(cases) + 2} malformed inputs refused in one line, exit 2")


# Texts that exercise the Lowercase / Strip / StripAccents / BertNormalizer steps: mixed scripts
# and cases, accents composed and not, CJK, control and format characters, every kind of white
# space at the ends. The JavaScript reference differs from Hugging Face's Rust on purpose-free
# details these texts stay clear of: it lowercases a word-final Σ to ς (Rust maps each character
# alone: σ), its StripAccents drops every mark (\p{M}; Rust only Mn), its CJK test looks at UTF-16
# units (so no CJK outside the BMP), and its trim() counts U+FEFF as white space (none at an end).
NORMALIZER_TEXTS = [
    "HELLO World ÀÉÎÕÜ àéîõü ÇÑ çñ ẞ ß Æ Œ",
    "ΑΒΓ αβγ ΣΟΦΙΑ ς Ωμέγα ΆΈΉ",
    "ПРИВЕТ Мир ЁЖИК ёжик Ѓ",
    "İstanbul ISTANBUL ıi Iİ",
    "  \t leading and trailing white space \u00a0\u3000\u2003 ",
    "\u3000\u2028 ideographic and line separators \u2029\u205f",
    "\n\n\r\n only newlines around \n\r",
    "control\u0001chars\u0007here\u001f and\u007f del\u0085nel",
    "format\u200bchars\u200d\u2060 zwj \u00ad soft\u00adhyphen",
    "nul\u0000byte and \ufffd replacement",
    "private \ue000\uf8ff use",
    "中文文本和日本語の漢字、한국어 混合 mixed 汉字ABC",
    "CJK compat \uf900\ufa0d and ext A \u3400\u4db5 and radicals \u2f00",
    "cafe\u0301 CAFE\u0301 caf\u00e9 A\u030angstr\u00f6m \u212b e\u0302\u0323 o\u0308\u0304",
    "Z\u0351\u0302a\u0300lgo t\u0334e\u0335x\u0336t",
    "\u1e9b\u0323 \u1e0b\u0323 \u0149 \ufb01 \ufb03 \u2460 \u00bd \u2126 K \u212a",
    "full\uff37\uff29\uff24\uff34\uff28 \uff21\uff22\uff43 \uff11\uff12",
    "tab\tinside\tand\u000bvertical\u000cfeed",
    "emoji 😀 ❤️ 👍🏽 with text",
    "Hebrew עִבְרִית and Arabic العَرَبِيَّة diacritics",
    "Vietnamese: Tiếng Việt có dấu, TIẾNG VIỆT",
    "",
    " ",
    "\t",
    "\u00a0",
    "ABC",
]


def normalizer_texts():
    base = TEXTS + EXTRA_TEXTS + NORMALIZER_TEXTS
    # Upper- and title-cased copies (Python's own case mapping) give Lowercase more to do; a
    # capital sigma that could end a word is left out (see above).
    cased = [c for t in base for c in (t.upper(), t.title()) if c != t and "\u03a3" not in c]
    return base + cased + corpus_paragraphs()


# The normalizers checked against @huggingface/tokenizers, each on Qwen 2's byte-level form (so the
# decoded text is the normalized text, byte for byte).
NORMALIZER_FORMS = [
    ("Lowercase", {"type": "Lowercase"}),
    ("Strip both", {"type": "Strip", "strip_left": True, "strip_right": True}),
    ("Strip left", {"type": "Strip", "strip_left": True, "strip_right": False}),
    ("Strip right", {"type": "Strip", "strip_left": False, "strip_right": True}),
    ("StripAccents", {"type": "StripAccents"}),
    ("NFD+StripAccents+Lowercase", {"type": "Sequence", "normalizers": [
        {"type": "NFD"}, {"type": "StripAccents"}, {"type": "Lowercase"}]}),
    ("BertNormalizer (BERT uncased)", {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True,
                                       "strip_accents": None, "lowercase": True}),
    ("BertNormalizer (cased)", {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True,
                                "strip_accents": None, "lowercase": False}),
    ("BertNormalizer (accents only)", {"type": "BertNormalizer", "clean_text": False, "handle_chinese_chars": False,
                                       "strip_accents": True, "lowercase": False}),
    ("BertNormalizer (lowercase, keep accents)", {"type": "BertNormalizer", "clean_text": True,
                                                  "handle_chinese_chars": False, "strip_accents": False,
                                                  "lowercase": True}),
    ("Strip+Lowercase+NFC", {"type": "Sequence", "normalizers": [
        {"type": "Strip", "strip_left": True, "strip_right": True}, {"type": "Lowercase"}, {"type": "NFC"}]}),
]


def case_normalizers():
    with tempfile.TemporaryDirectory() as folder:
        qwen2 = fixture(folder, "qwen2")
        with open(qwen2) as f:
            spec = json.load(f)
        texts = normalizer_texts()
        path = os.path.join(folder, "normalized.json")
        for name, normalizer in NORMALIZER_FORMS:
            spec["normalizer"] = normalizer
            with open(path, "w") as f:
                json.dump(spec, f)
            ours = probe(path, texts, folder)
            hf = js_reference("hf", path, texts, folder)
            compare(f"{name} vs @huggingface/tokenizers", texts, ours["ids"], hf["ids"])
            compare(f"{name} normalized text vs @huggingface/tokenizers", texts, ours["decoded"], hf["decoded"])
            print(f"normalizers: {name}: {len(texts)} texts, {sum(map(len, ours['ids']))} tokens and the normalized "
                  f"text equal @huggingface/tokenizers")
        # The steps do something (the comparison alone would pass for two identities).
        spec["normalizer"] = {"type": "BertNormalizer"}
        with open(path, "w") as f:
            json.dump(spec, f)
        got = probe(path, ["\u00c9T\u00c9\u0007 \u4e2d\u6587\t x"], folder)["decoded"][0]
        if got != "ete  \u4e2d  \u6587   x":
            fail(f"BertNormalizer with its defaults gave {got!r}")


# ---- Precompiled: a SentencePiece charsmap against SentencePiece itself ----

def proto_fields(buf):
    """The (field number, bytes or None) pairs of one protobuf message (enough to find a field)."""
    def varint(i):
        value, shift = 0, 0
        while True:
            b = buf[i]
            i += 1
            value |= (b & 0x7F) << shift
            shift += 7
            if b < 0x80:
                return value, i
    i = 0
    while i < len(buf):
        key, i = varint(i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            _, i = varint(i)
            yield number, None
        elif wire == 2:
            length, i = varint(i)
            yield number, buf[i:i + length]
            i += length
        elif wire in (1, 5):
            i += 8 if wire == 1 else 4
            yield number, None
        else:
            raise ValueError(f"protobuf wire type {wire}")


def precompiled_charsmap(model_path):
    """ModelProto.normalizer_spec (field 3) .precompiled_charsmap (field 2): what transformers'
    converter writes, base64, into the Precompiled normalizer."""
    with open(model_path, "rb") as f:
        model = f.read()
    spec = next(value for number, value in proto_fields(model) if number == 3)
    return next(value for number, value in proto_fields(spec) if number == 2)


def byte_level_json(normalizer):
    """The smallest byte-level BPE (the 256 byte symbols, no merges): it decodes to the normalized
    text exactly, so the probe's decoded text is what the normalizer made."""
    byte_to_char, extra = {}, 256
    for b in range(256):
        if 33 <= b <= 126 or 161 <= b <= 172 or 174 <= b <= 255:
            byte_to_char[b] = chr(b)
        else:
            byte_to_char[b] = chr(extra)
            extra += 1
    return {
        "version": "1.0", "added_tokens": [], "normalizer": normalizer,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "post_processor": None, "decoder": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False},
        "model": {"type": "BPE", "vocab": {byte_to_char[b]: b for b in range(256)}, "merges": []},
    }


PRECOMPILED_TEXTS = [
    "\uff48\uff45\uff4c\uff4c\uff4f\u3000\uff37\uff4f\uff52\uff4c\uff44 \uff01\uff1f\uff08\uff09\uff3b\uff3d",
    "\ufb01ne \ufb02y \ufb00 \ufb03 \ufb04 \u0133 \u01c6 \u2474 \u2488 \u2460\u2461\u2462 \u00bd \u2153",
    "\u337b \u3300 \u3392 \u33a1 \u2122 \u2121 \u2116 \u00b5 \u212b \u2126",
    "\uff76\uff9e \uff8a\uff9f \uff76\u3099 \u30ab\u3099 \u30cf\u309a \uff67\uff68 \uff71\uff72\uff73",
    "a\u0001b\u0007c\u001fd\u007fe\u0085f\u008fg\u009f",
    "tab\there\u000bvt\u000cff\r\ncrlf\nlf",
    "\u00a0nbsp \u1680ogham \u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a spaces",
    "zw\u200bsp\u200cnj\u200dj\u200erl\u200fm \u2028ls\u2029ps \u202fnn\u205fmm \ufeffbom \ufffdrepl",
    "cafe\u0301 caf\u00e9 A\u030angstr\u00f6m \u1e9b\u0323 o\u0308\u0304 \u0449\u0306",
    "\U0001d518\U0001d52b\U0001d526 \U0001d400\U0001d401 \U0001f130 \U0001f600 \u24b6\u24d0",
    "\u2160\u2161\u2162 \u2170\u2171 \u00b2\u00b3\u00b9 \u2070\u2074 \u2080\u2081",
    "\u2025 \u2026 \u2033 \u2034 \u301c \uff5e \u2015 \u2012 \u2013 \u2014",
    "\u3131\u314f \u1100\u1161 \uffa1\uffc2 \uac00 \u110b\u1175\u11ab",
    "\u0e01\u0e33 \u0eb3 \u0f77 \u0f79 \u2e9f \u2fd5 \u32a4 \u3251",
    "\u0915\u093c \u0958 \u09a1\u09bc \u0a33 \u0a59 \u0b21\u0b3c",
    "Plain ASCII text, digits 0123456789, and punctuation: !@#$%^&*()_+-=[]{};':\",./<>?",
    "\u2581already meta \u2581\u2581",
    "\uff10\uff11\uff12\uff13\uff14\uff15\uff16\uff17\uff18\uff19 \uff21\uff22\uff23 \uff41\uff42\uff43",
    "\u3000\u3000  \u3000 double width spaces \u3000",
    "\u00c5\u212b \u0041\u030a \u1e0a\u0323 \u1e0c\u0307 \u01c4\u01c5",
    # Where Hugging Face's per-grapheme shortest match departs from SentencePiece (docs/tokenizers.md):
    # a ligature with an accent keeps it, a halfwidth voiced kana is one rule, NUL does not stop.
    "\ufb01\u0301 \u2460\u0301 \uff76\uff9e \uff8a\uff9f a\u0000\uff41",
]


def case_precompiled():
    try:
        import sentencepiece as spm
    except ImportError:
        skip("python3-sentencepiece is not installed (scripts/setup.sh installs it)")
    import base64
    texts = PRECOMPILED_TEXTS + [t for t in TEXTS + EXTRA_TEXTS if t] + corpus_paragraphs()[:40]
    with tempfile.TemporaryDirectory() as folder:
        results = {}
        for rule in ("nmt_nfkc", "nfkc_cf"):
            # No dummy prefix, whitespace kept: then SentencePiece's normalized text is the charsmap's
            # output with ' ' written as '▁' (its escape), and its pieces, unknown ones included,
            # are that text cut up.
            prefix = os.path.join(folder, rule)
            spm.SentencePieceTrainer.train(input=CORPUS, model_prefix=prefix, vocab_size=300, model_type="bpe",
                                           normalization_rule_name=rule, remove_extra_whitespaces=False,
                                           add_dummy_prefix=False, minloglevel=2)
            reference = spm.SentencePieceProcessor(model_file=prefix + ".model")
            expected = ["".join(reference.encode(t, out_type=str)) for t in texts]
            charsmap = precompiled_charsmap(prefix + ".model")
            path = os.path.join(folder, rule + ".json")
            with open(path, "w") as f:
                json.dump(byte_level_json({"type": "Sequence", "normalizers": [
                    {"type": "Precompiled", "precompiled_charsmap": base64.b64encode(charsmap).decode()},
                    {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]}), f)
            ours = probe(path, texts, folder)["decoded"]
            compare(f"Precompiled ({rule}) vs SentencePiece's normalizer", texts, ours, expected)
            changed = sum(1 for t, e in zip(texts, expected) if e != t.replace(" ", "\u2581"))
            if changed < len(PRECOMPILED_TEXTS) - 2:
                fail(f"Precompiled ({rule}): only {changed} texts changed; the map is not being exercised")
            results[rule] = ours
            print(f"precompiled: {rule} charsmap ({len(charsmap)} bytes): {len(texts)} texts normalize as "
                  f"SentencePiece does ({changed} changed)")
        if results["nmt_nfkc"] == results["nfkc_cf"]:
            fail("precompiled: nmt_nfkc and nfkc_cf gave the same text (case folding lost)")
        # An empty charsmap maps nothing (Hugging Face accepts it too).
        path = os.path.join(folder, "empty.json")
        with open(path, "w") as f:
            json.dump(byte_level_json({"type": "Precompiled", "precompiled_charsmap": ""}), f)
        if probe(path, texts, folder)["decoded"] != texts:
            fail("precompiled: an empty charsmap changed the text")
        # The hand-built map the malformed cases (bad_files, fuzz seeds) start from is itself well formed.
        with open(path, "w") as f:
            json.dump(byte_level_json({"type": "Precompiled", "precompiled_charsmap": base64.b64encode(tiny_charsmap()).decode()}), f)
        got = probe(path, ["banana \u00e1a"], folder)["decoded"]
        if got != ["bbnbnb \u00e1b"]:
            fail(f"precompiled: the one-rule map 'a' -> 'b' gave {got}")


def tiny_charsmap(value=0, pool=b"b\x00", leaf=True, trie_units=None, cycle=False):
    """A hand-built Darts double array with one rule, 'a' → the pool string at `value`: root unit 0
    (children at 1 ^ label), the 'a' node at 1 ^ 0x61 = 96 with its value unit at 97; `cycle` makes
    the 'a' node's children those of the root (itself among them)."""
    units = [1 << 31] * 98  # unused units: a label no byte matches
    units[0] = 1 << 10
    units[96] = ((97 if cycle else 1) << 10) | (1 << 8 if leaf else 0) | 0x61
    units[97] = (1 << 31) | value
    if cycle:
        units[96] &= ~(1 << 8)
    blob = b"".join(u.to_bytes(4, "little") for u in units)
    size = len(blob) if trie_units is None else trie_units * 4
    return size.to_bytes(4, "little") + blob + pool


def bad_charsmaps():
    """(name, base64 charsmap, what the refusal names) for the malformed-charsmap cases (also the
    fuzz seeds in fuzz/corpus/tokenizer/)."""
    import base64
    b64 = lambda blob: base64.b64encode(blob).decode()
    good = tiny_charsmap()
    return [
        ("charsmap not base64", "not*base64!", "is not base64"),
        ("charsmap too short", b64(b"\x01\x00"), "shorter than"),
        ("charsmap truncated", b64(good[:200]), "trie is"),
        ("charsmap odd trie size", b64(b"\x05\x00\x00\x00" + good[4:]), "trie is"),
        ("charsmap offset past pool", b64(tiny_charsmap(value=7)), "outside"),
        ("charsmap pool without NUL", b64(tiny_charsmap(pool=b"bcd")), "lacks its NUL"),
        ("charsmap cycle", b64(tiny_charsmap(cycle=True)), "a cycle"),
        ("charsmap replacement not UTF-8", b64(tiny_charsmap(pool=b"\xff\x00")), "not UTF-8"),
    ]


def case_pretokenizers():
    """Whitespace, WhitespaceSplit, Digits and Punctuation, each before ByteLevel (no regex) on Qwen
    2's fixture and before Metaspace (prepend never) on Llama 2's — whose merges cross punctuation
    and digits ("s." "7."), so a missed cut changes ids — against @huggingface/tokenizers. The JS
    versions are narrower than Rust's in ways the texts avoid: Whitespace's \\w and Digits' \\d
    are ASCII there (Rust: Unicode), so those two see only texts whose letters and digits are
    ASCII; its Punctuation groups runs whatever `behavior` says, so it checks Contiguous
    (Isolated and Removed are checked by hand below, with Unicode white space and digits)."""
    import unicodedata
    with tempfile.TemporaryDirectory() as folder:
        qwen2 = fixture(folder, "qwen2")
        fixtures(folder, "llama2")
        specs = []
        for source, last in ((qwen2, {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                                      "use_regex": False}),
                             (os.path.join(folder, "llama2_metaspace.json"),
                              {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "never", "split": False})):
            with open(source) as f:
                specs.append((json.load(f), last))
        # JS's \s counts U+FEFF and not U+0085; Rust's White_Space the other way round.
        everything = [t for t in normalizer_texts() if "\ufeff" not in t and "\x85" not in t]
        ascii_only = [t for t in everything if t.isascii()]
        ascii_digits = [t for t in everything
                        if all(c.isascii() or not unicodedata.category(c).startswith("N") for c in t)]
        forms = [
            ("Whitespace", {"type": "Whitespace"}, ascii_only),
            ("WhitespaceSplit", {"type": "WhitespaceSplit"}, everything),
            ("Digits (individual)", {"type": "Digits", "individual_digits": True}, ascii_digits),
            ("Digits (runs)", {"type": "Digits", "individual_digits": False}, ascii_digits),
            ("Punctuation (Contiguous)", {"type": "Punctuation", "behavior": "Contiguous"}, everything),
        ]
        path = os.path.join(folder, "pre.json")

        def write(first, which=0):
            spec, last = specs[which]
            spec["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [first, last]}
            with open(path, "w") as f:
                json.dump(spec, f)

        for which, shape in enumerate(("ByteLevel", "Metaspace")):
            for name, step, texts in forms:
                write(step, which)
                ours = probe(path, texts, folder)
                hf = js_reference("hf", path, texts, folder)
                compare(f"{name} + {shape} vs @huggingface/tokenizers", texts, ours["ids"], hf["ids"])
                compare(f"{name} + {shape} decode vs @huggingface/tokenizers", texts, ours["decoded"], hf["decoded"])
                print(f"pretokenizers: {name} + {shape}: {len(texts)} texts, {sum(map(len, ours['ids']))} tokens "
                      f"equal @huggingface/tokenizers")
        # Rust's semantics where the JS reference has none. A cut shows as the ids of the parts
        # encoded alone; each text is one whose merges would cross the cut (checked: uncut, the
        # ids differ), on the Llama 2 fixture.
        def ids(step, texts):
            write(step, 1)
            return [i for p in probe(path, texts, folder)["ids"] for i in p]

        plain = {"type": "Split", "pattern": {"String": "\u0000"}, "behavior": "Isolated"}  # cuts nothing here
        checks = [
            ({"type": "Punctuation"}, "works..", ["works", ".", "."]),
            ({"type": "Punctuation", "behavior": "Removed"}, "works.the", ["works", "the"]),
            ({"type": "Whitespace"}, "na\u00efve\u00a0works.", ["na\u00efve", "works", "."]),
            ({"type": "WhitespaceSplit"}, "na\u00efve\u3000works", ["na\u00efve", "works"]),
            ({"type": "Digits", "individual_digits": True}, "\u0661\u06622007.", ["\u0661", "\u0662", "2", "0", "0", "7", "."]),
            ({"type": "Digits"}, "2007.", ["2007", "."]),
        ]
        for step, text, parts in checks:
            if ids(step, [text]) != ids(step, parts):
                fail(f"pretokenizers: {step} on {text!r} did not cut into {parts}")
            if ids(plain, [text]) == ids(plain, parts):
                fail(f"pretokenizers: {text!r} uncut encodes like {parts}: the check could not fail")
        print(f"pretokenizers: {len(checks)} cuts Rust makes and the JS reference cannot show")


{"gpt2": case_gpt2, "llama3": case_llama3, "qwen2": case_qwen2, "llama2": case_llama2, "config": case_config,
 "sentencepiece": case_sentencepiece, "cli": case_cli, "bad_files": case_bad_files,
 "normalizers": case_normalizers, "precompiled": case_precompiled, "pretokenizers": case_pretokenizers}[CASE]()
