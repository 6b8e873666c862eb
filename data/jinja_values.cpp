// strata/data/jinja_values.cpp — Python's view of template values: str(), repr(), truthiness,
// and json.dumps as transformers' `tojson` calls it (ensure_ascii=False, sort_keys=False).
#include <charconv>
#include <cmath>
#include <cstdio>
#include <string>

#include <fmt/format.h>

#include "data/jinja.h"
#include "data/jinja_internal.h"

namespace strata::data::jinja {

Value Value::undefined(std::string name) {
  Value v;
  v.kind = Kind::undefined;
  v.text = std::move(name);
  return v;
}
Value Value::none() {
  Value v;
  v.kind = Kind::none;
  return v;
}
Value Value::from_bool(bool value) {
  Value v;
  v.kind = Kind::boolean;
  v.boolean = value;
  return v;
}
Value Value::from_int(int64_t value) {
  Value v;
  v.kind = Kind::integer;
  v.integer = value;
  return v;
}
Value Value::from_float(double value) {
  Value v;
  v.kind = Kind::floating;
  v.floating = value;
  return v;
}
Value Value::from_string(std::string value) {
  Value v;
  v.kind = Kind::string;
  v.text = std::move(value);
  return v;
}
Value Value::from_list(List items, bool tuple) {
  Value v;
  v.kind = Kind::list;
  v.list = std::make_shared<List>(std::move(items));
  v.tuple = tuple;
  return v;
}
Value Value::from_dict(std::shared_ptr<Dict> dict) {
  Value v;
  v.kind = Kind::dict;
  v.dict = std::move(dict);
  return v;
}
Value Value::from_callable(std::string name, Builtin fn) {
  Value v;
  v.kind = Kind::callable;
  v.callable = std::make_shared<Builtin>(std::move(fn));
  v.callable_name = std::move(name);
  return v;
}

const Value* Dict::find(const std::string& key) const {
  for (const auto& [k, v] : items) {
    if (k == key) return &v;
  }
  return nullptr;
}

void Dict::set(const std::string& key, Value value) {
  for (auto& [k, v] : items) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  items.emplace_back(key, std::move(value));
}

std::string dict_key(const Value& key, int line) {
  switch (key.kind) {
    case Value::Kind::string:
      return !key.text.empty() && key.text[0] == '\x01' ? "\x01s" + key.text : key.text;
    case Value::Kind::integer: return "\x01i" + std::to_string(key.integer);
    case Value::Kind::boolean: return std::string{'\x01', 'b'} + (key.boolean ? "1" : "0");
    case Value::Kind::floating: return std::string{'\x01', 'f'} + to_str(key);
    case Value::Kind::none: return "\x01n";
    default: throw Failure{"unhashable type: '" + std::string(key.kind == Value::Kind::list ? "list" : "dict") + "'", line};
  }
}

std::vector<std::string> dict_key_candidates(const Value& key, int line) {
  std::vector<std::string> out{dict_key(key, line)};
  // 1 == 1.0 == True as dict keys: a lookup finds whichever of them the dict holds.
  if (key.is_number()) {
    double x = key.kind == Value::Kind::floating ? key.floating
               : key.kind == Value::Kind::boolean ? (key.boolean ? 1.0 : 0.0)
                                                  : static_cast<double>(key.integer);
    if (std::floor(x) == x && std::fabs(x) < 9e15) {
      auto n = static_cast<int64_t>(x);
      if (key.kind != Value::Kind::integer) out.push_back("\x01i" + std::to_string(n));
      if (key.kind != Value::Kind::floating) out.push_back(std::string{'\x01', 'f'} + to_str(Value::from_float(x)));
      if (key.kind != Value::Kind::boolean && (n == 0 || n == 1)) out.push_back(std::string{'\x01', 'b'} + (n ? "1" : "0"));
    }
  }
  return out;
}

Value key_value(const std::string& stored) {
  if (stored.empty() || stored[0] != '\x01' || stored.size() < 2) return Value::from_string(stored);
  switch (stored[1]) {
    case 's': return Value::from_string(stored.substr(2));
    case 'i': return Value::from_int(std::stoll(stored.substr(2)));
    case 'b': return Value::from_bool(stored.substr(2) == "1");
    case 'f': return Value::from_float(std::stod(stored.substr(2)));
    default: return Value::none();
  }
}

Value make_generator(List items) {
  Value v = Value::from_list(std::move(items));
  v.view = "generator";
  v.consumed = std::make_shared<size_t>(0);
  return v;
}

namespace {

// float.__repr__: the shortest digits that round-trip, fixed notation for exponents in
// [-4, 16), scientific ("1e+16", "1.5e-05") outside it.
std::string float_repr(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  char buffer[64];
  auto [end, ec] = std::to_chars(buffer, buffer + sizeof(buffer), value, std::chars_format::scientific);
  std::string sci(buffer, end);  // "-1.2345e+02"
  bool negative = false;
  size_t pos = 0;
  if (sci[0] == '-') {
    negative = true;
    pos = 1;
  }
  size_t e_pos = sci.find('e');
  std::string mantissa = sci.substr(pos, e_pos - pos);
  int exponent = std::stoi(sci.substr(e_pos + 1));
  std::string digits;
  for (char c : mantissa) {
    if (c != '.') digits += c;
  }
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  std::string out = negative ? "-" : "";
  if (exponent >= -4 && exponent < 16) {
    if (exponent >= 0) {
      std::string int_part = digits.substr(0, std::min(digits.size(), static_cast<size_t>(exponent + 1)));
      while (int_part.size() < static_cast<size_t>(exponent + 1)) int_part += '0';
      std::string frac = digits.size() > static_cast<size_t>(exponent + 1) ? digits.substr(exponent + 1) : "0";
      out += int_part + "." + frac;
    } else {
      out += "0." + std::string(static_cast<size_t>(-exponent - 1), '0') + digits;
    }
  } else {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    out += fmt::format("e{}{:02d}", exponent < 0 ? '-' : '+', exponent < 0 ? -exponent : exponent);
  }
  return out;
}

std::string string_repr(const std::string& text) {
  bool has_single = text.find('\'') != std::string::npos;
  bool has_double = text.find('"') != std::string::npos;
  char quote = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, quote);
  for (char c : text) {
    auto byte = static_cast<unsigned char>(c);
    if (c == quote || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (byte < 0x20 || byte == 0x7f) {
      out += fmt::format("\\x{:02x}", byte);
    } else {
      out += c;
    }
  }
  out += quote;
  return out;
}

void json_string(const std::string& text, std::string& out) {
  out += '"';
  for (char c : text) {
    auto byte = static_cast<unsigned char>(c);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (byte < 0x20) {
          out += fmt::format("\\u{:04x}", byte);
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

// Throws once `out` passes kMaxValueBytes: lists that hold the same list many times over repr to
// exponentially more text than their memory, so the bound is on the text as it grows.
void check_value_size(const std::string& out, const char* what, int line) {
  if (out.size() > kMaxValueBytes) {
    throw Failure{std::string(what) + ": the value prints to more than " + std::to_string(kMaxValueBytes >> 20) + " MiB",
                  line};
  }
}

void json_value(const Value& value, int indent_width, bool indented, int level, std::string& out, int line) {
  auto newline = [&](int depth) {
    out += '\n';
    out.append(static_cast<size_t>(indent_width) * static_cast<size_t>(depth), ' ');
  };
  switch (value.kind) {
    case Value::Kind::none: out += "null"; return;
    case Value::Kind::boolean: out += value.boolean ? "true" : "false"; return;
    case Value::Kind::integer: out += std::to_string(value.integer); return;
    case Value::Kind::floating:
      if (std::isnan(value.floating)) {
        out += "NaN";
      } else if (std::isinf(value.floating)) {
        out += value.floating > 0 ? "Infinity" : "-Infinity";
      } else {
        out += float_repr(value.floating);
      }
      return;
    case Value::Kind::string: json_string(value.text, out); return;
    case Value::Kind::list: {
      if (!value.view.empty()) {
        const std::string type = value.view == "generator" ? "generator" : value.view;
        throw Failure{"tojson: Object of type " + type + " is not JSON serializable", line};
      }
      if (value.list->empty()) {
        out += "[]";
        return;
      }
      out += '[';
      bool first = true;
      for (const Value& item : *value.list) {
        if (!first) out += indented ? "," : ", ";
        first = false;
        if (indented) newline(level + 1);
        json_value(item, indent_width, indented, level + 1, out, line);
        check_value_size(out, "tojson", line);
      }
      if (indented) newline(level);
      out += ']';
      return;
    }
    case Value::Kind::dict: {
      if (value.dict->items.empty()) {
        out += "{}";
        return;
      }
      out += '{';
      bool first = true;
      for (const auto& [key, item] : value.dict->items) {
        if (!first) out += indented ? "," : ", ";
        first = false;
        if (indented) newline(level + 1);
        // json.dumps writes non-string keys as strings: 1 → "1", None → "null", True → "true".
        Value k = key_value(key);
        json_string(k.kind == Value::Kind::string ? k.text
                    : k.kind == Value::Kind::none ? "null"
                                                  : to_str(k),
                    out);
        out += ": ";
        json_value(item, indent_width, indented, level + 1, out, line);
        check_value_size(out, "tojson", line);
      }
      if (indented) newline(level);
      out += '}';
      return;
    }
    case Value::Kind::undefined:
      throw Failure{"tojson: Object of type Undefined is not JSON serializable" +
                        (value.text.empty() ? std::string() : " ('" + value.text + "' is undefined)"),
                    line};
    case Value::Kind::callable:
      throw Failure{"tojson: a function is not JSON serializable", line};
  }
}

}  // namespace

namespace {

void repr_into(const Value& value, std::string& out) {
  switch (value.kind) {
    case Value::Kind::string: out += string_repr(value.text); break;
    case Value::Kind::list: {
      if (value.view == "generator" || value.view == "range") {
        throw Failure{"printing a " + value.view + " (the output of map, select, range...) is not supported: add |list", 0};
      }
      if (!value.view.empty()) {
        Value plain = Value::from_list(*value.list);
        if (value.view == "dict_items") {
          for (Value& item : *plain.list) item.tuple = true;
        }
        out += value.view + "(";
        repr_into(plain, out);
        out += ")";
        break;
      }
      out += value.tuple ? "(" : "[";
      bool first = true;
      for (const Value& item : *value.list) {
        if (!first) out += ", ";
        first = false;
        repr_into(item, out);
        check_value_size(out, "repr", 0);
      }
      if (value.tuple && value.list->size() == 1) out += ",";
      out += value.tuple ? ")" : "]";
      break;
    }
    case Value::Kind::dict: {
      if (value.is_namespace) {
        out += "<Namespace>";
        break;
      }
      out += "{";
      bool first = true;
      for (const auto& [key, item] : value.dict->items) {
        if (!first) out += ", ";
        first = false;
        repr_into(key_value(key), out);
        out += ": ";
        repr_into(item, out);
        check_value_size(out, "repr", 0);
      }
      out += "}";
      break;
    }
    default: out += to_str(value);
  }
}

}  // namespace

std::string to_repr(const Value& value) {
  std::string out;
  repr_into(value, out);
  return out;
}

std::string to_str(const Value& value) {
  switch (value.kind) {
    case Value::Kind::undefined: return "";
    case Value::Kind::none: return "None";
    case Value::Kind::boolean: return value.boolean ? "True" : "False";
    case Value::Kind::integer: return std::to_string(value.integer);
    case Value::Kind::floating: return float_repr(value.floating);
    case Value::Kind::string: return value.text;
    case Value::Kind::callable: return "<function " + value.callable_name + ">";
    case Value::Kind::list:
    case Value::Kind::dict: return to_repr(value);
  }
  return "";
}

std::string to_json(const Value& value, int indent_width, bool indented, int line) {
  std::string out;
  json_value(value, indent_width, indented, 0, out, line);
  return out;
}

bool truthy(const Value& value) {
  switch (value.kind) {
    case Value::Kind::undefined:
    case Value::Kind::none: return false;
    case Value::Kind::boolean: return value.boolean;
    case Value::Kind::integer: return value.integer != 0;
    case Value::Kind::floating: return value.floating != 0;
    case Value::Kind::string: return !value.text.empty();
    case Value::Kind::list: return value.view == "generator" || !value.list->empty();  // a generator is always true
    case Value::Kind::dict: return value.is_namespace || !value.dict->items.empty();
    case Value::Kind::callable: return true;
  }
  return false;
}

Value from_json(const nlohmann::ordered_json& json) {
  switch (json.type()) {
    case nlohmann::ordered_json::value_t::null: return Value::none();
    case nlohmann::ordered_json::value_t::boolean: return Value::from_bool(json.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value::from_int(json.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      auto u = json.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value::from_float(static_cast<double>(u));
      return Value::from_int(static_cast<int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float: return Value::from_float(json.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value::from_string(json.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List items;
      items.reserve(json.size());
      for (const auto& item : json) items.push_back(from_json(item));
      return Value::from_list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      auto dict = std::make_shared<Dict>();
      for (const auto& [key, item] : json.items()) dict->items.emplace_back(dict_key(Value::from_string(key), 0), from_json(item));
      return Value::from_dict(std::move(dict));
    }
    default: return Value::none();  // binary / discarded: not produced by a JSON parse
  }
}

}  // namespace strata::data::jinja
