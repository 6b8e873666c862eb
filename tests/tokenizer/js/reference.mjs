// The independent side of the tokenizer tests and of bench/tokenize.py: encodes texts with the
// JavaScript implementations and prints the ids as JSON.
// Usage: node reference.mjs hf TOKENIZER_JSON TEXTS_JSON     (@huggingface/tokenizers, no specials added)
//        node reference.mjs tiktoken-gpt2 - TEXTS_JSON      (js-tiktoken with its own GPT-2 ranks)
//        node reference.mjs bench-hf TOKENIZER_JSON TEXT_FILE (prints {"seconds", "tokens"} of one encode)
//        node reference.mjs bench-tiktoken-gpt2 - TEXT_FILE   (the same with js-tiktoken)
import fs from "node:fs";
import { Tokenizer } from "@huggingface/tokenizers";
import { Tiktoken } from "js-tiktoken/lite";
import gpt2Ranks from "js-tiktoken/ranks/gpt2";

const [mode, tokenizerPath, inputPath] = process.argv.slice(2);
if (mode === "bench-tiktoken-gpt2") {
  const encoder = new Tiktoken(gpt2Ranks);
  const text = fs.readFileSync(inputPath, "utf8");
  const start = process.hrtime.bigint();
  const ids = encoder.encode(text, "all");
  const seconds = Number(process.hrtime.bigint() - start) / 1e9;
  console.log(JSON.stringify({ seconds, tokens: ids.length }));
} else if (mode === "tiktoken-gpt2") {
  const encoder = new Tiktoken(gpt2Ranks);
  const texts = JSON.parse(fs.readFileSync(inputPath, "utf8"));
  // "all": <|endoftext|> in the text is the special token, as strata and Hugging Face match it.
  console.log(JSON.stringify({ ids: texts.map((t) => encoder.encode(t, "all")) }));
} else {
  const tokenizer = new Tokenizer(JSON.parse(fs.readFileSync(tokenizerPath, "utf8")), {});
  if (mode === "hf") {
    const texts = JSON.parse(fs.readFileSync(inputPath, "utf8"));
    const ids = texts.map((t) => tokenizer.encode(t, { add_special_tokens: false }).ids);
    const decoded = ids.map((i) => i.length === 0 ? "" : tokenizer.decode(i, { skip_special_tokens: false, clean_up_tokenization_spaces: false }));
    console.log(JSON.stringify({ ids, decoded }));
  } else if (mode === "bench-hf") {
    const text = fs.readFileSync(inputPath, "utf8");
    const start = process.hrtime.bigint();
    const ids = tokenizer.encode(text, { add_special_tokens: false }).ids;
    const seconds = Number(process.hrtime.bigint() - start) / 1e9;
    console.log(JSON.stringify({ seconds, tokens: ids.length }));
  } else {
    throw new Error(`unknown mode ${mode}`);
  }
}
