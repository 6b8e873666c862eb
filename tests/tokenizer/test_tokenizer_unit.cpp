// The BPE tokenizer on hand-built tokenizer.json texts whose ids are worked out by hand: merge
// order (lowest rank first, leftmost among equals, not "first merge that applies"), ignore_merges,
// added tokens before the split (longest wins, lstrip/rstrip), Split Removed, both merge forms,
// decode of every id, and the UTF-8 check (overlongs, surrogates, truncation) with its offset.
// The SentencePiece-style form where the JavaScript reference cannot check it: Metaspace with
// split (which it lacks), the Metaspace decoder, unk_token with fuse_unk, a character nothing
// stands for; NFC over texts longer than one normalization chunk; tokenizer_config.json; the
// normalizers where Hugging Face's Rust and the JavaScript reference differ.
#include <gtest/gtest.h>

#include <string>

#include "text/tokenizer.h"
#include "text/transforms.h"

namespace strata::tokenizer {
namespace {

// A byte-level vocabulary (ids 0..255 in GPT-2's byte order: id == byte) plus `extra` tokens.
std::string tokenizer_json(const std::string& extra_vocab, const std::string& merges, const std::string& pre,
                           const std::string& added = "[]", bool ignore_merges = false) {
  std::string vocab;
  uint32_t next = 256;
  for (uint32_t byte = 0; byte < 256; ++byte) {
    bool printable = (byte >= 33 && byte <= 126) || (byte >= 161 && byte <= 172) || (byte >= 174 && byte <= 255);
    uint32_t code_point = printable ? byte : next++;
    std::string symbol;
    if (code_point < 0x80) {
      if (code_point == '"' || code_point == '\\') symbol += '\\';
      symbol += static_cast<char>(code_point);
    } else {
      symbol += static_cast<char>(0xC0 | (code_point >> 6));
      symbol += static_cast<char>(0x80 | (code_point & 0x3F));
    }
    vocab += (byte ? "," : "") + ("\"" + symbol + "\":") + std::to_string(byte);
  }
  return R"({"model":{"type":"BPE","ignore_merges":)" + std::string(ignore_merges ? "true" : "false") +
         R"(,"vocab":{)" + vocab + extra_vocab + R"(},"merges":)" + merges + R"(},"pre_tokenizer":)" + pre +
         R"(,"added_tokens":)" + added + "}";
}

const std::string kByteLevel = R"({"type":"ByteLevel","add_prefix_space":false,"use_regex":true})";

std::vector<uint32_t> encode(const Tokenizer& tok, std::string_view text) {
  Result<std::vector<uint32_t>> ids = tok.encode(text);
  EXPECT_TRUE(ids.ok()) << ids.status().to_string();
  return ids.ok() ? *ids : std::vector<uint32_t>{};
}

TEST(Bpe, MergesByRankNotByPosition) {
  // "bc" has the better rank, so "abc" → a + bc although "a b" would apply first left to right.
  auto tok = parse_bpe_json(tokenizer_json(R"(,"ab":256,"bc":257,"abc":258)", R"(["b c","a b","a bc"])", kByteLevel), "t.json");
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  EXPECT_EQ(encode(**tok, "abc"), (std::vector<uint32_t>{258}));
  EXPECT_EQ(encode(**tok, "ab"), (std::vector<uint32_t>{256}));
  EXPECT_EQ(encode(**tok, "abab"), (std::vector<uint32_t>{256, 256}));
  EXPECT_EQ(encode(**tok, "cab"), (std::vector<uint32_t>{'c', 256}));
}

TEST(Bpe, LeftmostAmongEqualRanks) {
  // "aaa": the pair (a, a) at 0 merges first → aa + a, never a + aa.
  auto tok = parse_bpe_json(tokenizer_json(R"(,"aa":256)", R"([["a","a"]])", kByteLevel), "t.json");
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  EXPECT_EQ(encode(**tok, "aaa"), (std::vector<uint32_t>{256, 'a'}));
  EXPECT_EQ(encode(**tok, "aaaa"), (std::vector<uint32_t>{256, 256}));
  std::string long_run(100000, 'a');  // O(n log n) merging: this returns at once
  EXPECT_EQ(encode(**tok, long_run).size(), 50000u);
}

TEST(Bpe, IgnoreMergesTakesWholeWords) {
  // "abc" is in the vocabulary but no merge chain reaches it.
  std::string extra = R"(,"ab":256,"abc":257)";
  auto plain = parse_bpe_json(tokenizer_json(extra, R"(["a b"])", kByteLevel), "t.json");
  auto ignoring = parse_bpe_json(tokenizer_json(extra, R"(["a b"])", kByteLevel, "[]", true), "t.json");
  ASSERT_TRUE(plain.ok() && ignoring.ok());
  EXPECT_EQ(encode(**plain, "abc"), (std::vector<uint32_t>{256, 'c'}));
  EXPECT_EQ(encode(**ignoring, "abc"), (std::vector<uint32_t>{257}));
}

TEST(Bpe, ByteLevelMapsSpacesAndBytes) {
  // "Ġa" is " a" in GPT-2's alphabet; é is two bytes, both single-byte symbols.
  auto tok = parse_bpe_json(tokenizer_json(R"(,"Ġa":256)", R"(["Ġ a"])", kByteLevel), "t.json");
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  EXPECT_EQ(encode(**tok, "a a"), (std::vector<uint32_t>{'a', 256}));
  EXPECT_EQ(encode(**tok, "\xC3\xA9"), (std::vector<uint32_t>{0xC3, 0xA9}));
  std::vector<uint32_t> ids = encode(**tok, "a a\xC3\xA9");
  EXPECT_EQ((*tok)->decode(ids).value(), "a a\xC3\xA9");
}

TEST(Bpe, AddedTokensSplitFirstLongestWins) {
  std::string added = R"([{"id":256,"content":"<x>","special":true},{"id":257,"content":"<x>>","special":true},
                          {"id":258,"content":"[S]","lstrip":true,"rstrip":true}])";
  auto tok = parse_bpe_json(tokenizer_json("", "[]", kByteLevel, added), "t.json");
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  EXPECT_EQ(encode(**tok, "a<x>b<x>>c"), (std::vector<uint32_t>{'a', 256, 'b', 257, 'c'}));
  // lstrip/rstrip: the spaces around [S] belong to it.
  EXPECT_EQ(encode(**tok, "a  [S]  b"), (std::vector<uint32_t>{'a', 258, 'b'}));
  EXPECT_EQ((*tok)->decode(std::vector<uint32_t>{'a', 257}).value(), "a<x>>");
  EXPECT_EQ((*tok)->vocab_size(), 259u);
  EXPECT_FALSE((*tok)->decode(std::vector<uint32_t>{259}).ok());
}

TEST(Bpe, SplitRemovedDropsMatches) {
  std::string pre = R"({"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"String":"-"},"behavior":"Removed"},
                        {"type":"ByteLevel","use_regex":false}]})";
  auto tok = parse_bpe_json(tokenizer_json(R"(,"ab":256)", R"(["a b"])", pre), "t.json");
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  EXPECT_EQ(encode(**tok, "ab-ab--a"), (std::vector<uint32_t>{256, 256, 'a'}));
}

TEST(Bpe, ErrorsNameFileAndKey) {
  auto missing_merge = parse_bpe_json(tokenizer_json("", R"(["a q7"])", kByteLevel), "t.json");
  ASSERT_FALSE(missing_merge.ok());
  EXPECT_NE(missing_merge.error().message.find("t.json: key 'model.merges[0]'"), std::string::npos)
      << missing_merge.error().message;
  EXPECT_EQ(missing_merge.error().kind, ErrorKind::invalid_argument);
  auto bad_type = parse_bpe_json(R"({"model":{"type":"Unigram"}})", "u.json");
  ASSERT_FALSE(bad_type.ok());
  EXPECT_NE(bad_type.error().message.find("'model.type'"), std::string::npos) << bad_type.error().message;
}

// A SentencePiece-style vocabulary: <unk>=0, ▁=1, a=2, b=3, ▁a=4, ▁▁=5, <0xC3>=6, <0xA9>=7.
std::string char_json(const std::string& pre, const std::string& decoder, const std::string& model_extra) {
  return R"({"model":{"type":"BPE","unk_token":"<unk>",)" + model_extra +
         R"("vocab":{"<unk>":0,"▁":1,"a":2,"b":3,"▁a":4,"▁▁":5,"<0xC3>":6,"<0xA9>":7},"merges":["▁ ▁","▁ a"]},)"
         R"("pre_tokenizer":)" + pre + R"(,"decoder":)" + decoder + "}";
}

TEST(SentencePieceStyle, MetaspaceSplitsBeforeEachReplacement) {
  // "  a" is "▁▁a" (it starts with ▁: nothing prepended). split: true cuts it into "▁" and "▁a";
  // split: false keeps one word, where ▁▁ (rank 0) merges before ▁a (rank 1).
  std::string split = R"({"type":"Metaspace","replacement":"▁","prepend_scheme":"always","split":true})";
  std::string whole = R"({"type":"Metaspace","replacement":"▁","prepend_scheme":"always","split":false})";
  auto cut = parse_bpe_json(char_json(split, "null", ""), "t.json");
  auto joined = parse_bpe_json(char_json(whole, "null", ""), "t.json");
  ASSERT_TRUE(cut.ok()) << cut.error().message;
  ASSERT_TRUE(joined.ok()) << joined.error().message;
  EXPECT_EQ(encode(**cut, "  a"), (std::vector<uint32_t>{1, 4}));
  EXPECT_EQ(encode(**joined, "  a"), (std::vector<uint32_t>{5, 2}));
  EXPECT_EQ(encode(**joined, "a"), (std::vector<uint32_t>{4}));  // always: ▁ prepended
}

TEST(SentencePieceStyle, UnknownCharacters) {
  std::string pre = R"({"type":"Metaspace","prepend_scheme":"never","split":false})";
  // fuse_unk: a run of unknown characters is one <unk>; without it, one per character.
  auto fused = parse_bpe_json(char_json(pre, "null", R"("fuse_unk":true,)"), "t.json");
  auto single = parse_bpe_json(char_json(pre, "null", ""), "t.json");
  ASSERT_TRUE(fused.ok() && single.ok());
  EXPECT_EQ(encode(**fused, "axyb"), (std::vector<uint32_t>{2, 0, 3}));
  EXPECT_EQ(encode(**single, "axyb"), (std::vector<uint32_t>{2, 0, 0, 3}));
  // byte_fallback: é is <0xC3> <0xA9>; x has no byte tokens here (<0x78> is missing) → <unk>.
  auto bytes = parse_bpe_json(char_json(pre, R"({"type":"ByteFallback"})", R"("byte_fallback":true,)"), "t.json");
  ASSERT_TRUE(bytes.ok()) << bytes.error().message;
  std::vector<uint32_t> ids = encode(**bytes, "a\xC3\xA9x");
  EXPECT_EQ(ids, (std::vector<uint32_t>{2, 6, 7, 0}));
  EXPECT_EQ((*bytes)->decode(ids).value(), "a\xC3\xA9<unk>");
  // No unk_token, no byte_fallback: the text cannot be encoded, and the error says which character.
  std::string no_unk = char_json(pre, "null", "");
  no_unk.replace(no_unk.find(R"("unk_token":"<unk>",)"), 20, "");
  auto strict = parse_bpe_json(no_unk, "t.json");
  ASSERT_TRUE(strict.ok()) << strict.error().message;
  auto refused = (*strict)->encode("ax");
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("U+0078"), std::string::npos) << refused.error().message;
}

TEST(SentencePieceStyle, MetaspaceDecoderDropsTheFirstTokensReplacement) {
  std::string pre = R"({"type":"Metaspace","prepend_scheme":"first","split":false})";
  auto tok = parse_bpe_json(char_json(pre, R"({"type":"Metaspace","prepend_scheme":"first"})", ""), "t.json");
  ASSERT_TRUE(tok.ok()) << tok.error().message;
  EXPECT_EQ(encode(**tok, "a a"), (std::vector<uint32_t>{4, 4}));  // prepended ▁ (first), space → ▁
  EXPECT_EQ((*tok)->decode(std::vector<uint32_t>{4, 4}).value(), "a a");
  EXPECT_EQ((*tok)->decode(std::vector<uint32_t>{2, 4, 1}).value(), "a a ");
  auto never = parse_bpe_json(char_json(pre, R"({"type":"Metaspace","prepend_scheme":"never"})", ""), "t.json");
  ASSERT_TRUE(never.ok());
  EXPECT_EQ((*never)->decode(std::vector<uint32_t>{4, 4}).value(), " a a");
}

TEST(Normalizer, UnicodeFormsAcrossChunks) {
  // Longer than the 64 KiB pieces the forms run over, with and without ASCII to cut between.
  detail::Loader loader("t.json");
  auto nfc = detail::Normalizer::parse(loader, detail::json::parse(R"({"type":"NFC"})"), "normalizer");
  auto nfkd = detail::Normalizer::parse(loader, detail::json::parse(R"({"type":"NFKD"})"), "normalizer");
  ASSERT_TRUE(nfc.ok() && nfkd.ok());
  std::string decomposed, composed, no_ascii_in, no_ascii_out;
  for (int i = 0; i < 40000; ++i) {
    decomposed += "ab e\xCC\x81";  // e + U+0301
    composed += "ab \xC3\xA9";      // é
    no_ascii_in += "\xC3\xA5\xCC\x81";  // å + U+0301 → ǻ (U+01FB)
    no_ascii_out += "\xC7\xBB";
  }
  std::string out;
  ASSERT_TRUE(nfc->apply(decomposed, out).ok());
  EXPECT_TRUE(out == composed);
  ASSERT_TRUE(nfc->apply(no_ascii_in, out).ok());
  EXPECT_TRUE(out == no_ascii_out);
  ASSERT_TRUE(nfkd->apply("\xEF\xAC\x81", out).ok());  // the ﬁ ligature → "fi"
  EXPECT_EQ(out, "fi");
}

TEST(Normalizer, RefusesUnboundedGrowth) {
  // Each step makes a space 50 spaces: one step is fine, three chained (125,000×) are refused.
  detail::Loader loader("t.json");
  std::string step = R"({"type":"Replace","pattern":{"String":" "},"content":")" + std::string(50, ' ') + R"("})";
  auto one = detail::Normalizer::parse(loader, detail::json::parse(step), "normalizer");
  auto three = detail::Normalizer::parse(
      loader, detail::json::parse(R"({"type":"Sequence","normalizers":[)" + step + "," + step + "," + step + "]}"), "normalizer");
  ASSERT_TRUE(one.ok() && three.ok());
  std::string text(1000, ' ');
  std::string out;
  ASSERT_TRUE(one->apply(text, out).ok());
  EXPECT_EQ(out.size(), 50000u);
  Status refused = three->apply(text, out);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("more than 64 times"), std::string::npos) << refused.error().message;
}

// Hugging Face's Rust semantics where the JavaScript reference departs from them (it lowercases
// a word-final Σ to ς, drops every mark, trims U+FEFF and not U+0085).
TEST(Normalizer, FollowsRustWhereJavaScriptDiffers) {
  detail::Loader loader("t.json");
  auto run = [&](const char* spec, std::string_view text) {
    auto normalizer = detail::Normalizer::parse(loader, detail::json::parse(spec), "normalizer");
    EXPECT_TRUE(normalizer.ok()) << spec;
    std::string out;
    if (normalizer.ok()) EXPECT_TRUE(normalizer->apply(text, out).ok());
    return out;
  };
  // Σ → σ everywhere (char::to_lowercase), İ → i + U+0307 (its full mapping), ẞ → ß.
  EXPECT_EQ(run(R"({"type":"Lowercase"})", "\xCE\xA3\xCE\x9F\xCE\xA3 \xC4\xB0 \xE1\xBA\x9E"),
            "\xCF\x83\xCE\xBF\xCF\x83 i\xCC\x87 \xC3\x9F");
  // U+0085 is White_Space, U+FEFF is not.
  EXPECT_EQ(run(R"({"type":"Strip","strip_left":true,"strip_right":true})", "\xC2\x85 a \xEF\xBB\xBF"), "a \xEF\xBB\xBF");
  EXPECT_EQ(run(R"({"type":"Strip","strip_left":false,"strip_right":true})", " a \xE3\x80\x80"), " a");
  // Only nonspacing marks go: U+0301 (Mn) does, the Devanagari vowel sign U+093E (Mc) stays.
  EXPECT_EQ(run(R"({"type":"StripAccents"})", "e\xCC\x81 \xE0\xA4\x95\xE0\xA4\xBE"), "e \xE0\xA4\x95\xE0\xA4\xBE");
  // CJK outside the BMP (U+20000) is spaced too.
  EXPECT_EQ(run(R"({"type":"BertNormalizer","lowercase":false})", "a\xF0\xA0\x80\x80" "b"), "a \xF0\xA0\x80\x80 b");
}

TEST(TokenizerConfig, OverridesAndRefuses) {
  std::string added = R"([{"id":256,"content":"<s>","special":true},{"id":257,"content":"</s>","special":true},
                          {"id":258,"content":"<|im_end|>","special":true}])";
  auto load = [&] { return std::move(parse_bpe_json(tokenizer_json("", "[]", kByteLevel, added), "t.json")).value(); };
  {  // the guess: <s> and </s> by name
    auto tok = load();
    EXPECT_EQ(tok->bos_id(), 256u);
    EXPECT_EQ(tok->eos_id(), 257u);
    EXPECT_TRUE(tok->add_bos());
  }
  auto configured = apply_tokenizer_config(load(), R"({"bos_token":null,"eos_token":{"content":"<|im_end|>"}})", "c.json");
  ASSERT_TRUE(configured.ok()) << configured.error().message;
  EXPECT_EQ((*configured)->bos_id(), std::nullopt);
  EXPECT_EQ((*configured)->eos_id(), 258u);
  EXPECT_FALSE((*configured)->add_bos());
  auto no_bos = apply_tokenizer_config(load(), R"({"add_bos_token":false})", "c.json");
  ASSERT_TRUE(no_bos.ok());
  EXPECT_EQ((*no_bos)->bos_id(), 256u);
  EXPECT_FALSE((*no_bos)->add_bos());
  auto unknown = apply_tokenizer_config(load(), R"({"eos_token":"<|eot|>"})", "c.json");
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.error().message.find("c.json: key 'eos_token'"), std::string::npos) << unknown.error().message;
}

TEST(Utf8, RefusesIllFormedWithOffset) {
  EXPECT_EQ(first_invalid_utf8("plain ascii"), std::nullopt);
  EXPECT_EQ(first_invalid_utf8("\xE6\x97\xA5\xF0\x9F\x98\x80"), std::nullopt);  // 日 😀
  EXPECT_EQ(first_invalid_utf8("ab\xC0\xAF"), 2u);          // overlong '/'
  EXPECT_EQ(first_invalid_utf8("a\xED\xA0\x80"), 1u);       // a surrogate
  EXPECT_EQ(first_invalid_utf8("abc\xE6\x97"), 3u);         // cut short
  EXPECT_EQ(first_invalid_utf8("\xF4\x90\x80\x80"), 0u);    // above U+10FFFF
  EXPECT_EQ(first_invalid_utf8("x\x80"), 1u);               // a lone continuation byte
  auto tok = parse_bpe_json(tokenizer_json("", "[]", kByteLevel), "t.json");
  ASSERT_TRUE(tok.ok());
  auto refused = (*tok)->encode("ok \xC3\x28");
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("byte 3"), std::string::npos) << refused.error().message;
}

}  // namespace
}  // namespace strata::tokenizer
