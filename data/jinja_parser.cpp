// strata/data/jinja_parser.cpp — tokens to the syntax tree, following jinja2's grammar and
// operator precedence (parser.py: condexpr < or < and < not < compare/in < + - < ~ < * / // % <
// ** < unary; filters, tests and calls bind to the unary operand). Tags the evaluator does not
// implement are refused here, by name and line, before anything renders. An unknown filter or
// test is refused when it runs, as jinja2 3 does for one in a branch not taken: a template that
// never reaches it renders.
#include <charconv>
#include <cstdlib>
#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "data/jinja_internal.h"

namespace strata::data::jinja {

namespace {

class Parser {
 public:
  Parser(const std::vector<Token>& tokens, Program& program) : tokens_(tokens), program_(program) {}

  void run() {
    std::string end_tag;
    program_.body = parse_body({}, &end_tag);
  }

 private:
  const Token& peek(size_t ahead = 0) const {
    size_t i = std::min(pos_ + ahead, tokens_.size() - 1);
    return tokens_[i];
  }
  const Token& next() {
    const Token& t = tokens_[pos_];
    if (pos_ + 1 < tokens_.size()) ++pos_;
    return t;
  }
  bool is_op(const char* op, size_t ahead = 0) const {
    return peek(ahead).type == TokenType::op && peek(ahead).text == op;
  }
  bool is_name(const char* name, size_t ahead = 0) const {
    return peek(ahead).type == TokenType::name && peek(ahead).text == name;
  }
  [[noreturn]] void fail(const std::string& message, int line = -1) const {
    throw Failure{message, line < 0 ? peek().line : line};
  }
  void expect_op(const char* op) {
    if (!is_op(op)) fail(std::string("expected '") + op + "', found " + describe(peek()));
    next();
  }
  void expect_block_end(const std::string& tag) {
    if (peek().type != TokenType::block_end) {
      fail("unexpected " + describe(peek()) + " in {% " + tag + " %} (expected the end of the tag)");
    }
    next();
  }
  std::string expect_name(const std::string& what) {
    if (peek().type != TokenType::name) fail("expected " + what + ", found " + describe(peek()));
    return next().text;
  }
  static std::string describe(const Token& t) {
    switch (t.type) {
      case TokenType::name: return "'" + t.text + "'";
      case TokenType::string: return "a string";
      case TokenType::integer:
      case TokenType::floating: return "the number " + t.text;
      case TokenType::op: return "'" + t.text + "'";
      case TokenType::block_end: return "the end of the tag";
      case TokenType::variable_end: return "'}}'";
      case TokenType::eof: return "the end of the template";
      default: return "text";
    }
  }

  // Statements until one of `end_tags` opens a block ({% else %}, {% endfor %}...). The tag name
  // that ended the body is stored in *ended_by; the parser then sits just after that name.
  std::vector<NodePtr> parse_body(const std::set<std::string>& end_tags, std::string* ended_by) {
    std::vector<NodePtr> body;
    while (true) {
      const Token& t = peek();
      if (t.type == TokenType::eof) {
        if (!end_tags.empty()) {
          std::string closing;
          for (const auto& tag : end_tags) {
            if (tag.rfind("end", 0) == 0) closing = tag;
          }
          fail("the template ended before {% " + closing + " %}");
        }
        return body;
      }
      if (t.type == TokenType::text) {
        auto node = std::make_unique<Node>();
        node->kind = Node::Kind::text;
        node->line = t.line;
        node->text = t.text;
        body.push_back(std::move(node));
        next();
      } else if (t.type == TokenType::variable_begin) {
        next();
        auto node = std::make_unique<Node>();
        node->kind = Node::Kind::output;
        node->line = t.line;
        node->exprs.push_back(parse_tuple(true));
        if (peek().type != TokenType::variable_end) fail("unexpected " + describe(peek()) + " in {{ ... }}");
        next();
        body.push_back(std::move(node));
      } else if (t.type == TokenType::block_begin) {
        next();
        const Token& tag = peek();
        if (tag.type != TokenType::name) fail("expected a tag name after {%, found " + describe(tag));
        if (end_tags.count(tag.text) != 0) {
          *ended_by = tag.text;
          next();
          return body;
        }
        body.push_back(parse_statement());
      } else {
        fail("unexpected " + describe(t));
      }
    }
  }

  NodePtr parse_statement() {
    DepthGuard guard(*this);
    const Token tag = next();
    auto node = std::make_unique<Node>();
    node->line = tag.line;
    const std::string& name = tag.text;
    if (name == "if") {
      node->kind = Node::Kind::if_chain;
      node->exprs.push_back(parse_tuple(true));
      expect_block_end("if");
      while (true) {
        std::string ended;
        node->bodies.push_back(parse_body({"elif", "else", "endif"}, &ended));
        if (ended == "elif") {
          node->exprs.push_back(parse_tuple(true));
          expect_block_end("elif");
        } else if (ended == "else") {
          expect_block_end("else");
          std::string end;
          node->bodies.push_back(parse_body({"endif"}, &end));
          node->has_else = true;
          expect_block_end("endif");
          break;
        } else {
          expect_block_end("endif");
          break;
        }
      }
    } else if (name == "for") {
      node->kind = Node::Kind::for_loop;
      node->targets = parse_targets("for");
      if (!is_name("in")) fail("expected 'in' in {% for %}, found " + describe(peek()));
      next();
      node->exprs.push_back(parse_tuple(false));
      if (is_name("if")) {
        next();
        node->exprs.push_back(parse_tuple(true));
        node->has_filter = true;
      }
      if (is_name("recursive")) fail("recursive for loops ({% for ... recursive %}) are not supported");
      expect_block_end("for");
      std::string ended;
      ++loop_depth_;
      node->bodies.push_back(parse_body({"else", "endfor"}, &ended));
      --loop_depth_;
      if (ended == "else") {
        expect_block_end("else");
        node->bodies.push_back(parse_body({"endfor"}, &ended));
        node->has_else = true;
      }
      expect_block_end("endfor");
    } else if (name == "set") {
      if (peek().type == TokenType::name && is_op(".", 1)) {
        node->targets.push_back(next().text);
        next();
        node->attribute = expect_name("an attribute name after '.' in {% set %}");
      } else {
        node->targets = parse_targets("set");
      }
      if (is_op("=")) {
        next();
        node->kind = Node::Kind::set;
        node->exprs.push_back(parse_tuple(true));
        expect_block_end("set");
      } else {
        if (node->targets.size() != 1 || !node->attribute.empty()) fail("a block {% set %} takes one plain name");
        if (is_op("|")) fail("filters on a block {% set %} are not supported");
        expect_block_end("set");
        node->kind = Node::Kind::set_block;
        std::string ended;
        node->bodies.push_back(parse_body({"endset"}, &ended));
        expect_block_end("endset");
      }
    } else if (name == "macro") {
      node->kind = Node::Kind::macro;
      node->targets.push_back(expect_name("a macro name"));
      expect_op("(");
      while (!is_op(")")) {
        node->params.push_back(expect_name("a parameter name"));
        if (is_op("=")) {
          next();
          node->defaults.push_back(parse_expression(true));
        } else {
          node->defaults.push_back(nullptr);
        }
        if (!is_op(")")) expect_op(",");
      }
      next();
      expect_block_end("macro");
      std::string ended;
      int outer_loop_depth = loop_depth_;
      loop_depth_ = 0;  // a macro body is not inside the loop that defines it
      node->bodies.push_back(parse_body({"endmacro"}, &ended));
      loop_depth_ = outer_loop_depth;
      expect_block_end("endmacro");
    } else if (name == "break" || name == "continue") {
      if (loop_depth_ == 0) fail("{% " + name + " %} outside a for loop");
      node->kind = name == "break" ? Node::Kind::loop_break : Node::Kind::loop_continue;
      expect_block_end(name);
    } else if (name == "generation") {
      if (in_generation_) fail("{% generation %} inside another {% generation %} block");
      node->kind = Node::Kind::generation;
      program_.has_generation = true;
      expect_block_end("generation");
      std::string ended;
      in_generation_ = true;
      node->bodies.push_back(parse_body({"endgeneration"}, &ended));
      in_generation_ = false;
      expect_block_end("endgeneration");
    } else if (name == "filter") {
      // {% filter upper %}...{% endfilter %}: the body's output through a filter chain.
      node->kind = Node::Kind::filter_block;
      auto input = make(Expr::Kind::name, tag.line);
      input->name = kFilterInput;
      node->exprs.push_back(parse_filter_chain(std::move(input)));
      expect_block_end("filter");
      std::string ended;
      node->bodies.push_back(parse_body({"endfilter"}, &ended));
      expect_block_end("endfilter");
    } else {
      fail("unsupported tag {% " + name + " %}");
    }
    return node;
  }

  // `x` or `a, b` or `(a, b)`: the names a for loop or a set binds.
  std::vector<std::string> parse_targets(const std::string& tag) {
    std::vector<std::string> names;
    bool paren = is_op("(");
    if (paren) next();
    names.push_back(expect_name("a variable name in {% " + tag + " %}"));
    while (is_op(",")) {
      next();
      if (peek().type != TokenType::name) break;
      names.push_back(next().text);
    }
    if (paren) expect_op(")");
    return names;
  }

  // An expression, or a tuple when commas follow (`{{ a, b }}`, `for x in a, b`).
  ExprPtr parse_tuple(bool with_condexpr) {
    int line = peek().line;
    ExprPtr first = parse_expression(with_condexpr);
    if (!is_op(",")) return first;
    auto tuple = make(Expr::Kind::tuple, line);
    tuple->args.push_back(std::move(first));
    while (is_op(",")) {
      next();
      if (peek().type == TokenType::variable_end || peek().type == TokenType::block_end || is_name("if")) break;
      tuple->args.push_back(parse_expression(with_condexpr));
    }
    return tuple;
  }

  static ExprPtr make(Expr::Kind kind, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    return e;
  }

  ExprPtr parse_expression(bool with_condexpr) { return with_condexpr ? parse_condexpr() : parse_or(); }

  ExprPtr parse_condexpr() {
    ExprPtr expr = parse_or();
    while (is_name("if")) {
      int line = next().line;
      auto cond = make(Expr::Kind::conditional, line);
      ExprPtr test = parse_or();
      ExprPtr otherwise;
      if (is_name("else")) {
        next();
        otherwise = parse_condexpr();
        cond->has_else = true;
      }
      cond->args.push_back(std::move(test));
      cond->args.push_back(std::move(expr));
      if (otherwise) cond->args.push_back(std::move(otherwise));
      expr = std::move(cond);
    }
    return expr;
  }

  ExprPtr parse_or() {
    ExprPtr left = parse_and();
    while (is_name("or")) {
      auto node = make(Expr::Kind::logical_or, next().line);
      node->args.push_back(std::move(left));
      node->args.push_back(parse_and());
      left = std::move(node);
    }
    return left;
  }

  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    while (is_name("and")) {
      auto node = make(Expr::Kind::logical_and, next().line);
      node->args.push_back(std::move(left));
      node->args.push_back(parse_not());
      left = std::move(node);
    }
    return left;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      auto node = make(Expr::Kind::unary_not, next().line);
      node->args.push_back(parse_not());
      return node;
    }
    return parse_compare();
  }

  // Comparisons chain as in Python: `a < b <= c` is `a < b and b <= c`.
  ExprPtr parse_compare() {
    int line = peek().line;
    ExprPtr first = parse_math1();
    ExprPtr chain;
    while (true) {
      std::string op;
      if (peek().type == TokenType::op &&
          (peek().text == "==" || peek().text == "!=" || peek().text == "<" || peek().text == ">" ||
           peek().text == "<=" || peek().text == ">=")) {
        op = next().text;
      } else if (is_name("in")) {
        next();
        op = "in";
      } else if (is_name("not") && is_name("in", 1)) {
        next();
        next();
        op = "not in";
      } else {
        break;
      }
      if (!chain) {
        chain = make(Expr::Kind::compare, line);
        chain->args.push_back(std::move(first));
      }
      chain->compare_ops.push_back(op);
      chain->args.push_back(parse_math1());
    }
    return chain ? std::move(chain) : std::move(first);
  }

  ExprPtr binary(ExprPtr left, const std::string& op, ExprPtr right, int line) {
    auto node = make(Expr::Kind::binary, line);
    node->name = op;
    node->args.push_back(std::move(left));
    node->args.push_back(std::move(right));
    return node;
  }

  ExprPtr parse_math1() {
    ExprPtr left = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token& op = next();
      left = binary(std::move(left), op.text, parse_concat(), op.line);
    }
    return left;
  }

  ExprPtr parse_concat() {
    ExprPtr left = parse_math2();
    while (is_op("~")) {
      const Token& op = next();
      left = binary(std::move(left), "~", parse_math2(), op.line);
    }
    return left;
  }

  ExprPtr parse_math2() {
    ExprPtr left = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& op = next();
      left = binary(std::move(left), op.text, parse_pow(), op.line);
    }
    return left;
  }

  ExprPtr parse_pow() {
    ExprPtr left = parse_unary(true);
    while (is_op("**")) {
      const Token& op = next();
      left = binary(std::move(left), "**", parse_unary(true), op.line);
    }
    return left;
  }

  ExprPtr parse_unary(bool with_filter) {
    // Every nested expression passes here: a bound keeps a hostile template from exhausting the
    // stack (jinja2 would stop at Python's recursion limit).
    DepthGuard guard(*this);
    ExprPtr node;
    if (is_op("-")) {
      node = make(Expr::Kind::negate, next().line);
      node->args.push_back(parse_unary(false));
    } else if (is_op("+")) {
      next();
      node = parse_unary(false);
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_expr(std::move(node));
    return node;
  }

  ExprPtr parse_primary() {
    const Token t = peek();
    switch (t.type) {
      case TokenType::name: {
        next();
        if (t.text == "true" || t.text == "True") return literal(Value::from_bool(true), t.line);
        if (t.text == "false" || t.text == "False") return literal(Value::from_bool(false), t.line);
        if (t.text == "none" || t.text == "None") return literal(Value::none(), t.line);
        auto node = make(Expr::Kind::name, t.line);
        node->name = t.text;
        return node;
      }
      case TokenType::string: {
        std::string text;
        while (peek().type == TokenType::string) text += next().text;  // adjacent literals join
        return literal(Value::from_string(std::move(text)), t.line);
      }
      case TokenType::integer: {
        next();
        // from_chars, not stoll: no exception to catch (the lexer gives digits only).
        int64_t value = 0;
        const char* end = t.text.data() + t.text.size();
        const auto [stop, error] = std::from_chars(t.text.data(), end, value);
        if (error != std::errc() || stop != end)
          fail("integer literal " + t.text + " does not fit in 64 bits (not supported)", t.line);
        return literal(Value::from_int(value), t.line);
      }
      case TokenType::floating:
        next();
        // strtod, not stod: a literal past double's range is inf, as Python's float() makes it,
        // where stod would throw out_of_range (the fuzzer's find).
        return literal(Value::from_float(std::strtod(t.text.c_str(), nullptr)), t.line);
      case TokenType::op:
        if (t.text == "(") {
          next();
          if (is_op(")")) {
            next();
            return make(Expr::Kind::tuple, t.line);
          }
          ExprPtr inner = parse_expression(true);
          if (is_op(",")) {
            auto tuple = make(Expr::Kind::tuple, t.line);
            tuple->args.push_back(std::move(inner));
            while (is_op(",")) {
              next();
              if (is_op(")")) break;
              tuple->args.push_back(parse_expression(true));
            }
            inner = std::move(tuple);
          }
          expect_op(")");
          return inner;
        }
        if (t.text == "[") {
          next();
          auto list = make(Expr::Kind::list, t.line);
          while (!is_op("]")) {
            list->args.push_back(parse_expression(true));
            if (!is_op("]")) expect_op(",");
          }
          next();
          return list;
        }
        if (t.text == "{") {
          next();
          auto dict = make(Expr::Kind::dict, t.line);
          while (!is_op("}")) {
            ExprPtr key = parse_expression(true);
            expect_op(":");
            dict->args.push_back(std::move(key));
            dict->args.push_back(parse_expression(true));
            if (!is_op("}")) expect_op(",");
          }
          next();
          return dict;
        }
        break;
      default: break;
    }
    fail("unexpected " + describe(t) + " in an expression");
  }

  static ExprPtr literal(Value value, int line) {
    auto node = make(Expr::Kind::literal, line);
    node->literal = std::move(value);
    return node;
  }

  ExprPtr parse_postfix(ExprPtr node) {
    while (true) {
      if (is_op(".")) {
        int line = next().line;
        auto attr = make(Expr::Kind::getattr, line);
        if (peek().type == TokenType::name) {
          attr->name = next().text;
        } else if (peek().type == TokenType::integer) {
          attr->kind = Expr::Kind::getitem;
          attr->args.push_back(std::move(node));
          const Token& index = next();
          int64_t value = 0;
          const char* end = index.text.data() + index.text.size();
          const auto [stop, error] = std::from_chars(index.text.data(), end, value);
          if (error != std::errc() || stop != end)  // stoll threw here: the fuzzer's find
            fail("index ." + index.text + " does not fit in 64 bits (not supported)", index.line);
          attr->args.push_back(literal(Value::from_int(value), line));
          node = std::move(attr);
          continue;
        } else {
          fail("expected an attribute name after '.', found " + describe(peek()));
        }
        attr->args.push_back(std::move(node));
        node = std::move(attr);
      } else if (is_op("[")) {
        node = parse_subscript(std::move(node));
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr target) {
    int line = next().line;  // '['
    // A slice has up to three parts; an empty part is a null expression.
    std::vector<ExprPtr> parts;
    bool is_slice = false;
    ExprPtr current;
    while (!is_op("]")) {
      if (is_op(":")) {
        next();
        parts.push_back(std::move(current));
        current = nullptr;
        is_slice = true;
        continue;
      }
      if (current) fail("expected ':' or ']' in a subscript, found " + describe(peek()));
      current = parse_expression(true);
    }
    next();
    if (!is_slice) {
      if (!current) fail("empty subscript []", line);
      auto item = make(Expr::Kind::getitem, line);
      item->args.push_back(std::move(target));
      item->args.push_back(std::move(current));
      return item;
    }
    parts.push_back(std::move(current));
    if (parts.size() > 3) fail("a slice takes at most three parts", line);
    auto slice = make(Expr::Kind::slice, line);
    slice->args.push_back(std::move(target));
    for (size_t i = 0; i < 3; ++i) slice->args.push_back(i < parts.size() ? std::move(parts[i]) : nullptr);
    return slice;
  }

  void parse_call_args(Expr& call) {
    expect_op("(");
    while (!is_op(")")) {
      if (is_op("*") || is_op("**")) fail("*args and **kwargs in calls are not supported");
      if (peek().type == TokenType::name && is_op("=", 1)) {
        std::string key = next().text;
        next();
        call.keywords.emplace_back(key, parse_expression(true));
      } else {
        if (!call.keywords.empty()) fail("a positional argument follows a keyword argument");
        call.args.push_back(parse_expression(true));
      }
      if (!is_op(")")) expect_op(",");
    }
    next();
  }

  ExprPtr parse_call(ExprPtr callee) {
    auto call = make(Expr::Kind::call, peek().line);
    call->args.push_back(std::move(callee));
    parse_call_args(*call);
    return call;
  }

  // `name(args)|name2...` after {% filter: the first filter has no leading '|'.
  ExprPtr parse_filter_chain(ExprPtr input) {
    ExprPtr node = apply_one_filter(std::move(input), peek().line);
    return parse_filter_expr(std::move(node));
  }

  ExprPtr apply_one_filter(ExprPtr node, int line) {
    std::string name = expect_name("a filter name");
    while (is_op(".")) {
      next();
      name += "." + expect_name("a filter name");
    }
    auto filter = make(Expr::Kind::filter, line);
    filter->name = name;
    filter->args.push_back(std::move(node));
    if (is_op("(")) parse_call_args(*filter);
    return filter;
  }

  ExprPtr parse_filter_expr(ExprPtr node) {
    while (true) {
      if (is_op("|")) {
        int line = next().line;
        node = apply_one_filter(std::move(node), line);
        continue;
      }
      if (is_name("is")) {
        int line = next().line;
        auto test = make(Expr::Kind::test, line);
        if (is_name("not")) {
          next();
          test->negated = true;
        }
        if (peek().type == TokenType::name) {
          test->name = next().text;
        } else if (peek().type == TokenType::op) {
          test->name = next().text;  // `is ==` style names
        } else {
          fail("expected a test name after 'is', found " + describe(peek()));
        }
        test->args.push_back(std::move(node));
        const Token& t = peek();
        if (is_op("(")) {
          parse_call_args(*test);
        } else if ((t.type == TokenType::name || t.type == TokenType::string || t.type == TokenType::integer ||
                    t.type == TokenType::floating || is_op("[") || is_op("{")) &&
                   !(t.type == TokenType::name && (t.text == "else" || t.text == "or" || t.text == "and"))) {
          ExprPtr arg = parse_primary();
          test->args.push_back(parse_postfix(std::move(arg)));
        }
        node = std::move(test);
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  struct DepthGuard {
    explicit DepthGuard(Parser& parser) : parser_(parser) {
      if (++parser_.depth_ > kMaxDepth) parser_.fail("the template nests deeper than 256 levels");
    }
    ~DepthGuard() { --parser_.depth_; }
    Parser& parser_;
  };
  static constexpr int kMaxDepth = 256;

  const std::vector<Token>& tokens_;
  Program& program_;
  int depth_ = 0;
  bool in_generation_ = false;  // generation spans must not nest: each is one trained range
  size_t pos_ = 0;
  int loop_depth_ = 0;  // for loops around the statement being parsed: break/continue need one
};

}  // namespace

void parse_program(const std::vector<Token>& tokens, Program& program) { Parser(tokens, program).run(); }

}  // namespace strata::data::jinja
