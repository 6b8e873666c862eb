// A test tool: encodes each string of a JSON array with strata's tokenizer and prints
// {"ids": [[...]], "decoded": [...], "vocab_size", "bos", "eos", "add_bos"} so test_tokenizer.py can
// compare it with the independent implementations. A load or encode error is one line, exit 2.
#include <cstdio>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "apps/cli/commands.h"
#include "text/tokenizer.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: tokenizer_probe TOKENIZER TEXTS_JSON\n");
    return 2;
  }
  auto loaded = strata::tokenizer::load_tokenizer(argv[1]);
  if (!loaded.ok()) return strata::cli::report_error(loaded.error());
  const strata::tokenizer::Tokenizer& tok = **loaded;
  std::ifstream input(argv[2]);
  std::stringstream buffer;
  buffer << input.rdbuf();
  nlohmann::json texts = nlohmann::json::parse(buffer.str());
  nlohmann::json out = {{"vocab_size", tok.vocab_size()}, {"kind", tok.kind()}};
  out["bos"] = tok.bos_id() ? nlohmann::json(*tok.bos_id()) : nlohmann::json();
  out["eos"] = tok.eos_id() ? nlohmann::json(*tok.eos_id()) : nlohmann::json();
  out["add_bos"] = tok.add_bos();
  out["ids"] = nlohmann::json::array();
  out["decoded"] = nlohmann::json::array();
  for (const auto& text : texts) {
    auto ids = tok.encode(text.get<std::string>());
    if (!ids.ok()) return strata::cli::report_error(ids.error());
    auto decoded = tok.decode(*ids);
    if (!decoded.ok()) return strata::cli::report_error(decoded.error());
    out["ids"].push_back(*ids);
    // Decoded bytes may end inside a character only for a slice of ids; here they are whole texts.
    out["decoded"].push_back(*decoded);
  }
  fmt::print("{}\n", out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  return 0;
}
