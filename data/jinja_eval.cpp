// strata/data/jinja_eval.cpp — runs the syntax tree over Python-like values, as jinja2 3.1 in
// transformers' ImmutableSandboxedEnvironment does: Python operator semantics (a TypeError where
// Python raises one), jinja2's default Undefined, frames per for loop and per macro call, and the
// filters, tests, methods and globals real chat templates use.
#include <charconv>
#include <algorithm>
#include <cmath>
#include <ctime>
#include <map>
#include <optional>
#include <set>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <utf8proc.h>

#include "data/jinja_internal.h"

namespace strata::data::jinja {

Program::~Program() = default;

namespace {

// ---- UTF-8 code points (Python strings count characters, not bytes) -------------------------
std::vector<uint32_t> decode(const std::string& s) {
  std::vector<uint32_t> out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    auto b = static_cast<unsigned char>(s[i]);
    uint32_t cp;
    size_t len;
    if (b < 0x80) {
      cp = b;
      len = 1;
    } else if ((b >> 5) == 6) {
      cp = b & 0x1F;
      len = 2;
    } else if ((b >> 4) == 14) {
      cp = b & 0x0F;
      len = 3;
    } else if ((b >> 3) == 30) {
      cp = b & 0x07;
      len = 4;
    } else {
      cp = b;  // invalid byte: kept as itself
      len = 1;
    }
    if (i + len > s.size()) len = 1;
    for (size_t k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
    out.push_back(cp);
    i += len;
  }
  return out;
}

std::string encode(const std::vector<uint32_t>& cps, size_t begin, size_t end) {
  std::string out;
  for (size_t i = begin; i < end; ++i) append_utf8(out, cps[i]);
  return out;
}

// str.isspace() for the characters Python counts as whitespace.
bool py_space(uint32_t cp) {
  return cp == ' ' || (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x1F) || cp == 0x85 || cp == 0xA0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

std::string type_name(const Value& v) {
  switch (v.kind) {
    case Value::Kind::undefined: return "Undefined";
    case Value::Kind::none: return "NoneType";
    case Value::Kind::boolean: return "bool";
    case Value::Kind::integer: return "int";
    case Value::Kind::floating: return "float";
    case Value::Kind::string: return "str";
    case Value::Kind::list: return !v.view.empty() ? v.view : v.tuple ? "tuple" : "list";
    case Value::Kind::dict: return v.is_namespace ? "Namespace" : "dict";
    case Value::Kind::callable: return "function";
  }
  return "object";
}

[[noreturn]] void undefined_error(const Value& v, int line) {
  throw Failure{v.text.empty() ? std::string("an undefined value was used") : "'" + v.text + "' is undefined", line};
}

bool is_intlike(const Value& v) { return v.kind == Value::Kind::integer || v.kind == Value::Kind::boolean; }
int64_t as_int(const Value& v) { return v.kind == Value::Kind::boolean ? (v.boolean ? 1 : 0) : v.integer; }
double as_float(const Value& v) { return v.kind == Value::Kind::floating ? v.floating : static_cast<double>(as_int(v)); }

bool equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (is_intlike(a) && is_intlike(b)) return as_int(a) == as_int(b);
    return as_float(a) == as_float(b);
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Value::Kind::undefined:
    case Value::Kind::none: return true;
    case Value::Kind::string: return a.text == b.text;
    case Value::Kind::list: {
      if (a.view != b.view) return false;
      if (a.view == "generator") return a.list == b.list;
      if (a.list->size() != b.list->size()) return false;
      for (size_t i = 0; i < a.list->size(); ++i) {
        if (!equal((*a.list)[i], (*b.list)[i])) return false;
      }
      return true;
    }
    case Value::Kind::dict: {
      if (a.dict == b.dict) return true;
      if (a.is_namespace || b.is_namespace) return false;
      if (a.dict->items.size() != b.dict->items.size()) return false;
      for (const auto& [key, value] : a.dict->items) {
        const Value* other = b.dict->find(key);
        if (other == nullptr || !equal(value, *other)) return false;
      }
      return true;
    }
    case Value::Kind::callable: return a.callable == b.callable;
    default: return false;
  }
}

// Python's <, as a three-way result; a TypeError for types Python will not order.
int compare_order(const Value& a, const Value& b, const std::string& op, int line) {
  if (a.is_number() && b.is_number()) {
    if (is_intlike(a) && is_intlike(b)) return as_int(a) < as_int(b) ? -1 : as_int(a) > as_int(b) ? 1 : 0;
    double x = as_float(a), y = as_float(b);
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.kind == Value::Kind::string && b.kind == Value::Kind::string) {
    int c = a.text.compare(b.text);  // UTF-8 byte order is code point order
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.kind == Value::Kind::list && b.kind == Value::Kind::list && a.view.empty() && b.view.empty()) {
    size_t n = std::min(a.list->size(), b.list->size());
    for (size_t i = 0; i < n; ++i) {
      if (!equal((*a.list)[i], (*b.list)[i])) return compare_order((*a.list)[i], (*b.list)[i], op, line);
    }
    return a.list->size() < b.list->size() ? -1 : a.list->size() > b.list->size() ? 1 : 0;
  }
  if (a.is_undefined()) undefined_error(a, line);
  if (b.is_undefined()) undefined_error(b, line);
  throw Failure{"'" + op + "' not supported between instances of '" + type_name(a) + "' and '" + type_name(b) + "'", line};
}

int64_t floor_div(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

// The items a for loop or a filter walks: list items, dict keys, string characters.
List iterate(const Value& v, int line) {
  switch (v.kind) {
    case Value::Kind::undefined: return {};
    case Value::Kind::list: {
      if (v.view != "generator") return *v.list;
      // A generator is iterated once: what an earlier loop or |first took is gone.
      size_t& taken = *v.consumed;
      List rest(v.list->begin() + static_cast<std::ptrdiff_t>(std::min(taken, v.list->size())), v.list->end());
      taken = v.list->size();
      return rest;
    }
    case Value::Kind::dict: {
      List keys;
      for (const auto& [key, value] : v.dict->items) keys.push_back(key_value(key));
      return keys;
    }
    case Value::Kind::string: {
      List chars;
      auto cps = decode(v.text);
      for (size_t i = 0; i < cps.size(); ++i) chars.push_back(Value::from_string(encode(cps, i, i + 1)));
      return chars;
    }
    default: throw Failure{"'" + type_name(v) + "' object is not iterable", line};
  }
}

int64_t length_of(const Value& v, int line) {
  switch (v.kind) {
    case Value::Kind::undefined: return 0;
    case Value::Kind::string: return static_cast<int64_t>(decode(v.text).size());
    case Value::Kind::list:
      if (v.view == "generator") throw Failure{"object of type 'generator' has no len() (add |list)", line};
      return static_cast<int64_t>(v.list->size());
    case Value::Kind::dict: return static_cast<int64_t>(v.dict->items.size());
    default: throw Failure{"object of type '" + type_name(v) + "' has no len()", line};
  }
}

const Value* keyword(const CallArgs& args, const std::string& name) {
  for (const auto& [key, value] : args.keywords) {
    if (key == name) return &value;
  }
  return nullptr;
}

// Argument `index` (positional) or `name` (keyword); null when neither was given.
const Value* argument(const CallArgs& args, size_t index, const std::string& name) {
  if (index < args.positional.size()) return &args.positional[index];
  return keyword(args, name);
}

std::string strip_chars(const std::string& text, const Value* chars, bool left, bool right) {
  auto cps = decode(text);
  std::vector<uint32_t> set;
  bool whitespace = chars == nullptr || chars->kind == Value::Kind::none || chars->is_undefined();
  if (!whitespace) set = decode(chars->text);
  auto strip = [&](uint32_t cp) {
    return whitespace ? py_space(cp) : std::find(set.begin(), set.end(), cp) != set.end();
  };
  size_t begin = 0, end = cps.size();
  if (left) {
    while (begin < end && strip(cps[begin])) ++begin;
  }
  if (right) {
    while (end > begin && strip(cps[end - 1])) --end;
  }
  return encode(cps, begin, end);
}

// Case mapping by code point (utf8proc's simple mappings, plus Python's one common full mapping,
// ß → SS, in upper()). Python's other multi-character mappings (ligatures, İ) are not made.
bool is_cased(uint32_t cp) {
  utf8proc_category_t category = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
  return category == UTF8PROC_CATEGORY_LU || category == UTF8PROC_CATEGORY_LL || category == UTF8PROC_CATEGORY_LT;
}
void append_upper(std::vector<uint32_t>& out, uint32_t cp) {
  if (cp == 0xDF) {
    out.push_back('S');
    out.push_back('S');
    return;
  }
  out.push_back(static_cast<uint32_t>(utf8proc_toupper(static_cast<utf8proc_int32_t>(cp))));
}
uint32_t lower_of(uint32_t cp) { return static_cast<uint32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(cp))); }
uint32_t title_of(uint32_t cp) { return static_cast<uint32_t>(utf8proc_totitle(static_cast<utf8proc_int32_t>(cp))); }

std::string py_upper(const std::string& s) {  // str.upper()
  std::vector<uint32_t> out;
  for (uint32_t cp : decode(s)) append_upper(out, cp);
  return encode(out, 0, out.size());
}
std::string py_lower(const std::string& s) {  // str.lower()
  std::vector<uint32_t> out;
  for (uint32_t cp : decode(s)) out.push_back(lower_of(cp));
  return encode(out, 0, out.size());
}
// str.title(): a cased character after an uncased one is title case, every other cased one lower.
std::string title_case(const std::string& s) {
  std::vector<uint32_t> out;
  bool previous_cased = false;
  for (uint32_t cp : decode(s)) {
    out.push_back(previous_cased ? lower_of(cp) : title_of(cp));
    previous_cased = is_cased(cp);
  }
  return encode(out, 0, out.size());
}
// str.capitalize(): the first character in title case, the rest lower case.
std::string capitalize(const std::string& s) {
  std::vector<uint32_t> cps = decode(s);
  for (size_t i = 0; i < cps.size(); ++i) cps[i] = i == 0 ? title_of(cps[i]) : lower_of(cps[i]);
  return encode(cps, 0, cps.size());
}
// jinja2's `title` filter (not str.title()): words start after '-', whitespace, '(', '{', '[' or
// '<'; each word's first character is upper case and the rest lower case.
std::string title_filter(const std::string& s) {
  std::vector<uint32_t> cps = decode(s);
  std::vector<uint32_t> out;
  bool word_start = true;
  for (uint32_t cp : cps) {
    bool separator = cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || py_space(cp);
    if (separator) {
      out.push_back(cp);
      word_start = true;
    } else if (word_start) {
      append_upper(out, cp);
      word_start = false;
    } else {
      out.push_back(lower_of(cp));
    }
  }
  return encode(out, 0, out.size());
}

std::vector<std::string> split_text(const std::string& text, const Value* sep, int64_t max_split) {
  std::vector<std::string> parts;
  if (sep == nullptr || sep->kind == Value::Kind::none) {
    auto cps = decode(text);
    size_t i = 0;
    while (true) {
      while (i < cps.size() && py_space(cps[i])) ++i;
      if (i >= cps.size()) break;
      if (max_split >= 0 && static_cast<int64_t>(parts.size()) == max_split) {
        size_t end = cps.size();
        while (end > i && py_space(cps[end - 1])) --end;
        parts.push_back(encode(cps, i, end));
        break;
      }
      size_t j = i;
      while (j < cps.size() && !py_space(cps[j])) ++j;
      parts.push_back(encode(cps, i, j));
      i = j;
    }
    return parts;
  }
  const std::string& s = sep->text;
  if (s.empty()) throw Failure{"split: empty separator", 0};
  size_t pos = 0;
  while (true) {
    size_t at = text.find(s, pos);
    if (at == std::string::npos || (max_split >= 0 && static_cast<int64_t>(parts.size()) == max_split)) {
      parts.push_back(text.substr(pos));
      break;
    }
    parts.push_back(text.substr(pos, at - pos));
    pos = at + s.size();
  }
  return parts;
}

std::string replace_text(const std::string& text, const std::string& from, const std::string& to, int64_t count) {
  if (from.empty()) {
    // Python inserts `to` between every character (and at both ends).
    auto cps = decode(text);
    std::string out;
    int64_t done = 0;
    for (size_t i = 0; i <= cps.size(); ++i) {
      if (count < 0 || done < count) {
        out += to;
        ++done;
      }
      if (i < cps.size()) out += encode(cps, i, i + 1);
    }
    return out;
  }
  std::string out;
  size_t pos = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    size_t at = text.find(from, pos);
    if (at == std::string::npos) break;
    out += text.substr(pos, at - pos) + to;
    pos = at + from.size();
    ++done;
  }
  return out + text.substr(pos);
}

// markupsafe.escape.
std::string html_escape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

const Value* dict_lookup(const Dict& dict, const Value& key, int line) {
  for (const std::string& stored : dict_key_candidates(key, line)) {
    if (const Value* v = dict.find(stored)) return v;
  }
  return nullptr;
}

// Sets `key`, keeping the form of an equal key already there ({1: a, 1.0: b} is {1: b}).
void dict_store(Dict& dict, const Value& key, Value value, int line) {
  for (const std::string& stored : dict_key_candidates(key, line)) {
    if (dict.find(stored) != nullptr) {
      dict.set(stored, std::move(value));
      return;
    }
  }
  dict.set(dict_key(key, line), std::move(value));
}

struct Frame {
  std::map<std::string, Value> vars;
  std::shared_ptr<Frame> parent;
};

enum class Flow { normal, loop_break, loop_continue };

}  // namespace

class Interpreter {
 public:
  Interpreter(const Program& program, const nlohmann::ordered_json& globals) : program_(program) {
    root_ = new_frame(nullptr);
    install_globals();
    if (globals.is_object()) {
      for (const auto& [key, value] : globals.items()) root_->vars[key] = from_json(value);
    }
    frame_ = root_;
  }

  // Values can reach their own frame (a macro closes over the frame it is stored in) or
  // themselves (`set ns.me = ns`): shared_ptr cycles. Every frame and namespace lives until the
  // render ends and is emptied here, so nothing outlives it.
  ~Interpreter() {
    for (const auto& frame : frames_) {
      frame->vars.clear();
      frame->parent.reset();
    }
    for (const auto& dict : namespaces_) dict->items.clear();
  }
  Interpreter(const Interpreter&) = delete;
  Interpreter& operator=(const Interpreter&) = delete;

  std::shared_ptr<Frame> new_frame(std::shared_ptr<Frame> parent) {
    auto frame = std::make_shared<Frame>();
    frame->parent = std::move(parent);
    frames_.push_back(frame);
    return frame;
  }

  RenderOutput run() {
    RenderOutput result;
    out_ = &result.text;
    spans_ = &result.generation_spans;
    Flow flow = exec_body(program_.body);
    (void)flow;
    return result;
  }

  // ---- statements ---------------------------------------------------------------------------
  Flow exec_body(const std::vector<NodePtr>& body) {
    for (const NodePtr& node : body) {
      Flow flow = exec(*node);
      if (flow != Flow::normal) return flow;
    }
    return Flow::normal;
  }

  Flow exec(const Node& node) {
    try {
      return exec_node(node);
    } catch (Failure& failure) {
      if (failure.line == 0) failure.line = node.line;  // raised below the expression level
      throw;
    }
  }

  Flow exec_node(const Node& node) {
    switch (node.kind) {
      case Node::Kind::text:
        *out_ += node.text;
        check_output_size(node.line);
        return Flow::normal;
      case Node::Kind::output:
        *out_ += to_str(eval(*node.exprs[0]));
        check_output_size(node.line);
        return Flow::normal;
      case Node::Kind::if_chain: {
        for (size_t i = 0; i < node.exprs.size(); ++i) {
          if (truthy(eval(*node.exprs[i]))) return exec_body(node.bodies[i]);
        }
        if (node.has_else) return exec_body(node.bodies.back());
        return Flow::normal;
      }
      case Node::Kind::for_loop: return exec_for(node);
      case Node::Kind::set: {
        Value value = eval(*node.exprs[0]);
        assign(node, std::move(value));
        return Flow::normal;
      }
      case Node::Kind::set_block: {
        std::string captured;
        std::string* saved = out_;
        out_ = &captured;
        ++capture_depth_;
        Flow flow = exec_body(node.bodies[0]);
        --capture_depth_;
        out_ = saved;
        frame_->vars[node.targets[0]] = Value::from_string(std::move(captured));
        return flow;
      }
      case Node::Kind::macro: {
        frame_->vars[node.targets[0]] = make_macro(node);
        return Flow::normal;
      }
      case Node::Kind::loop_break: return Flow::loop_break;
      case Node::Kind::loop_continue: return Flow::loop_continue;
      case Node::Kind::filter_block: {
        std::string captured;
        std::string* saved = out_;
        out_ = &captured;
        ++capture_depth_;
        Flow flow = exec_body(node.bodies[0]);
        --capture_depth_;
        out_ = saved;
        auto frame = std::make_shared<Frame>();  // holds only the captured text: nothing can keep it
        frame->parent = frame_;
        frame->vars[kFilterInput] = Value::from_string(std::move(captured));
        std::shared_ptr<Frame> outer = frame_;
        frame_ = frame;
        Value filtered = eval(*node.exprs[0]);
        frame_ = outer;
        *out_ += to_str(filtered);
        check_output_size(node.line);
        return flow;
      }
      case Node::Kind::generation: {
        size_t begin = out_->size();
        Flow flow = exec_body(node.bodies[0]);
        if (capture_depth_ == 0) spans_->emplace_back(begin, out_->size());
        return flow;
      }
    }
    return Flow::normal;
  }

  void check_output_size(int line) const {
    if (out_->size() > kMaxOutputBytes) throw Failure{"the template printed more than " + std::to_string(kMaxOutputBytes >> 20) + " MiB", line};
  }

  void assign(const Node& node, Value value) {
    if (!node.attribute.empty()) {
      Value target = lookup(node.targets[0]);
      if (target.kind != Value::Kind::dict || !target.is_namespace) {
        throw Failure{"can only set attributes of a namespace() object ('" + node.targets[0] + "' is " +
                          type_name(target) + ")",
                      node.line};
      }
      target.dict->set(dict_key(Value::from_string(node.attribute), node.line), std::move(value));
      return;
    }
    if (node.targets.size() == 1) {
      frame_->vars[node.targets[0]] = std::move(value);
      return;
    }
    List items = iterate(value, node.line);
    if (items.size() != node.targets.size()) {
      throw Failure{"cannot unpack " + std::to_string(items.size()) + " values into " +
                        std::to_string(node.targets.size()) + " names",
                    node.line};
    }
    for (size_t i = 0; i < items.size(); ++i) frame_->vars[node.targets[i]] = items[i];
  }

  Flow exec_for(const Node& node) {
    Value iterable = eval(*node.exprs[0]);
    List all = iterate(iterable, node.line);
    std::shared_ptr<Frame> saved = frame_;
    // Each iteration is a fresh scope over the enclosing one, as in jinja2: a {% set %} inside
    // the body is gone at the next iteration and after the loop (namespace() carries state).
    // An iteration's frame is dropped when the iteration ends unless something captured it (a
    // macro defined in the body): only those are kept for the cleanup in ~Interpreter.
    std::shared_ptr<Frame> iteration;
    auto leave_iteration = [&]() {
      frame_ = saved;
      if (iteration && iteration.use_count() > 1) frames_.push_back(iteration);
      iteration.reset();
    };
    auto enter_iteration = [&]() {
      // A bound on the work one render may do: real templates loop over a conversation, a
      // hostile one could loop for hours (jinja2 would).
      charge(kIterationWorkBytes, node.line);
      leave_iteration();
      iteration = std::make_shared<Frame>();
      iteration->parent = saved;
      frame_ = iteration;
    };
    // A Failure thrown from the body leaves through here too: a captured iteration frame must
    // still be recorded, or the capture's cycle outlives the render (found by the fuzzer).
    struct LeaveOnExit {
      decltype(leave_iteration)& leave;
      ~LeaveOnExit() { leave(); }
    } leave_on_exit{leave_iteration};
    auto bind = [&](const Value& item) {
      if (node.targets.size() == 1) {
        frame_->vars[node.targets[0]] = item;
        return;
      }
      List parts = iterate(item, node.line);
      if (parts.size() != node.targets.size()) {
        throw Failure{"cannot unpack " + std::to_string(parts.size()) + " values into " +
                          std::to_string(node.targets.size()) + " loop variables",
                      node.line};
      }
      for (size_t i = 0; i < parts.size(); ++i) frame_->vars[node.targets[i]] = parts[i];
    };
    // The loop filter (`for x in xs if c`) runs before the loop, so loop.length counts kept items.
    List items;
    if (node.has_filter) {
      for (const Value& item : all) {
        enter_iteration();
        bind(item);
        if (truthy(eval(*node.exprs[1]))) items.push_back(item);
      }
    } else {
      items = std::move(all);
    }
    const auto count = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < count; ++i) {
      // A bound on the work one render may do: real templates loop over a conversation, a
      // hostile one could loop for hours (jinja2 would).
      enter_iteration();
      bind(items[static_cast<size_t>(i)]);
      auto loop = std::make_shared<Dict>();
      loop->set("index", Value::from_int(i + 1));
      loop->set("index0", Value::from_int(i));
      loop->set("first", Value::from_bool(i == 0));
      loop->set("last", Value::from_bool(i == count - 1));
      loop->set("length", Value::from_int(count));
      loop->set("revindex", Value::from_int(count - i));
      loop->set("revindex0", Value::from_int(count - i - 1));
      loop->set("previtem", i > 0 ? items[static_cast<size_t>(i - 1)] : Value::undefined("loop.previtem"));
      loop->set("nextitem", i + 1 < count ? items[static_cast<size_t>(i + 1)] : Value::undefined("loop.nextitem"));
      loop->set("depth", Value::from_int(1));
      loop->set("depth0", Value::from_int(0));
      loop->set("cycle", Value::from_callable("loop.cycle", [i](Interpreter&, CallArgs& args, int line) {
        if (args.positional.empty()) throw Failure{"loop.cycle() needs at least one argument", line};
        return args.positional[static_cast<size_t>(i) % args.positional.size()];
      }));
      frame_->vars["loop"] = Value::from_dict(loop);
      Flow flow = exec_body(node.bodies[0]);
      if (flow == Flow::loop_break) break;
    }
    leave_iteration();
    if (count == 0 && node.has_else) return exec_body(node.bodies[1]);
    return Flow::normal;
  }

  Value make_macro(const Node& node) {
    std::shared_ptr<Frame> defined_in = frame_;
    const Node* macro = &node;
    return Value::from_callable(node.targets[0], [macro, defined_in](Interpreter& in, CallArgs& args, int line) {
      if (in.call_depth_ >= kMaxCallDepth) {
        throw Failure{"macro '" + macro->targets[0] + "': calls nest deeper than " + std::to_string(kMaxCallDepth) +
                          " (runaway recursion?)",
                      line};
      }
      CallDepth depth(in);
      if (args.positional.size() > macro->params.size()) {
        throw Failure{"macro '" + macro->targets[0] + "' takes not more than " + std::to_string(macro->params.size()) +
                          " argument(s)",
                      line};
      }
      auto frame = std::make_shared<Frame>();  // kept past the call only if captured (see ~Interpreter)
      frame->parent = defined_in;
      // Recorded on every way out, a thrown Failure included (else a captured frame's cycle leaks).
      struct KeepIfCaptured {
        Interpreter& in;
        std::shared_ptr<Frame>& frame;
        ~KeepIfCaptured() {
          if (frame.use_count() > 1) in.frames_.push_back(frame);
        }
      } keep_if_captured{in, frame};
      std::shared_ptr<Frame> saved_frame = in.frame_;
      in.frame_ = frame;
      for (const auto& [key, value] : args.keywords) {
        if (std::find(macro->params.begin(), macro->params.end(), key) == macro->params.end()) {
          in.frame_ = saved_frame;
          throw Failure{"macro '" + macro->targets[0] + "' takes no keyword argument '" + key + "'", line};
        }
      }
      for (size_t i = 0; i < macro->params.size(); ++i) {
        const std::string& param = macro->params[i];
        if (i < args.positional.size()) {
          frame->vars[param] = args.positional[i];
        } else if (const Value* kw = keyword(args, param)) {
          frame->vars[param] = *kw;
        } else if (macro->defaults[i]) {
          frame->vars[param] = in.eval(*macro->defaults[i]);
        } else {
          frame->vars[param] = Value::undefined(param);
        }
      }
      std::string captured;
      std::string* saved_out = in.out_;
      in.out_ = &captured;
      ++in.capture_depth_;
      (void)in.exec_body(macro->bodies[0]);
      --in.capture_depth_;
      in.out_ = saved_out;
      in.frame_ = saved_frame;
      return Value::from_string(std::move(captured));
    });
  }

  Value lookup(const std::string& name) const {
    for (const Frame* f = frame_.get(); f != nullptr; f = f->parent.get()) {
      auto it = f->vars.find(name);
      if (it != f->vars.end()) return it->second;
    }
    return Value::undefined(name);
  }

  // ---- expressions --------------------------------------------------------------------------
  // Every expression's value passes here, so this is where one render's work is bounded: each
  // string or list it builds counts toward kMaxWorkBytes (a hostile template could otherwise
  // build a 60 MiB string in each of a million iterations) and none may pass kMaxValueBytes.
  Value eval(const Expr& e) {
    Value value = eval_unbounded(e);
    uint64_t size_bytes = 0;
    if (value.kind == Value::Kind::string) size_bytes = value.text.size();
    if (value.kind == Value::Kind::list && value.list) size_bytes = value.list->size() * kListItemBytes;
    if (size_bytes > kMaxValueBytes) {
      throw Failure{"the template built a value of more than " + std::to_string(kMaxValueBytes >> 20) + " MiB", e.line};
    }
    charge(size_bytes, e.line);
    return value;
  }

  void charge(uint64_t work_bytes, int line) {
    work_bytes_ += work_bytes;
    if (work_bytes_ > kMaxWorkBytes) {
      throw Failure{"the template did more than " + std::to_string(kMaxWorkBytes >> 20) +
                        " MiB of work (values built, loop iterations) in one render",
                    line};
    }
  }

  Value eval_unbounded(const Expr& e) {
    switch (e.kind) {
      case Expr::Kind::literal: return e.literal;
      case Expr::Kind::name: return lookup(e.name);
      case Expr::Kind::list:
      case Expr::Kind::tuple: {
        List items;
        for (const ExprPtr& item : e.args) items.push_back(eval(*item));
        return Value::from_list(std::move(items), e.kind == Expr::Kind::tuple);
      }
      case Expr::Kind::dict: {
        auto dict = std::make_shared<Dict>();
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          Value key = eval(*e.args[i]);
          dict_store(*dict, key, eval(*e.args[i + 1]), e.line);
        }
        return Value::from_dict(std::move(dict));
      }
      case Expr::Kind::getattr: return get_attribute(eval(*e.args[0]), e.name, e.line);
      case Expr::Kind::getitem: return get_item(eval(*e.args[0]), eval(*e.args[1]), e.line);
      case Expr::Kind::slice: return slice(e);
      case Expr::Kind::call: {
        Value callee = eval(*e.args[0]);
        CallArgs args = eval_args(e, 1);
        return call(callee, args, e.line);
      }
      case Expr::Kind::filter: {
        Value input = eval(*e.args[0]);
        CallArgs args = eval_args(e, 1);
        return apply_filter(e.name, input, args, e.line);
      }
      case Expr::Kind::test: {
        Value input = eval(*e.args[0]);
        CallArgs args = eval_args(e, 1);
        bool result = apply_test(e.name, input, args, e.line);
        return Value::from_bool(e.negated ? !result : result);
      }
      case Expr::Kind::unary_not: return Value::from_bool(!truthy(eval(*e.args[0])));
      case Expr::Kind::negate: {
        Value v = eval(*e.args[0]);
        if (is_intlike(v)) return Value::from_int(-as_int(v));
        if (v.kind == Value::Kind::floating) return Value::from_float(-v.floating);
        if (v.is_undefined()) undefined_error(v, e.line);
        throw Failure{"bad operand type for unary -: '" + type_name(v) + "'", e.line};
      }
      case Expr::Kind::binary: return binary(e.name, eval(*e.args[0]), eval(*e.args[1]), e.line);
      case Expr::Kind::compare: {
        Value left = eval(*e.args[0]);
        for (size_t i = 0; i < e.compare_ops.size(); ++i) {
          Value right = eval(*e.args[i + 1]);
          if (!compare_once(e.compare_ops[i], left, right, e.line)) return Value::from_bool(false);
          left = std::move(right);
        }
        return Value::from_bool(true);
      }
      case Expr::Kind::logical_and: {
        Value a = eval(*e.args[0]);
        return truthy(a) ? eval(*e.args[1]) : a;
      }
      case Expr::Kind::logical_or: {
        Value a = eval(*e.args[0]);
        return truthy(a) ? a : eval(*e.args[1]);
      }
      case Expr::Kind::conditional: {
        if (truthy(eval(*e.args[0]))) return eval(*e.args[1]);
        if (e.has_else) return eval(*e.args[2]);
        return Value::undefined();
      }
    }
    return Value::undefined();
  }

  bool compare_once(const std::string& op, const Value& a, const Value& b, int line) {
    if (op == "==") return equal(a, b);
    if (op == "!=") return !equal(a, b);
    if (op == "in") return contains(b, a, line);
    if (op == "not in") return !contains(b, a, line);
    int c = compare_order(a, b, op, line);
    if (op == "<") return c < 0;
    if (op == ">") return c > 0;
    if (op == "<=") return c <= 0;
    return c >= 0;
  }

  CallArgs eval_args(const Expr& e, size_t first) {
    CallArgs args;
    for (size_t i = first; i < e.args.size(); ++i) args.positional.push_back(eval(*e.args[i]));
    for (const auto& [key, value] : e.keywords) args.keywords.emplace_back(key, eval(*value));
    return args;
  }

  Value call(const Value& callee, CallArgs& args, int line) {
    if (callee.kind == Value::Kind::callable) return (*callee.callable)(*this, args, line);
    if (callee.is_undefined()) undefined_error(callee, line);
    throw Failure{"'" + type_name(callee) + "' object is not callable", line};
  }

  bool contains(const Value& container, const Value& needle, int line) {
    switch (container.kind) {
      case Value::Kind::string:
        if (needle.kind != Value::Kind::string) {
          throw Failure{"'in <string>' requires string as left operand, not " + type_name(needle), line};
        }
        return container.text.find(needle.text) != std::string::npos;
      case Value::Kind::list:
        for (const Value& item : iterate(container, line)) {
          if (equal(item, needle)) return true;
        }
        return false;
      case Value::Kind::dict:
        if (needle.kind == Value::Kind::list || needle.kind == Value::Kind::dict) return false;
        return dict_lookup(*container.dict, needle, line) != nullptr;
      case Value::Kind::undefined: return false;  // jinja2's Undefined iterates as empty
      default: throw Failure{"argument of type '" + type_name(container) + "' is not iterable", line};
    }
  }

  Value binary(const std::string& op, const Value& a, const Value& b, int line) {
    if (op == "~") return Value::from_string(to_str(a) + to_str(b));
    if (a.is_undefined()) undefined_error(a, line);
    if (b.is_undefined()) undefined_error(b, line);
    auto type_error = [&]() -> Failure {
      return Failure{"unsupported operand type(s) for " + op + ": '" + type_name(a) + "' and '" + type_name(b) + "'",
                     line};
    };
    if (a.is_number() && b.is_number()) {
      bool ints = is_intlike(a) && is_intlike(b);
      // Python's ints do not overflow; a result beyond 64 bits is refused, never wrapped.
      auto checked = [&](bool overflowed, int64_t result) {
        if (overflowed) throw Failure{"integer result of '" + op + "' does not fit in 64 bits (not supported)", line};
        return Value::from_int(result);
      };
      if (ints && (op == "+" || op == "-" || op == "*")) {
        int64_t r = 0;
        bool overflowed = op == "+"   ? __builtin_add_overflow(as_int(a), as_int(b), &r)
                          : op == "-" ? __builtin_sub_overflow(as_int(a), as_int(b), &r)
                                      : __builtin_mul_overflow(as_int(a), as_int(b), &r);
        return checked(overflowed, r);
      }
      if (op == "+") return Value::from_float(as_float(a) + as_float(b));
      if (op == "-") return Value::from_float(as_float(a) - as_float(b));
      if (op == "*") return Value::from_float(as_float(a) * as_float(b));
      if (op == "/") {
        if (as_float(b) == 0) throw Failure{"division by zero", line};
        return Value::from_float(as_float(a) / as_float(b));
      }
      if (op == "//" || op == "%") {
        if (as_float(b) == 0) throw Failure{"integer division or modulo by zero", line};
        if (ints) {
          int64_t q = floor_div(as_int(a), as_int(b));
          return op == "//" ? Value::from_int(q) : Value::from_int(as_int(a) - q * as_int(b));
        }
        double q = std::floor(as_float(a) / as_float(b));
        return op == "//" ? Value::from_float(q) : Value::from_float(as_float(a) - q * as_float(b));
      }
      if (op == "**") {
        if (ints && as_int(b) >= 0) {
          int64_t result = 1;
          for (int64_t i = 0; i < as_int(b) && result != 0; ++i) {
            if (__builtin_mul_overflow(result, as_int(a), &result)) checked(true, 0);
            if (as_int(a) == 1 || as_int(a) == -1) {  // the sign alternates; no need to loop on
              result = (as_int(a) == -1 && (as_int(b) % 2) != 0) ? -1 : 1;
              break;
            }
          }
          return Value::from_int(result);
        }
        return Value::from_float(std::pow(as_float(a), as_float(b)));
      }
    }
    if (!a.view.empty() || !b.view.empty()) throw type_error();
    if (op == "+") {
      if (a.kind == Value::Kind::string && b.kind == Value::Kind::string) {
        if (!a.markup && !b.markup) return Value::from_string(a.text + b.text);
        // Markup + str escapes the str (markupsafe): templates that write "..."|safe + x get
        // x HTML-escaped in transformers too.
        Value out = Value::from_string((a.markup ? a.text : html_escape(a.text)) + (b.markup ? b.text : html_escape(b.text)));
        out.markup = true;
        return out;
      }
      if (a.kind == Value::Kind::list && b.kind == Value::Kind::list) {
        List items = *a.list;
        items.insert(items.end(), b.list->begin(), b.list->end());
        return Value::from_list(std::move(items), a.tuple);
      }
    }
    if (op == "*") {
      const Value& seq = is_intlike(a) ? b : a;
      const Value& times = is_intlike(a) ? a : b;
      constexpr auto kMaxRepeatBytes = static_cast<int64_t>(kMaxValueBytes);  // a guard against '...' * 10**12
      if (is_intlike(times) && (seq.kind == Value::Kind::string || seq.kind == Value::Kind::list)) {
        int64_t unit = seq.kind == Value::Kind::string ? static_cast<int64_t>(seq.text.size())
                                                       : static_cast<int64_t>(seq.list->size() * kListItemBytes);
        if (as_int(times) > 0 && unit > 0 && as_int(times) > kMaxRepeatBytes / unit) {
          throw Failure{"'*' would build a value over " + std::to_string(kMaxValueBytes >> 20) + " MiB", line};
        }
      }
      if (is_intlike(times) && seq.kind == Value::Kind::string) {
        // Doubling: a handful of large copies instead of one append per repetition.
        const size_t size_bytes = seq.text.size() * static_cast<size_t>(std::max<int64_t>(as_int(times), 0));
        std::string out;
        out.reserve(size_bytes);
        if (size_bytes > 0) out = seq.text;
        while (out.size() < size_bytes) out.append(out, 0, std::min(out.size(), size_bytes - out.size()));
        return Value::from_string(std::move(out));
      }
      if (is_intlike(times) && seq.kind == Value::Kind::list) {
        List items;
        for (int64_t i = 0; i < as_int(times); ++i) items.insert(items.end(), seq.list->begin(), seq.list->end());
        return Value::from_list(std::move(items), seq.tuple);
      }
    }
    if (op == "%" && a.kind == Value::Kind::string) {
      throw Failure{"printf-style string formatting ('...' % value) is not supported", line};
    }
    throw type_error();
  }

  Value slice(const Expr& e) {
    Value target = eval(*e.args[0]);
    auto part = [&](size_t i) -> std::optional<int64_t> {
      if (!e.args[i]) return std::nullopt;
      Value v = eval(*e.args[i]);
      if (v.kind == Value::Kind::none) return std::nullopt;
      if (!is_intlike(v)) throw Failure{"slice indices must be integers or None", e.line};
      return as_int(v);
    };
    std::optional<int64_t> start = part(1), stop = part(2), step_opt = part(3);
    int64_t step = step_opt.value_or(1);
    if (step == 0) throw Failure{"slice step cannot be zero", e.line};
    auto pick = [&](int64_t length, auto&& emit) {
      int64_t lo, hi;
      auto clamp = [&](std::optional<int64_t> v, int64_t fallback) {
        if (!v) return fallback;
        int64_t x = *v < 0 ? *v + length : *v;
        if (step > 0) return std::clamp<int64_t>(x, 0, length);
        return std::clamp<int64_t>(x, -1, length - 1);
      };
      if (step > 0) {
        lo = clamp(start, 0);
        hi = clamp(stop, length);
        for (int64_t i = lo; i < hi; i += step) emit(i);
      } else {
        lo = clamp(start, length - 1);
        hi = clamp(stop, -1);
        for (int64_t i = lo; i > hi; i += step) emit(i);
      }
    };
    if (target.kind == Value::Kind::list && target.view != "generator" && target.view.rfind("dict_", 0) != 0) {
      List out;
      pick(static_cast<int64_t>(target.list->size()), [&](int64_t i) { out.push_back((*target.list)[static_cast<size_t>(i)]); });
      return Value::from_list(std::move(out), target.tuple);
    }
    if (target.kind == Value::Kind::string) {
      auto cps = decode(target.text);
      std::vector<uint32_t> out;
      pick(static_cast<int64_t>(cps.size()), [&](int64_t i) { out.push_back(cps[static_cast<size_t>(i)]); });
      return Value::from_string(encode(out, 0, out.size()));
    }
    if (target.is_undefined()) undefined_error(target, e.line);
    return Value::undefined();
  }

  Value get_item(const Value& obj, const Value& key, int line) {
    if (obj.is_undefined()) undefined_error(obj, line);
    if (obj.kind == Value::Kind::dict && !obj.is_namespace) {
      if (key.kind == Value::Kind::list || key.kind == Value::Kind::dict) return Value::undefined();
      if (const Value* v = dict_lookup(*obj.dict, key, line)) return *v;
      return Value::undefined(key.kind == Value::Kind::string ? key.text : to_str(key));
    }
    // Generators and dict views are not subscriptable: jinja2 falls back to undefined.
    if (obj.kind == Value::Kind::list && (obj.view == "generator" || obj.view.rfind("dict_", 0) == 0)) {
      return Value::undefined();
    }
    if ((obj.kind == Value::Kind::list || obj.kind == Value::Kind::string) && is_intlike(key)) {
      int64_t index = as_int(key);
      if (obj.kind == Value::Kind::list) {
        auto n = static_cast<int64_t>(obj.list->size());
        if (index < 0) index += n;
        if (index < 0 || index >= n) return Value::undefined();
        return (*obj.list)[static_cast<size_t>(index)];
      }
      auto cps = decode(obj.text);
      auto n = static_cast<int64_t>(cps.size());
      if (index < 0) index += n;
      if (index < 0 || index >= n) return Value::undefined();
      return Value::from_string(encode(cps, static_cast<size_t>(index), static_cast<size_t>(index) + 1));
    }
    if (key.kind == Value::Kind::string) return get_attribute(obj, key.text, line);
    return Value::undefined();
  }

  Value get_attribute(const Value& obj, const std::string& name, int line) {
    if (obj.is_undefined()) undefined_error(obj, line);
    if (obj.kind == Value::Kind::dict) {
      if (obj.is_namespace) {
        if (const Value* v = obj.dict->find(dict_key(Value::from_string(name), line))) return *v;
        return Value::undefined(name);
      }
      if (name == "items" || name == "keys" || name == "values" || name == "get") return dict_method(obj, name);
      if (name == "update" || name == "pop" || name == "popitem" || name == "setdefault" || name == "clear") {
        return unsafe_method(name, "dict");
      }
      if (const Value* v = obj.dict->find(dict_key(Value::from_string(name), line))) return *v;
      return Value::undefined(name);
    }
    if (obj.kind == Value::Kind::string) return string_method(obj, name, line);
    if (obj.kind == Value::Kind::list) {
      if (name == "append" || name == "extend" || name == "pop" || name == "insert" || name == "remove" ||
          name == "sort" || name == "reverse" || name == "clear") {
        return unsafe_method(name, "list");
      }
      if (name == "index" || name == "count") {
        Value list = obj;
        return Value::from_callable("list." + name, [list, name](Interpreter&, CallArgs& args, int call_line) {
          if (args.positional.size() != 1) throw Failure{"list." + name + "() takes one argument", call_line};
          int64_t found = 0;
          for (size_t i = 0; i < list.list->size(); ++i) {
            if (equal((*list.list)[i], args.positional[0])) {
              if (name == "index") return Value::from_int(static_cast<int64_t>(i));
              ++found;
            }
          }
          if (name == "index") throw Failure{"list.index(x): x not in list", call_line};
          return Value::from_int(found);
        });
      }
    }
    return Value::undefined(name);
  }

  static Value unsafe_method(const std::string& name, const std::string& type) {
    return Value::from_callable(type + "." + name, [name, type](Interpreter&, CallArgs&, int line) -> Value {
      throw Failure{"access to attribute '" + name + "' of '" + type +
                        "' object is unsafe (the sandbox transformers renders in refuses to change values)",
                    line};
    });
  }

  static Value dict_method(const Value& obj, const std::string& name) {
    Value dict = obj;
    return Value::from_callable("dict." + name, [dict, name](Interpreter&, CallArgs& args, int line) {
      if (name == "get") {
        if (args.positional.empty()) throw Failure{"dict.get() needs a key", line};
        const Value& key = args.positional[0];
        if (key.kind != Value::Kind::list && key.kind != Value::Kind::dict) {
          if (const Value* v = dict_lookup(*dict.dict, key, line)) return *v;
        }
        return args.positional.size() > 1 ? args.positional[1] : Value::none();
      }
      List out;
      for (const auto& [key, value] : dict.dict->items) {
        if (name == "items") {
          out.push_back(Value::from_list({key_value(key), value}, true));
        } else if (name == "keys") {
          out.push_back(key_value(key));
        } else {
          out.push_back(value);
        }
      }
      Value view = Value::from_list(std::move(out));
      view.view = "dict_" + name;  // dict_items / dict_keys / dict_values, as Python prints them
      return view;
    });
  }

  static Value string_method(const Value& obj, const std::string& name, int line) {
    static const char* const kMethods[] = {"strip", "lstrip", "rstrip", "split", "startswith", "endswith", "upper",
                                           "lower", "title", "capitalize", "replace", "count", "find", "join",
                                           "splitlines", "isdigit", "isalpha", "isspace", "islower", "isupper", "rsplit"};
    bool known = false;
    for (const char* m : kMethods) known = known || name == m;
    if (!known) {
      if (name == "format" || name == "format_map") {
        throw Failure{"str." + name + "() is not supported", line};
      }
      return Value::undefined(name);
    }
    std::string text = obj.text;
    return Value::from_callable("str." + name, [text, name](Interpreter&, CallArgs& args, int call_line) -> Value {
      const Value* a0 = argument(args, 0, "");
      auto need_string = [&](const Value* v) -> const std::string& {
        if (v == nullptr || v->kind != Value::Kind::string) {
          throw Failure{"str." + name + "() needs a string argument", call_line};
        }
        return v->text;
      };
      if (name == "strip") return Value::from_string(strip_chars(text, a0, true, true));
      if (name == "lstrip") return Value::from_string(strip_chars(text, a0, true, false));
      if (name == "rstrip") return Value::from_string(strip_chars(text, a0, false, true));
      if (name == "split" || name == "rsplit") {
        const Value* sep = argument(args, 0, "sep");
        const Value* max = argument(args, 1, "maxsplit");
        int64_t max_split = max != nullptr && is_intlike(*max) ? as_int(*max) : -1;
        if (name == "rsplit" && max_split >= 0) throw Failure{"str.rsplit() with maxsplit is not supported", call_line};
        if (sep != nullptr && sep->kind == Value::Kind::string && sep->text.empty()) {
          throw Failure{"empty separator", call_line};
        }
        List out;
        for (auto& part : split_text(text, sep, max_split)) out.push_back(Value::from_string(std::move(part)));
        return Value::from_list(std::move(out));
      }
      if (name == "startswith" || name == "endswith") {
        std::vector<std::string> options;
        if (a0 != nullptr && a0->kind == Value::Kind::list) {
          for (const Value& v : *a0->list) options.push_back(need_string(&v));
        } else {
          options.push_back(need_string(a0));
        }
        for (const auto& o : options) {
          bool hit = name == "startswith" ? text.compare(0, o.size(), o) == 0
                                          : text.size() >= o.size() && text.compare(text.size() - o.size(), o.size(), o) == 0;
          if (hit) return Value::from_bool(true);
        }
        return Value::from_bool(false);
      }
      if (name == "upper") return Value::from_string(py_upper(text));
      if (name == "lower") return Value::from_string(py_lower(text));
      if (name == "title") return Value::from_string(title_case(text));
      if (name == "capitalize") return Value::from_string(capitalize(text));
      if (name == "replace") {
        const Value* count = argument(args, 2, "count");
        return Value::from_string(replace_text(text, need_string(argument(args, 0, "old")),
                                               need_string(argument(args, 1, "new")),
                                               count != nullptr && is_intlike(*count) ? as_int(*count) : -1));
      }
      if (name == "count") {
        const std::string& sub = need_string(a0);
        if (sub.empty()) return Value::from_int(static_cast<int64_t>(decode(text).size()) + 1);
        int64_t n = 0;
        for (size_t at = text.find(sub); at != std::string::npos; at = text.find(sub, at + sub.size())) ++n;
        return Value::from_int(n);
      }
      if (name == "find") {
        size_t at = text.find(need_string(a0));
        if (at == std::string::npos) return Value::from_int(-1);
        return Value::from_int(static_cast<int64_t>(decode(text.substr(0, at)).size()));
      }
      if (name == "join") {
        if (a0 == nullptr) throw Failure{"str.join() needs an iterable", call_line};
        std::string out;
        bool first = true;
        for (const Value& v : iterate(*a0, call_line)) {
          if (v.kind != Value::Kind::string) throw Failure{"str.join(): expected str instance, " + type_name(v) + " found", call_line};
          if (!first) out += text;
          first = false;
          out += v.text;
        }
        return Value::from_string(out);
      }
      if (name == "splitlines") {
        List out;
        std::string current;
        for (size_t i = 0; i < text.size(); ++i) {
          if (text[i] == '\n' || text[i] == '\r') {
            out.push_back(Value::from_string(current));
            current.clear();
            if (text[i] == '\r' && i + 1 < text.size() && text[i + 1] == '\n') ++i;
          } else {
            current += text[i];
          }
        }
        if (!current.empty()) out.push_back(Value::from_string(current));
        return Value::from_list(std::move(out));
      }
      auto all = [&](auto pred) {
        if (text.empty()) return Value::from_bool(false);
        for (char c : text) {
          if (!pred(static_cast<unsigned char>(c))) return Value::from_bool(false);
        }
        return Value::from_bool(true);
      };
      if (name == "isdigit") return all([](unsigned char c) { return std::isdigit(c) != 0; });
      if (name == "isalpha") return all([](unsigned char c) { return std::isalpha(c) != 0; });
      if (name == "isspace") return all([](unsigned char c) { return py_space(c); });
      if (name == "islower") return Value::from_bool(text != py_upper(text) && text == py_lower(text));
      return Value::from_bool(text != py_lower(text) && text == py_upper(text));  // isupper
    });
  }

  // ---- filters ------------------------------------------------------------------------------
  Value attribute_path(const Value& item, const std::string& path, int line) {
    Value v = item;
    size_t pos = 0;
    while (true) {
      size_t dot = path.find('.', pos);
      std::string part = path.substr(pos, dot == std::string::npos ? std::string::npos : dot - pos);
      bool numeric = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
      int64_t index = 0;
      const char* end = part.data() + part.size();
      if (numeric && std::from_chars(part.data(), end, index).ec != std::errc())
        throw Failure{"attribute index " + part + " does not fit in 64 bits (not supported)", line};
      v = numeric ? get_item(v, Value::from_int(index), line) : get_item(v, Value::from_string(part), line);
      if (dot == std::string::npos) return v;
      if (v.is_undefined()) return v;
      pos = dot + 1;
    }
  }

  // select / reject / selectattr / rejectattr: `test_at` is where the test name sits in args.
  Value select_items(const Value& input, CallArgs& args, bool keep_matches, bool by_attribute, int line) {
    List out;
    size_t at = 0;
    std::string attribute;
    if (by_attribute) {
      if (args.positional.empty() || args.positional[0].kind != Value::Kind::string) {
        throw Failure{"selectattr/rejectattr need an attribute name", line};
      }
      attribute = args.positional[0].text;
      at = 1;
    }
    std::string test;
    CallArgs test_args;
    if (args.positional.size() > at) {
      if (args.positional[at].kind != Value::Kind::string) throw Failure{"the test name must be a string", line};
      test = args.positional[at].text;
      test_args.positional.assign(args.positional.begin() + static_cast<std::ptrdiff_t>(at + 1), args.positional.end());
    }
    if (!truthy(input)) return make_generator({});  // jinja2 checks `if seq:` first (None selects nothing)
    for (const Value& item : iterate(input, line)) {
      Value subject = by_attribute ? attribute_path(item, attribute, line) : item;
      bool hit = test.empty() ? truthy(subject) : apply_test(test, subject, test_args, line);
      if (hit == keep_matches) out.push_back(item);
    }
    return make_generator(std::move(out));
  }

  Value apply_filter(const std::string& name, const Value& input, CallArgs& args, int line) {
    const Value* a0 = argument(args, 0, "");
    auto string_input = [&]() { return to_str(input); };
    if (name == "string") return input.kind == Value::Kind::string ? input : Value::from_string(string_input());
    if (name == "safe" || name == "escape" || name == "e" || name == "forceescape") {
      if (input.kind == Value::Kind::string && input.markup && name != "forceescape") return input;
      Value out = Value::from_string(name == "safe" ? string_input() : html_escape(string_input()));
      out.markup = true;
      return out;
    }
    if (name == "tojson") {
      const Value* indent = argument(args, 0, "indent");
      if (const Value* sort = keyword(args, "sort_keys"); sort != nullptr && truthy(*sort)) {
        throw Failure{"tojson(sort_keys=true) is not supported", line};
      }
      if (keyword(args, "separators") != nullptr) throw Failure{"tojson(separators=...) is not supported", line};
      bool indented = indent != nullptr && indent->kind != Value::Kind::none;
      if (indented && !is_intlike(*indent)) throw Failure{"tojson: indent must be an integer", line};
      return Value::from_string(to_json(input, indented ? static_cast<int>(as_int(*indent)) : 0, indented, line));
    }
    if (name == "length" || name == "count") return Value::from_int(length_of(input, line));
    if (name == "trim") return Value::from_string(strip_chars(string_input(), argument(args, 0, "chars"), true, true));
    if (name == "upper") return Value::from_string(py_upper(string_input()));
    if (name == "lower") return Value::from_string(py_lower(string_input()));
    if (name == "title") return Value::from_string(title_filter(string_input()));
    if (name == "capitalize") return Value::from_string(capitalize(string_input()));
    if (name == "default" || name == "d") {
      const Value* boolean = argument(args, 1, "boolean");
      bool use_default = input.is_undefined() || (boolean != nullptr && truthy(*boolean) && !truthy(input));
      if (use_default) return a0 != nullptr ? *a0 : Value::from_string("");
      return input;
    }
    if (name == "join") {
      const Value* sep = argument(args, 0, "d");
      const Value* attribute = argument(args, 1, "attribute");
      std::string out;
      bool first = true;
      for (const Value& item : iterate(input, line)) {
        if (!first) out += sep != nullptr ? to_str(*sep) : "";
        first = false;
        out += to_str(attribute != nullptr ? attribute_path(item, to_str(*attribute), line) : item);
      }
      return Value::from_string(out);
    }
    if (name == "first" && input.kind == Value::Kind::list && input.view == "generator") {
      size_t& taken = *input.consumed;  // next(iter(generator)): the rest stays for later loops
      if (taken >= input.list->size()) return Value::undefined(name);
      return (*input.list)[taken++];
    }
    if (name == "last" && input.kind == Value::Kind::list && input.view == "generator") {
      throw Failure{"'generator' object is not reversible (add |list before |last)", line};
    }
    if (name == "first" || name == "last") {
      List items = iterate(input, line);
      if (items.empty()) return Value::undefined(name);
      return name == "first" ? items.front() : items.back();
    }
    if (name == "list") return Value::from_list(iterate(input, line));
    if (name == "items") {
      if (input.is_undefined()) return make_generator({});
      if (input.kind != Value::Kind::dict) throw Failure{"items: can only get item pairs from a mapping", line};
      CallArgs none;
      return make_generator(*call(dict_method(input, "items"), none, line).list);
    }
    if (name == "reverse") {
      if (input.kind == Value::Kind::string) {
        auto cps = decode(input.text);
        std::reverse(cps.begin(), cps.end());
        return Value::from_string(encode(cps, 0, cps.size()));
      }
      List items = iterate(input, line);
      std::reverse(items.begin(), items.end());
      return Value::from_list(std::move(items));
    }
    if (name == "int") {
      const Value* fallback = argument(args, 0, "default");
      Value dflt = fallback != nullptr ? *fallback : Value::from_int(0);
      if (is_intlike(input)) return Value::from_int(as_int(input));
      if (input.kind == Value::Kind::floating) return Value::from_int(static_cast<int64_t>(input.floating));
      if (input.kind == Value::Kind::string) {
        std::string s = strip_chars(input.text, nullptr, true, true);
        try {
          size_t used = 0;
          int64_t v = std::stoll(s, &used, 10);
          if (used == s.size()) return Value::from_int(v);
          double d = std::stod(s, &used);
          if (used == s.size()) return Value::from_int(static_cast<int64_t>(d));
        } catch (const std::exception&) {
        }
      }
      return dflt;
    }
    if (name == "float") {
      const Value* fallback = argument(args, 0, "default");
      Value dflt = fallback != nullptr ? *fallback : Value::from_float(0.0);
      if (input.is_number()) return Value::from_float(as_float(input));
      if (input.kind == Value::Kind::string) {
        try {
          size_t used = 0;
          std::string s = strip_chars(input.text, nullptr, true, true);
          double d = std::stod(s, &used);
          if (used == s.size()) return Value::from_float(d);
        } catch (const std::exception&) {
        }
      }
      return dflt;
    }
    if (name == "abs") {
      if (is_intlike(input)) return Value::from_int(std::llabs(as_int(input)));
      if (input.kind == Value::Kind::floating) return Value::from_float(std::fabs(input.floating));
      throw Failure{"bad operand type for abs(): '" + type_name(input) + "'", line};
    }
    if (name == "round") {
      const Value* precision = argument(args, 0, "precision");
      const Value* method = argument(args, 1, "method");
      int64_t digits = precision != nullptr && is_intlike(*precision) ? as_int(*precision) : 0;
      std::string how = method != nullptr ? to_str(*method) : "common";
      if (how != "common" && how != "ceil" && how != "floor") throw Failure{"round: method must be common, ceil or floor", line};
      if (!input.is_number()) throw Failure{"round: a number is needed, not " + type_name(input), line};
      if (how == "common") {
        // Python's round(): an int stays an int; a float rounds its exact binary value half to
        // even, which printf's correctly rounded %.*f also does.
        if (is_intlike(input) && digits >= 0) return Value::from_int(as_int(input));
        if (digits < 0 || digits > 300) throw Failure{"round: precision must be 0..300", line};
        std::string printed = fmt::format("{:.{}f}", as_float(input), digits);
        return Value::from_float(std::stod(printed));
      }
      double scale = std::pow(10.0, static_cast<double>(digits));
      double x = as_float(input) * scale;
      return Value::from_float((how == "ceil" ? std::ceil(x) : std::floor(x)) / scale);
    }
    if (name == "dictsort") {
      if (input.kind != Value::Kind::dict) throw Failure{"dictsort: a mapping is needed, not " + type_name(input), line};
      const Value* case_sensitive = argument(args, 0, "case_sensitive");
      const Value* by = argument(args, 1, "by");
      const Value* reverse = argument(args, 2, "reverse");
      bool sensitive = case_sensitive != nullptr && truthy(*case_sensitive);
      bool by_value = by != nullptr && to_str(*by) == "value";
      if (by != nullptr && !by_value && to_str(*by) != "key") throw Failure{"dictsort: 'by' must be key or value", line};
      List items;
      for (const auto& [key, value] : input.dict->items) items.push_back(Value::from_list({key_value(key), value}, true));
      auto key_of = [&](const Value& item) {
        Value key = (*item.list)[by_value ? 1 : 0];
        if (!sensitive && key.kind == Value::Kind::string) key = Value::from_string(py_lower(key.text));
        return key;
      };
      std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
        return compare_order(key_of(a), key_of(b), "<", line) < 0;
      });
      if (reverse != nullptr && truthy(*reverse)) std::reverse(items.begin(), items.end());
      return Value::from_list(std::move(items));
    }
    if (name == "replace") {
      const Value* count = argument(args, 2, "count");
      if (argument(args, 0, "old") == nullptr || argument(args, 1, "new") == nullptr) throw Failure{"replace needs old and new", line};
      return Value::from_string(replace_text(string_input(), to_str(*argument(args, 0, "old")),
                                             to_str(*argument(args, 1, "new")),
                                             count != nullptr && is_intlike(*count) ? as_int(*count) : -1));
    }
    if (name == "indent") {
      const Value* width = argument(args, 0, "width");
      const Value* first = argument(args, 1, "first");
      const Value* blank = argument(args, 2, "blank");
      std::string indention = width == nullptr ? "    " : width->kind == Value::Kind::string ? width->text
                                                                  : std::string(static_cast<size_t>(std::max<int64_t>(0, as_int(*width))), ' ');
      std::string s = string_input() + "\n";  // jinja2 3.1 appends a newline before splitlines()
      std::vector<std::string> lines;
      {
        std::string current;
        for (size_t i = 0; i < s.size(); ++i) {
          if (s[i] == '\n' || s[i] == '\r') {
            lines.push_back(current);
            current.clear();
            if (s[i] == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ++i;
          } else {
            current += s[i];
          }
        }
        if (!current.empty()) lines.push_back(current);
      }
      std::string rv;
      if (blank != nullptr && truthy(*blank)) {
        for (size_t i = 0; i < lines.size(); ++i) rv += (i ? "\n" + indention : "") + lines[i];
      } else {
        rv = lines.empty() ? "" : lines[0];
        for (size_t i = 1; i < lines.size(); ++i) rv += "\n" + (lines[i].empty() ? "" : indention) + lines[i];
      }
      if (first != nullptr && truthy(*first)) rv = indention + rv;
      return Value::from_string(rv);
    }
    if (name == "map") {
      List out;
      if (!truthy(input)) return make_generator({});  // jinja2's map yields nothing for a falsy value
      const Value* attribute = keyword(args, "attribute");
      if (attribute != nullptr) {
        const Value* fallback = keyword(args, "default");
        for (const Value& item : iterate(input, line)) {
          Value v = attribute_path(item, to_str(*attribute), line);
          out.push_back(v.is_undefined() && fallback != nullptr ? *fallback : v);
        }
        return make_generator(std::move(out));
      }
      if (args.positional.empty() || args.positional[0].kind != Value::Kind::string) {
        throw Failure{"map needs a filter name or attribute=", line};
      }
      std::string filter = args.positional[0].text;
      CallArgs rest;
      rest.positional.assign(args.positional.begin() + 1, args.positional.end());
      rest.keywords = args.keywords;
      static const std::set<std::string> allowed = {"upper", "lower", "trim", "string", "int", "float", "title",
                                                    "capitalize", "tojson", "length", "first", "last", "abs", "round", "default", "d"};
      if (allowed.count(filter) == 0) throw Failure{"map('" + filter + "') is not supported", line};
      for (const Value& item : iterate(input, line)) out.push_back(apply_filter(filter, item, rest, line));
      return make_generator(std::move(out));
    }
    if (name == "select") return select_items(input, args, true, false, line);
    if (name == "reject") return select_items(input, args, false, false, line);
    if (name == "selectattr") return select_items(input, args, true, true, line);
    if (name == "rejectattr") return select_items(input, args, false, true, line);
    if (name == "unique") {
      const Value* case_sensitive = argument(args, 0, "case_sensitive");
      const Value* attribute = argument(args, 1, "attribute");
      bool sensitive = case_sensitive != nullptr && truthy(*case_sensitive);
      List out;
      List seen;
      for (const Value& item : iterate(input, line)) {
        Value key = attribute != nullptr ? attribute_path(item, to_str(*attribute), line) : item;
        if (!sensitive && key.kind == Value::Kind::string) key = Value::from_string(py_lower(key.text));
        bool dup = false;
        for (const Value& s : seen) dup = dup || equal(s, key);
        if (!dup) {
          seen.push_back(key);
          out.push_back(item);
        }
      }
      return make_generator(std::move(out));
    }
    if (name == "sort") {
      const Value* reverse = argument(args, 0, "reverse");
      const Value* case_sensitive = argument(args, 1, "case_sensitive");
      const Value* attribute = argument(args, 2, "attribute");
      bool sensitive = case_sensitive != nullptr && truthy(*case_sensitive);
      List items = iterate(input, line);
      auto key_of = [&](const Value& item) {
        Value key = attribute != nullptr ? attribute_path(item, to_str(*attribute), line) : item;
        if (!sensitive && key.kind == Value::Kind::string) key = Value::from_string(py_lower(key.text));
        return key;
      };
      std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
        return compare_order(key_of(a), key_of(b), "<", line) < 0;
      });
      if (reverse != nullptr && truthy(*reverse)) std::reverse(items.begin(), items.end());
      return Value::from_list(std::move(items));
    }
    if (name == "sum") {
      Value total = Value::from_int(0);
      if (const Value* start = argument(args, 1, "start")) total = *start;
      const Value* attribute = argument(args, 0, "attribute");
      for (const Value& item : iterate(input, line)) {
        total = binary("+", total, attribute != nullptr ? attribute_path(item, to_str(*attribute), line) : item, line);
      }
      return total;
    }
    if (name == "min" || name == "max") {
      List items = iterate(input, line);
      if (items.empty()) return Value::undefined(name);
      Value best = items[0];
      for (const Value& item : items) {
        int c = compare_order(item, best, "<", line);
        if ((name == "min" && c < 0) || (name == "max" && c > 0)) best = item;
      }
      return best;
    }
    if (name == "wordcount") return Value::from_int(static_cast<int64_t>(split_text(string_input(), nullptr, -1).size()));
    if (name == "attr") {
      if (a0 == nullptr) throw Failure{"attr needs a name", line};
      return get_attribute(input, to_str(*a0), line);
    }
    throw Failure{"unsupported filter '" + name + "'", line};
  }

  // ---- tests --------------------------------------------------------------------------------
  bool apply_test(const std::string& name, const Value& v, CallArgs& args, int line) {
    const Value* a0 = argument(args, 0, "");
    auto need_arg = [&]() -> const Value& {
      if (a0 == nullptr) throw Failure{"test '" + name + "' needs an argument", line};
      return *a0;
    };
    if (name == "defined") return !v.is_undefined();
    if (name == "undefined") return v.is_undefined();
    if (name == "none") return v.kind == Value::Kind::none;
    if (name == "string") return v.kind == Value::Kind::string;
    if (name == "mapping") return v.kind == Value::Kind::dict && !v.is_namespace;
    if (name == "iterable") return v.kind == Value::Kind::string || v.kind == Value::Kind::list || v.kind == Value::Kind::dict || v.is_undefined();
    if (name == "sequence") {
      return v.kind == Value::Kind::string || (v.kind == Value::Kind::list && (v.view.empty() || v.view == "range")) ||
             (v.kind == Value::Kind::dict && !v.is_namespace);
    }
    if (name == "number") return v.is_number();
    if (name == "integer") return v.kind == Value::Kind::integer;
    if (name == "float") return v.kind == Value::Kind::floating;
    if (name == "boolean") return v.kind == Value::Kind::boolean;
    if (name == "true") return v.kind == Value::Kind::boolean && v.boolean;
    if (name == "false") return v.kind == Value::Kind::boolean && !v.boolean;
    if (name == "callable") return v.kind == Value::Kind::callable;
    if (name == "lower") return v.kind == Value::Kind::string && v.text == py_lower(v.text);
    if (name == "upper") return v.kind == Value::Kind::string && v.text == py_upper(v.text);
    if (name == "odd" || name == "even") {
      if (!is_intlike(v)) throw Failure{"test '" + name + "' needs an integer", line};
      bool odd = (as_int(v) % 2) != 0;
      return name == "odd" ? odd : !odd;
    }
    if (name == "divisibleby") {
      const Value& d = need_arg();
      if (!is_intlike(v) || !is_intlike(d) || as_int(d) == 0) throw Failure{"divisibleby needs non-zero integers", line};
      return as_int(v) % as_int(d) == 0;
    }
    if (name == "equalto" || name == "eq" || name == "==") return equal(v, need_arg());
    if (name == "ne" || name == "!=") return !equal(v, need_arg());
    if (name == "sameas") {
      const Value& o = need_arg();
      if (v.kind != o.kind) return false;
      if (v.kind == Value::Kind::none || v.kind == Value::Kind::undefined) return true;
      if (v.kind == Value::Kind::boolean) return v.boolean == o.boolean;
      if (v.kind == Value::Kind::list) return v.list == o.list;
      if (v.kind == Value::Kind::dict) return v.dict == o.dict;
      return equal(v, o);
    }
    if (name == "lt" || name == "lessthan" || name == "<") return compare_order(v, need_arg(), "<", line) < 0;
    if (name == "le" || name == "<=") return compare_order(v, need_arg(), "<=", line) <= 0;
    if (name == "gt" || name == "greaterthan" || name == ">") return compare_order(v, need_arg(), ">", line) > 0;
    if (name == "ge" || name == ">=") return compare_order(v, need_arg(), ">=", line) >= 0;
    if (name == "in") return contains(need_arg(), v, line);
    throw Failure{"unsupported test '" + name + "'", line};
  }

  // ---- globals ------------------------------------------------------------------------------
  void install_globals() {
    root_->vars["range"] = Value::from_callable("range", [](Interpreter&, CallArgs& args, int line) {
      std::vector<int64_t> n;
      for (const Value& v : args.positional) {
        if (!is_intlike(v)) throw Failure{"range() takes integers, not " + type_name(v), line};
        n.push_back(as_int(v));
      }
      if (n.empty() || n.size() > 3) throw Failure{"range() takes 1 to 3 integers", line};
      int64_t start = n.size() == 1 ? 0 : n[0];
      int64_t stop = n.size() == 1 ? n[0] : n[1];
      int64_t step = n.size() == 3 ? n[2] : 1;
      if (step == 0) throw Failure{"range() arg 3 must not be zero", line};
      List out;
      for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
        // jinja2's sandbox refuses ranges over MAX_RANGE items.
        if (out.size() >= 100000) throw Failure{"range too big (the sandbox allows 100000 items)", line};
        out.push_back(Value::from_int(i));
      }
      Value range = Value::from_list(std::move(out));
      range.view = "range";
      return range;
    });
    root_->vars["namespace"] = Value::from_callable("namespace", [](Interpreter& in, CallArgs& args, int line) {
      auto dict = std::make_shared<Dict>();
      in.namespaces_.push_back(dict);
      for (const Value& v : args.positional) {
        if (v.kind != Value::Kind::dict) throw Failure{"namespace() takes a mapping or keyword arguments", line};
        for (const auto& [key, value] : v.dict->items) dict->set(key, value);
      }
      for (const auto& [key, value] : args.keywords) dict->set(dict_key(Value::from_string(key), line), value);
      Value ns = Value::from_dict(std::move(dict));
      ns.is_namespace = true;
      return ns;
    });
    root_->vars["dict"] = Value::from_callable("dict", [](Interpreter&, CallArgs& args, int line) {
      auto dict = std::make_shared<Dict>();
      for (const Value& v : args.positional) {
        if (v.kind != Value::Kind::dict) throw Failure{"dict() with positional arguments takes a mapping", line};
        for (const auto& [key, value] : v.dict->items) dict->set(key, value);
      }
      for (const auto& [key, value] : args.keywords) dict->set(dict_key(Value::from_string(key), line), value);
      return Value::from_dict(std::move(dict));
    });
    root_->vars["raise_exception"] = Value::from_callable("raise_exception", [](Interpreter&, CallArgs& args, int line) -> Value {
      std::string message = args.positional.empty() ? std::string() : to_str(args.positional[0]);
      throw Failure{"the template raised an exception: " + message, line};
    });
    root_->vars["strftime_now"] = Value::from_callable("strftime_now", [](Interpreter&, CallArgs& args, int line) {
      if (args.positional.empty() || args.positional[0].kind != Value::Kind::string) {
        throw Failure{"strftime_now() takes a format string", line};
      }
      std::time_t now = std::time(nullptr);
      std::tm local{};
      localtime_r(&now, &local);
      char buffer[512];
      size_t n = std::strftime(buffer, sizeof(buffer), args.positional[0].text.c_str(), &local);
      return Value::from_string(std::string(buffer, n));
    });
  }

  struct CallDepth {
    explicit CallDepth(Interpreter& in) : in_(in) { ++in_.call_depth_; }
    ~CallDepth() { --in_.call_depth_; }
    Interpreter& in_;
  };
  static constexpr int kMaxCallDepth = 200;
  // One render's work: 64 MiB of values built, each loop iteration counted as 1 KiB (so at most
  // 65,536 iterations) — about a second under ASan, far beyond a real conversation's.
  static constexpr uint64_t kMaxWorkBytes = uint64_t{64} << 20;
  static constexpr uint64_t kIterationWorkBytes = 1024;
  static constexpr size_t kMaxOutputBytes = kMaxValueBytes;
  int call_depth_ = 0;
  uint64_t work_bytes_ = 0;
  std::vector<std::shared_ptr<Frame>> frames_;    // every frame of this render (see ~Interpreter)
  std::vector<std::shared_ptr<Dict>> namespaces_;  // every namespace() of this render

  const Program& program_;
  std::shared_ptr<Frame> root_;
  std::shared_ptr<Frame> frame_;
  std::string* out_ = nullptr;
  std::vector<std::pair<size_t, size_t>>* spans_ = nullptr;
  int capture_depth_ = 0;  // inside a block set or a macro call: output is not the template's
};

RenderOutput render(const Program& program, const nlohmann::ordered_json& globals) {
  Interpreter interpreter(program, globals);
  return interpreter.run();
}

std::shared_ptr<Program> compile(const std::string& source, const std::string& origin) {
  auto program = std::make_shared<Program>();
  program->origin = origin;
  parse_program(tokenize(source), *program);
  return program;
}

}  // namespace strata::data::jinja
