// strata/data/jinja.h — the Jinja2 subset behind ChatTemplate (internal to data/; the contract
// for users is data/chat_template.h). Three stages: jinja_lexer.cpp turns source into tokens with
// transformers' whitespace rules applied, jinja_parser.cpp builds the tree and refuses unknown
// tags by name, jinja_eval.cpp runs it over Python-like values (jinja_values.cpp: str(), repr(),
// truthiness, json.dumps, dict keys).
//
// Errors inside the three stages travel as a thrown `jinja::Failure` (the evaluator is deeply
// recursive and every operation can fail); chat_template.cpp catches it at the module boundary
// and returns it as an Error, so nothing throws out of data/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace strata::data::jinja {

struct Failure {
  std::string message;
  int line = 0;  // 1-based template line; 0 when unknown
};

// ---- values ---------------------------------------------------------------------------------
struct Value;
struct Dict;
struct CallArgs;
class Interpreter;
using List = std::vector<Value>;
using Builtin = std::function<Value(Interpreter&, CallArgs&, int line)>;

struct Value {
  enum class Kind : uint8_t { undefined, none, boolean, integer, floating, string, list, dict, callable };
  Kind kind = Kind::undefined;
  bool boolean = false;
  bool tuple = false;       // a list that Python would hold as a tuple (prints with parentheses)
  bool is_namespace = false;  // a dict made by namespace(): the one object `set x.attr` may change
  bool markup = false;  // a string marked safe (|safe, |escape): `+` with a plain string HTML-escapes the plain one, as markupsafe.Markup does
  int64_t integer = 0;
  double floating = 0;
  std::string text;  // the string; for undefined, the name that was missing (for errors)
  std::shared_ptr<List> list;
  std::shared_ptr<Dict> dict;
  std::shared_ptr<Builtin> callable;
  std::string callable_name;
  // A list Python would not hold as a list: "generator" (what map, select, reject, selectattr,
  // rejectattr, unique and the items filter return: always truthy, iterable once, no len(), not
  // printable, not JSON), "dict_items" / "dict_keys" / "dict_values" (dict views: print as
  // dict_items([...]), not JSON), "range". Empty for a plain list or tuple.
  std::string view;
  std::shared_ptr<size_t> consumed;  // generator: how many items have been taken (Python iterates it once)

  static Value undefined(std::string name = {});
  static Value none();
  static Value from_bool(bool value);
  static Value from_int(int64_t value);
  static Value from_float(double value);
  static Value from_string(std::string value);
  static Value from_list(List items, bool tuple = false);
  static Value from_dict(std::shared_ptr<Dict> dict);
  static Value from_callable(std::string name, Builtin fn);

  bool is_undefined() const { return kind == Kind::undefined; }
  bool is_number() const { return kind == Kind::integer || kind == Kind::floating || kind == Kind::boolean; }
};

// Dict keys are stored as strings: a string key as itself, any other hashable key (int, float,
// bool, None) encoded behind a \x01 marker (dict_key / key_value convert), so `{0: 'a'}` and
// lookups by integer work as in Python.
struct Dict {
  std::vector<std::pair<std::string, Value>> items;  // insertion order, as Python dicts keep
  const Value* find(const std::string& key) const;
  void set(const std::string& key, Value value);
};

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keywords;
};

// Python's str() and repr(), and json.dumps(ensure_ascii=False, indent) of a value.
std::string to_str(const Value& value);
std::string to_repr(const Value& value);
std::string to_json(const Value& value, int indent_width, bool indented, int line);
bool truthy(const Value& value);
std::string dict_key(const Value& key, int line);  // throws for an unhashable key (a list, a dict)
// Every stored form an equal key may have (1, 1.0 and True are one key in Python).
std::vector<std::string> dict_key_candidates(const Value& key, int line);
Value key_value(const std::string& stored);
Value make_generator(List items);
Value from_json(const nlohmann::ordered_json& json);

// ---- the compiled program ------------------------------------------------------------------
struct Node;
struct Program {
  std::string origin;
  std::vector<std::unique_ptr<Node>> body;
  bool has_generation = false;
  ~Program();
};

// Compiles `source`; throws Failure.
std::shared_ptr<Program> compile(const std::string& source, const std::string& origin);

struct RenderOutput {
  std::string text;
  std::vector<std::pair<size_t, size_t>> generation_spans;
};
// Renders with `globals` (an object); throws Failure.
RenderOutput render(const Program& program, const nlohmann::ordered_json& globals);

}  // namespace strata::data::jinja
