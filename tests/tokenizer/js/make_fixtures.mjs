// Builds the tokenizer.json fixtures the tokenizer tests compare strata against (no network:
// Hugging Face's hub is out of reach, npm is not):
//  - gpt2.json: GPT-2's real vocabulary and merges, rebuilt from the ranks js-tiktoken ships
//    (a merge a+b exists for every multi-byte token, found by running rank-BPE on its bytes up to
//    its own rank — how Hugging Face converts tiktoken files), merges in the "a b" string form,
//    pre_tokenizer ByteLevel with its GPT-2 regex.
//  - llama3.json: a small BPE learnt here on the given corpus, with Llama-3's shape: the Split
//    regex (case-insensitive contractions, 1-3 digit numbers) inside a Sequence with
//    ByteLevel(use_regex: false), ignore_merges, merges in the [a, b] pair form, added tokens
//    and a TemplateProcessing that starts with <|begin_of_text|>.
//  - qwen2.json: Qwen 2's form: an NFC normalizer, its Split regex (single digits) and
//    ByteLevel, "a b" merges learnt here (accented letters included, so NFC changes ids), the
//    <|endoftext|> / <|im_start|> / <|im_end|> added tokens, no BOS.
//  - llama2.json and llama2_metaspace.json: Llama 2's SentencePiece-style BPE as Hugging Face
//    converts it: <unk> <s> </s>, the 256 <0xNN> byte tokens, characters and merges learnt here
//    on '▁'-prefixed words (rare characters left to byte_fallback), fuse_unk, the decoder
//    Sequence Replace('▁', ' '), ByteFallback, Fuse, Strip(' ', 1, 0); llama2.json with the legacy
//    normalizer Prepend('▁') + Replace(' ', '▁') and no pre-tokenizer, llama2_metaspace.json with
//    no normalizer and Metaspace(prepend_scheme first, split false) — transformers' two forms.
// Usage: node make_fixtures.mjs OUT_DIR CORPUS_FILE [gpt2,llama3,qwen2,llama2]
import fs from "node:fs";
import path from "node:path";
import gpt2Ranks from "js-tiktoken/ranks/gpt2";

const [outDir, corpusPath, onlyList] = process.argv.slice(2);
// The fixtures to make (a comma-separated list; all when absent): each test makes only its own.
const wanted = (name) => !onlyList || onlyList.split(",").includes(name);
const corpus = fs.readFileSync(corpusPath, "utf8");
fs.mkdirSync(outDir, { recursive: true });

// GPT-2's bytes_to_unicode.
const byteToChar = [];
{
  let next = 256;
  for (let b = 0; b < 256; ++b) {
    const printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    byteToChar.push(String.fromCodePoint(printable ? b : next++));
  }
}
const mapBytes = (bytes) => Array.from(bytes, (b) => byteToChar[b]).join("");

function make_gpt2() {
  // ---- gpt2.json ----
  const rankOf = new Map(); // latin1 string of the bytes → rank
  const tokens = [];
  for (const line of gpt2Ranks.bpe_ranks.split("\n")) {
    if (!line) continue;
    const [, offsetText, ...encoded] = line.split(" ");
    const offset = Number.parseInt(offsetText, 10);
    encoded.forEach((b64, i) => {
      const bytes = Buffer.from(b64, "base64");
      rankOf.set(bytes.toString("latin1"), offset + i);
      tokens.push([bytes, offset + i]);
    });
  }
  function rankBpe(bytes, maxRank) {
    let parts = Array.from(bytes, (b) => String.fromCharCode(b));
    for (;;) {
      let best = -1;
      let bestRank = Infinity;
      for (let i = 0; i + 1 < parts.length; ++i) {
        const r = rankOf.get(parts[i] + parts[i + 1]);
        if (r !== undefined && r < bestRank) {
          bestRank = r;
          best = i;
        }
      }
      if (best < 0 || bestRank >= maxRank) return parts;
      parts = [...parts.slice(0, best), parts[best] + parts[best + 1], ...parts.slice(best + 2)];
    }
  }
  const gpt2Vocab = {};
  const gpt2Merges = [];
  for (const [bytes, rank] of tokens) {
    gpt2Vocab[mapBytes(bytes)] = rank;
    if (bytes.length < 2) continue;
    const parts = rankBpe(bytes, rank);
    if (parts.length !== 2) throw new Error(`token ${rank} does not split into two`);
    const [a, b] = parts.map((p) => mapBytes(Buffer.from(p, "latin1")));
    gpt2Merges.push([rank, `${a} ${b}`]);
  }
  gpt2Merges.sort((x, y) => x[0] - y[0]);
  for (const [content, id] of Object.entries(gpt2Ranks.special_tokens)) gpt2Vocab[content] = id;
  const gpt2 = {
    version: "1.0",
    truncation: null,
    padding: null,
    added_tokens: Object.entries(gpt2Ranks.special_tokens).map(([content, id]) => ({
      id, content, single_word: false, lstrip: false, rstrip: false, normalized: true, special: true,
    })),
    normalizer: null,
    pre_tokenizer: { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: true },
    post_processor: { type: "ByteLevel", add_prefix_space: true, trim_offsets: false, use_regex: true },
    decoder: { type: "ByteLevel", add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: {
      type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: "", end_of_word_suffix: "",
      fuse_unk: false, byte_fallback: false, vocab: gpt2Vocab, merges: gpt2Merges.map((m) => m[1]),
    },
  };
  fs.writeFileSync(path.join(outDir, "gpt2.json"), JSON.stringify(gpt2));
}

function make_llama3() {
  // ---- llama3.json: learn merges on the corpus ----
  const LLAMA3_PATTERN =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
  // For learning only (JS has no inline (?i:) before Node 23); the exact pieces do not matter here.
  const learnPattern = /'s|'t|'re|'ve|'m|'ll|'d|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+/gu;
  const wordCounts = new Map();
  for (const m of corpus.matchAll(learnPattern)) wordCounts.set(m[0], (wordCounts.get(m[0]) ?? 0) + 1);
  const words = [...wordCounts].map(([w, count]) => ({ symbols: Array.from(Buffer.from(w, "utf8"), (b) => byteToChar[b]), count }));
  const llamaVocab = {};
  byteToChar.forEach((c, i) => (llamaVocab[c] = i));
  const llamaMerges = [];
  const MERGE_COUNT = 1500;
  while (llamaMerges.length < MERGE_COUNT) {
    const pairCounts = new Map();
    for (const { symbols, count } of words)
      for (let i = 0; i + 1 < symbols.length; ++i) {
        const key = symbols[i] + "\u0000" + symbols[i + 1];
        pairCounts.set(key, (pairCounts.get(key) ?? 0) + count);
      }
    let bestKey = null;
    let bestCount = 1;
    for (const [key, count] of pairCounts) if (count > bestCount || (count === bestCount && bestKey !== null && key < bestKey)) [bestKey, bestCount] = [key, count];
    if (bestKey === null) break;
    const [a, b] = bestKey.split("\u0000");
    llamaMerges.push([a, b]);
    if (!(a + b in llamaVocab)) llamaVocab[a + b] = Object.keys(llamaVocab).length;
    for (const word of words) {
      const s = word.symbols;
      const merged = [];
      for (let i = 0; i < s.length; ++i) {
        if (i + 1 < s.length && s[i] === a && s[i + 1] === b) {
          merged.push(a + b);
          ++i;
        } else merged.push(s[i]);
      }
      word.symbols = merged;
    }
  }
  const base = Object.keys(llamaVocab).length;
  const llamaAdded = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"].map((content, i) => ({
    id: base + i, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true,
  }));
  const llama3 = {
    version: "1.0",
    truncation: null,
    padding: null,
    added_tokens: llamaAdded,
    normalizer: null,
    pre_tokenizer: {
      type: "Sequence",
      pretokenizers: [
        { type: "Split", pattern: { Regex: LLAMA3_PATTERN }, behavior: "Isolated", invert: false },
        { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: false },
      ],
    },
    post_processor: {
      type: "Sequence",
      processors: [
        { type: "ByteLevel", add_prefix_space: true, trim_offsets: false, use_regex: true },
        {
          type: "TemplateProcessing",
          single: [{ SpecialToken: { id: "<|begin_of_text|>", type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } }],
          pair: [{ SpecialToken: { id: "<|begin_of_text|>", type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } },
                 { SpecialToken: { id: "<|begin_of_text|>", type_id: 1 } }, { Sequence: { id: "B", type_id: 1 } }],
          special_tokens: { "<|begin_of_text|>": { id: "<|begin_of_text|>", ids: [base], tokens: ["<|begin_of_text|>"] } },
        },
      ],
    },
    decoder: { type: "ByteLevel", add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: {
      type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: null, end_of_word_suffix: null,
      fuse_unk: false, byte_fallback: false, ignore_merges: true, vocab: llamaVocab, merges: llamaMerges,
    },
  };
  fs.writeFileSync(path.join(outDir, "llama3.json"), JSON.stringify(llama3));
}

// ---- learning merges on words of symbols (most frequent pair first, ties by the pair's text) ----
function learnMerges(words, vocab, count) {
  const merges = [];
  while (merges.length < count) {
    const pairCounts = new Map();
    for (const { symbols, count: n } of words)
      for (let i = 0; i + 1 < symbols.length; ++i) {
        const key = symbols[i] + "\u0000" + symbols[i + 1];
        pairCounts.set(key, (pairCounts.get(key) ?? 0) + n);
      }
    let bestKey = null;
    let bestCount = 1;
    for (const [key, n] of pairCounts) if (n > bestCount || (n === bestCount && bestKey !== null && key < bestKey)) [bestKey, bestCount] = [key, n];
    if (bestKey === null) break;
    const [a, b] = bestKey.split("\u0000");
    merges.push([a, b]);
    if (!(a + b in vocab)) vocab[a + b] = Object.keys(vocab).length;
    for (const word of words) {
      const s = word.symbols;
      const merged = [];
      for (let i = 0; i < s.length; ++i) {
        if (i + 1 < s.length && s[i] === a && s[i + 1] === b) {
          merged.push(a + b);
          ++i;
        } else merged.push(s[i]);
      }
      word.symbols = merged;
    }
  }
  return merges;
}
// Accented letters (composed, as NFC leaves them) so the learnt vocabularies hold them whole.
const accented = "café résumé naïve déjà vu über straße mañana señor crème brûlée ".repeat(40);

function make_qwen2() {
  // ---- qwen2.json ----
  const QWEN2_PATTERN =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
  const qwenLearn = /'s|'t|'re|'ve|'m|'ll|'d|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+/gu;
  const qwenCounts = new Map();
  for (const m of (corpus + accented).matchAll(qwenLearn)) qwenCounts.set(m[0], (qwenCounts.get(m[0]) ?? 0) + 1);
  const qwenWords = [...qwenCounts].map(([w, count]) => ({ symbols: Array.from(Buffer.from(w, "utf8"), (b) => byteToChar[b]), count }));
  const qwenVocab = {};
  byteToChar.forEach((c, i) => (qwenVocab[c] = i));
  const qwenMerges = learnMerges(qwenWords, qwenVocab, 1200);
  const qwenBase = Object.keys(qwenVocab).length;
  const qwen2 = {
    version: "1.0",
    truncation: null,
    padding: null,
    added_tokens: ["<|endoftext|>", "<|im_start|>", "<|im_end|>"].map((content, i) => ({
      id: qwenBase + i, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true,
    })),
    normalizer: { type: "NFC" },
    pre_tokenizer: {
      type: "Sequence",
      pretokenizers: [
        { type: "Split", pattern: { Regex: QWEN2_PATTERN }, behavior: "Isolated", invert: false },
        { type: "ByteLevel", add_prefix_space: false, trim_offsets: false, use_regex: false },
      ],
    },
    post_processor: { type: "ByteLevel", add_prefix_space: false, trim_offsets: false, use_regex: false },
    decoder: { type: "ByteLevel", add_prefix_space: false, trim_offsets: false, use_regex: false },
    model: {
      type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: "", end_of_word_suffix: "",
      fuse_unk: false, byte_fallback: false, vocab: qwenVocab, merges: qwenMerges.map(([a, b]) => `${a} ${b}`),
    },
  };
  fs.writeFileSync(path.join(outDir, "qwen2.json"), JSON.stringify(qwen2));
}

function make_llama2() {
  // ---- llama2.json, llama2_metaspace.json ----
  const META = "\u2581";
  const llama2Vocab = { "<unk>": 0, "<s>": 1, "</s>": 2 };
  for (let b = 0; b < 256; ++b) llama2Vocab[`<0x${b.toString(16).toUpperCase().padStart(2, "0")}>`] = 3 + b;
  const pieceCounts = new Map();
  for (const word of (corpus + accented).split(/\s+/)) if (word) pieceCounts.set(META + word, (pieceCounts.get(META + word) ?? 0) + 1);
  pieceCounts.set(META + META, 50); // a run of spaces, as SentencePiece vocabularies have
  const charCounts = new Map();
  for (const [piece, count] of pieceCounts) for (const c of piece) charCounts.set(c, (charCounts.get(c) ?? 0) + count);
  // Characters seen at least 5 times get a token; the rest (and all of CJK, emoji) fall back to bytes.
  for (const [c, count] of [...charCounts].sort((x, y) => y[1] - x[1] || (x[0] < y[0] ? -1 : 1)))
    if (count >= 5) llama2Vocab[c] = Object.keys(llama2Vocab).length;
  const llama2Words = [...pieceCounts].map(([w, count]) => ({ symbols: Array.from(w).filter((c) => c in llama2Vocab), count }));
  const llama2Merges = learnMerges(llama2Words, llama2Vocab, 800);
  const llama2Decoder = {
    type: "Sequence",
    decoders: [
      { type: "Replace", pattern: { String: META }, content: " " },
      { type: "ByteFallback" },
      { type: "Fuse" },
      { type: "Strip", content: " ", start: 1, stop: 0 },
    ],
  };
  const llama2 = {
    version: "1.0",
    truncation: null,
    padding: null,
    added_tokens: ["<unk>", "<s>", "</s>"].map((content, id) => ({
      id, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true,
    })),
    normalizer: {
      type: "Sequence",
      normalizers: [{ type: "Prepend", prepend: META }, { type: "Replace", pattern: { String: " " }, content: META }],
    },
    pre_tokenizer: null,
    post_processor: {
      type: "TemplateProcessing",
      single: [{ SpecialToken: { id: "<s>", type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } }],
      pair: [{ SpecialToken: { id: "<s>", type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } },
             { SpecialToken: { id: "<s>", type_id: 1 } }, { Sequence: { id: "B", type_id: 1 } }],
      special_tokens: { "<s>": { id: "<s>", ids: [1], tokens: ["<s>"] } },
    },
    decoder: llama2Decoder,
    model: {
      type: "BPE", dropout: null, unk_token: "<unk>", continuing_subword_prefix: null, end_of_word_suffix: null,
      fuse_unk: true, byte_fallback: true, ignore_merges: false, vocab: llama2Vocab,
      merges: llama2Merges.map(([a, b]) => `${a} ${b}`),
    },
  };
  fs.writeFileSync(path.join(outDir, "llama2.json"), JSON.stringify(llama2));
  const llama2Metaspace = {
    ...llama2,
    normalizer: null,
    pre_tokenizer: { type: "Metaspace", replacement: META, prepend_scheme: "first", split: false },
  };
  fs.writeFileSync(path.join(outDir, "llama2_metaspace.json"), JSON.stringify(llama2Metaspace));
}

if (wanted("gpt2")) make_gpt2();
if (wanted("llama3")) make_llama3();
if (wanted("qwen2")) make_qwen2();
if (wanted("llama2")) make_llama2();  // also llama2_metaspace.json
