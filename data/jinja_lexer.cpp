// strata/data/jinja_lexer.cpp — template source to tokens, with the whitespace rules of the
// environment transformers builds: trim_blocks (the first newline after a block or comment tag
// goes), lstrip_blocks (spaces and tabs before a block or comment tag at the start of a line
// go), `-` on a tag strips all whitespace on that side, `+` turns the block rules off, and one
// trailing newline of the source is dropped (keep_trailing_newline=False).
#include <cctype>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "data/jinja_internal.h"

namespace strata::data::jinja {

namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

int count_lines(const std::string& text, size_t begin, size_t end) {
  int lines = 0;
  for (size_t i = begin; i < end && i < text.size(); ++i) lines += text[i] == '\n';
  return lines;
}


int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

class Lexer {
 public:
  explicit Lexer(std::string source) : src_(std::move(source)) {}

  std::vector<Token> run() {
    normalize();
    size_t pos = 0;
    bool line_starting = true;
    while (pos < src_.size()) {
      size_t start = find_tag(pos);
      std::string text = src_.substr(pos, start - pos);
      int text_line = line_;
      if (start == src_.size()) {
        emit_text(std::move(text), text_line);
        break;
      }
      char kind = src_[start + 1];  // '{', '%' or '#'
      size_t after = start + 2;
      char modifier = after < src_.size() ? src_[after] : '\0';
      if (modifier == '-') {
        size_t keep = text.size();
        while (keep > 0 && is_space(text[keep - 1])) --keep;
        text.resize(keep);
      } else if (kind != '{' && modifier != '+') {
        size_t line_begin = text.rfind('\n');
        line_begin = line_begin == std::string::npos ? 0 : line_begin + 1;
        if (line_begin > 0 || line_starting) {
          bool blank = true;
          for (size_t i = line_begin; i < text.size(); ++i) blank = blank && (text[i] == ' ' || text[i] == '\t');
          if (blank) text.resize(line_begin);
        }
      }
      emit_text(std::move(text), text_line);
      line_ += count_lines(src_, pos, start);
      if (modifier == '-' || modifier == '+') ++after;
      if (kind == '#') {
        size_t end = src_.find("#}", after);
        if (end == std::string::npos) throw Failure{"unclosed comment {# ... (missing #})", line_};
        bool strip_after = end > after && src_[end - 1] == '-';
        bool keep_newline = end > after && src_[end - 1] == '+';
        line_ += count_lines(src_, start, end + 2);
        pos = skip_after_tag(end + 2, strip_after, !keep_newline);
      } else {
        pos = lex_tag(kind == '{', after);
      }
      line_starting = pos > 0 && src_[pos - 1] == '\n';
    }
    tokens_.push_back(Token{TokenType::eof, "", line_});
    return std::move(tokens_);
  }

 private:
  void normalize() {
    std::string out;
    out.reserve(src_.size());
    for (size_t i = 0; i < src_.size(); ++i) {
      if (src_[i] == '\r') {
        out += '\n';
        if (i + 1 < src_.size() && src_[i + 1] == '\n') ++i;
      } else {
        out += src_[i];
      }
    }
    if (!out.empty() && out.back() == '\n') out.pop_back();
    src_ = std::move(out);
  }

  size_t find_tag(size_t pos) const {
    while (true) {
      size_t at = src_.find('{', pos);
      if (at == std::string::npos || at + 1 >= src_.size()) return src_.size();
      char next = src_[at + 1];
      if (next == '{' || next == '%' || next == '#') return at;
      pos = at + 1;
    }
  }

  void emit_text(std::string text, int line) {
    if (!text.empty()) tokens_.push_back(Token{TokenType::text, std::move(text), line});
  }

  // After a tag: `-` strips every following whitespace; a block or comment tag (trim) drops
  // one newline.
  size_t skip_after_tag(size_t pos, bool strip, bool trim) {
    if (strip) {
      while (pos < src_.size() && is_space(src_[pos])) {
        line_ += src_[pos] == '\n';
        ++pos;
      }
    } else if (trim && pos < src_.size() && src_[pos] == '\n') {
      ++line_;
      ++pos;
    }
    return pos;
  }

  size_t lex_tag(bool is_variable, size_t pos) {
    size_t begin_index = tokens_.size();
    int tag_line = line_;
    tokens_.push_back(Token{is_variable ? TokenType::variable_begin : TokenType::block_begin, "", line_});
    int depth = 0;
    while (true) {
      while (pos < src_.size() && is_space(src_[pos])) {
        line_ += src_[pos] == '\n';
        ++pos;
      }
      if (pos >= src_.size()) {
        throw Failure{is_variable ? "unclosed {{ (missing }})" : "unclosed {% (missing %})", tag_line};
      }
      if (depth == 0) {
        const char* close = is_variable ? "}}" : "%}";
        bool minus = src_.compare(pos, 3, std::string("-") + close) == 0;
        bool plus = !is_variable && src_.compare(pos, 3, std::string("+") + close) == 0;
        if (minus || plus || src_.compare(pos, 2, close) == 0) {
          size_t end = pos + (minus || plus ? 3 : 2);
          tokens_.push_back(Token{is_variable ? TokenType::variable_end : TokenType::block_end, "", line_});
          // {% raw %}: everything up to {% endraw %} is text. jinja2 drops no newline after
          // `raw %}` (trim_blocks does not apply to it), only after `endraw %}`.
          if (!is_variable && tokens_.size() - begin_index == 3 && tokens_[begin_index + 1].type == TokenType::name &&
              tokens_[begin_index + 1].text == "raw") {
            tokens_.resize(begin_index);
            return lex_raw(skip_after_tag(end, minus, false), tag_line);
          }
          return skip_after_tag(end, minus, !is_variable && !plus);
        }
      }
      lex_one(pos, depth);
    }
  }

  size_t lex_raw(size_t pos, int tag_line) {
    size_t search = pos;
    while (true) {
      size_t at = src_.find("{%", search);
      if (at == std::string::npos) throw Failure{"{% raw %} without {% endraw %}", tag_line};
      size_t i = at + 2;
      bool strip_before = i < src_.size() && src_[i] == '-';
      bool keep_before = i < src_.size() && src_[i] == '+';
      if (i < src_.size() && (src_[i] == '-' || src_[i] == '+')) ++i;
      while (i < src_.size() && is_space(src_[i])) ++i;
      if (src_.compare(i, 6, "endraw") != 0) {
        search = at + 2;
        continue;
      }
      i += 6;
      while (i < src_.size() && is_space(src_[i])) ++i;
      bool strip_after = src_.compare(i, 3, "-%}") == 0;
      bool plus = src_.compare(i, 3, "+%}") == 0;
      if (!strip_after && !plus && src_.compare(i, 2, "%}") != 0) {
        search = at + 2;
        continue;
      }
      std::string text = src_.substr(pos, at - pos);
      if (strip_before) {
        size_t keep = text.size();
        while (keep > 0 && is_space(text[keep - 1])) --keep;
        text.resize(keep);
      } else if (!keep_before) {
        // lstrip_blocks applies to {% endraw %}: blanks before it on its own line go.
        size_t line_begin = text.rfind('\n');
        if (line_begin != std::string::npos) {
          bool blank = true;
          for (size_t k = line_begin + 1; k < text.size(); ++k) blank = blank && (text[k] == ' ' || text[k] == '\t');
          if (blank) text.resize(line_begin + 1);
        }
      }
      emit_text(std::move(text), line_);
      size_t end = i + (strip_after || plus ? 3 : 2);
      line_ += count_lines(src_, pos, end);
      return skip_after_tag(end, strip_after, !plus);
    }
  }

  void lex_one(size_t& pos, int& depth) {
    char c = src_[pos];
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_') {
      size_t end = pos;
      while (end < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[end])) || src_[end] == '_')) ++end;
      tokens_.push_back(Token{TokenType::name, src_.substr(pos, end - pos), line_});
      pos = end;
      return;
    }
    if (c >= '0' && c <= '9') {
      size_t end = pos;
      while (end < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[end])) || src_[end] == '_')) ++end;
      bool is_float = false;
      if (end + 1 < src_.size() && src_[end] == '.' && std::isdigit(static_cast<unsigned char>(src_[end + 1]))) {
        is_float = true;
        ++end;
        while (end < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[end])) || src_[end] == '_')) ++end;
      }
      if (end < src_.size() && (src_[end] == 'e' || src_[end] == 'E')) {
        size_t e = end + 1;
        if (e < src_.size() && (src_[e] == '+' || src_[e] == '-')) ++e;
        if (e < src_.size() && std::isdigit(static_cast<unsigned char>(src_[e]))) {
          is_float = true;
          end = e;
          while (end < src_.size() && std::isdigit(static_cast<unsigned char>(src_[end]))) ++end;
        }
      }
      std::string digits;
      for (size_t i = pos; i < end; ++i) {
        if (src_[i] != '_') digits += src_[i];
      }
      tokens_.push_back(Token{is_float ? TokenType::floating : TokenType::integer, digits, line_});
      pos = end;
      return;
    }
    if (c == '\'' || c == '"') {
      tokens_.push_back(Token{TokenType::string, lex_string(pos), line_});
      return;
    }
    static const char* const kOperators[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~",
                                             "<", ">", "(", ")", "[", "]", "{", "}", ",", ".", ":", "|", "="};
    for (const char* op : kOperators) {
      size_t len = std::char_traits<char>::length(op);
      if (src_.compare(pos, len, op) == 0) {
        if (*op == '(' || *op == '[' || *op == '{') ++depth;
        if (*op == ')' || *op == ']' || *op == '}') {
          if (depth == 0) throw Failure{std::string("unexpected '") + op + "'", line_};
          --depth;
        }
        tokens_.push_back(Token{TokenType::op, op, line_});
        pos += len;
        return;
      }
    }
    // Quote the whole character (a lone byte of a UTF-8 sequence would make the error line
    // itself invalid UTF-8).
    auto byte = static_cast<unsigned char>(c);
    size_t length = byte < 0x80 ? 1 : (byte >> 5) == 6 ? 2 : (byte >> 4) == 14 ? 3 : (byte >> 3) == 30 ? 4 : 0;
    bool whole = length > 0 && pos + length <= src_.size();
    for (size_t k = 1; whole && k < length; ++k) whole = (static_cast<unsigned char>(src_[pos + k]) >> 6) == 2;
    if (!whole) throw Failure{fmt::format("unexpected byte 0x{:02x} in a tag (not UTF-8 text)", byte), line_};
    throw Failure{"unexpected character '" + src_.substr(pos, length) + "' in a tag", line_};
  }

  std::string lex_string(size_t& pos) {
    char quote = src_[pos];
    int start_line = line_;
    std::string out;
    size_t i = pos + 1;
    while (true) {
      if (i >= src_.size()) throw Failure{"unterminated string literal", start_line};
      char c = src_[i];
      if (c == quote) break;
      if (c == '\n') ++line_;
      if (c != '\\') {
        out += c;
        ++i;
        continue;
      }
      if (i + 1 >= src_.size()) throw Failure{"unterminated string literal", start_line};
      char e = src_[i + 1];
      i += 2;
      switch (e) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case 'a': out += '\a'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'v': out += '\v'; break;
        case '\n': ++line_; break;  // a backslash-newline continues the line
        case 'x':
        case 'u':
        case 'U': {
          int digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          uint32_t cp = 0;
          for (int k = 0; k < digits; ++k) {
            int h = i < src_.size() ? hex_value(src_[i]) : -1;
            if (h < 0) throw Failure{std::string("truncated \\") + e + " escape in a string literal", line_};
            cp = cp * 16 + static_cast<uint32_t>(h);
            ++i;
          }
          append_utf8(out, cp);
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            uint32_t cp = static_cast<uint32_t>(e - '0');
            for (int k = 0; k < 2 && i < src_.size() && src_[i] >= '0' && src_[i] <= '7'; ++k, ++i) {
              cp = cp * 8 + static_cast<uint32_t>(src_[i] - '0');
            }
            append_utf8(out, cp);
          } else if (e == 'N') {
            throw Failure{"\\N{...} escapes in string literals are not supported", line_};
          } else {
            out += '\\';  // Python keeps an unknown escape as written
            out += e;
          }
      }
    }
    pos = i + 1;
    return out;
  }

  std::string src_;
  std::vector<Token> tokens_;
  int line_ = 1;
};

}  // namespace

std::vector<Token> tokenize(const std::string& source) { return Lexer(source).run(); }

// Python string-literal escapes (jinja decodes string literals with "unicode-escape") and the
// evaluator's string methods both write code points back as UTF-8.
void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

}  // namespace strata::data::jinja
