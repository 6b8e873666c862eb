// strata/data/jinja_internal.h — tokens and the syntax tree shared by the lexer, the parser and
// the evaluator (data/jinja.h says how the three stages fit).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "data/jinja.h"

namespace strata::data::jinja {

enum class TokenType { text, variable_begin, variable_end, block_begin, block_end, name, string, integer, floating, op, eof };

struct Token {
  TokenType type;
  std::string text;
  int line;
};

std::vector<Token> tokenize(const std::string& source);

// One code point as UTF-8, appended (string-literal escapes, string methods on code points).
void append_utf8(std::string& out, uint32_t cp);

// ---- expressions ----------------------------------------------------------------------------
struct Expr {
  enum class Kind {
    literal, name, list, tuple, dict, getattr, getitem, slice, call, filter, test, unary_not, negate,
    binary, compare, logical_and, logical_or, conditional,
  };
  Kind kind;
  int line = 0;
  Value literal;                            // literal
  std::string name;                         // name, attribute, filter or test name, operator
  std::vector<std::string> compare_ops;     // compare: a chain `a < b <= c` holds one per operand after the first
  std::vector<std::unique_ptr<Expr>> args;  // operands / items / positional call arguments
  std::vector<std::pair<std::string, std::unique_ptr<Expr>>> keywords;  // dict items, keyword args
  bool negated = false;                     // `is not`
  bool has_else = false;                    // conditional: `x if c` without else is undefined
};
using ExprPtr = std::unique_ptr<Expr>;

// ---- statements -----------------------------------------------------------------------------
struct Node {
  enum class Kind { text, output, if_chain, for_loop, set, set_block, macro, loop_break, loop_continue, generation, filter_block };
  Kind kind;
  int line = 0;
  std::string text;                               // text
  std::vector<ExprPtr> exprs;                     // output: [expr]; if: conditions; for: [iter, filter?]; set: [value];
                                                  // filter block: the filter chain over the name kFilterInput
  std::vector<std::vector<std::unique_ptr<Node>>> bodies;  // if: one per condition (+ else); for: body, else
  std::vector<std::string> targets;               // for / set: names (several: tuple unpacking)
  std::string attribute;                          // set ns.attribute = ...
  bool has_else = false;                          // if / for
  bool has_filter = false;                        // for ... if filter
  std::vector<std::string> params;                // macro
  std::vector<ExprPtr> defaults;                  // macro: one per param (null when none)
};
using NodePtr = std::unique_ptr<Node>;

// The largest string or list one render may build, print or repr (16 MiB): a chat template
// renders one conversation (a few KiB to a few MiB); a hostile one could double a value in a
// loop or nest repeated lists until a repr is gigabytes (fuzz/regressions/chat_template).
inline constexpr size_t kMaxValueBytes = size_t{16} << 20;
// What one list item counts toward those bounds.
inline constexpr size_t kListItemBytes = 64;

// The name a {% filter %} block's captured body is bound to while its filter chain runs.
inline constexpr const char* kFilterInput = "\x01filter_input";

void parse_program(const std::vector<Token>& tokens, Program& program);

}  // namespace strata::data::jinja
