// The BPE tokenizer on hand-built tokenizer.json texts whose ids are worked out by hand: merge
// order (lowest rank first, leftmost among equals, not "first merge that applies"), ignore_merges,
// added tokens before the split (longest wins, lstrip/rstrip), Split Removed, both merge forms,
// decode of every id, and the UTF-8 check (overlongs, surrogates, truncation) with its offset.
#include <gtest/gtest.h>

#include <string>

#include "engine/tokenizer/tokenizer.h"

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
