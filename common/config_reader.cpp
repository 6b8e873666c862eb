#include "common/config_reader.h"

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <utility>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <yaml-cpp/yaml.h>

#include "common/size.h"

namespace strata {

ConfigNode::ConfigNode(std::unique_ptr<YAML::Node> node, std::string source_name,
                       std::string key_path)
    : node_(std::move(node)), source_name_(std::move(source_name)), key_path_(std::move(key_path)) {}

ConfigNode::ConfigNode(const ConfigNode& other)
    : node_(std::make_unique<YAML::Node>(*other.node_)),
      source_name_(other.source_name_),
      key_path_(other.key_path_),
      known_keys_(other.known_keys_) {}

ConfigNode& ConfigNode::operator=(const ConfigNode& other) {
  if (this != &other) {
    node_ = std::make_unique<YAML::Node>(*other.node_);
    source_name_ = other.source_name_;
    key_path_ = other.key_path_;
    known_keys_ = other.known_keys_;
  }
  return *this;
}

ConfigNode::~ConfigNode() = default;

static Result<ConfigNode> top_level(YAML::Node node, const std::string& source_name,
                                    ConfigNode (*make)(std::unique_ptr<YAML::Node>, std::string)) {
  if (node.IsNull()) node = YAML::Node(YAML::NodeType::Map);
  if (!node.IsMap())
    return make_error(ErrorKind::invalid_argument,
                      fmt::format("{}: the top level must be a mapping of keys", source_name));
  return make(std::make_unique<YAML::Node>(node), source_name);
}

Result<ConfigNode> ConfigNode::load_file(const std::string& path) {
  // A config names other files (nvme.io_file): a FIFO or /dev/zero there would block or read
  // forever, so only a regular file of at most kMaxConfigBytes is read, whole, up front.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return make_errno_error(errno, "open config", path);
  struct stat info {};
  std::string text;
  Status status;
  if (::fstat(fd, &info) != 0) {
    status = make_errno_error(errno, "stat config", path);
  } else if (!S_ISREG(info.st_mode) || static_cast<uint64_t>(info.st_size) > kMaxConfigBytes) {
    status = make_error(ErrorKind::invalid_argument,
                        fmt::format("{}: {}", path, S_ISREG(info.st_mode)
                                                        ? fmt::format("{} bytes, over the {} a config may hold",
                                                                      info.st_size, kMaxConfigBytes)
                                                        : std::string("not a regular file")));
  } else {
    char chunk[16384];
    for (;;) {
      const ssize_t got = ::read(fd, chunk, sizeof chunk);
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) {
        status = make_errno_error(errno, "read config", path);
        break;
      }
      if (got == 0) break;
      text.append(chunk, static_cast<size_t>(got));
      if (text.size() > kMaxConfigBytes) {
        status = make_error(ErrorKind::invalid_argument, fmt::format("{}: grew past {} bytes while read", path,
                                                                     kMaxConfigBytes));
        break;
      }
    }
  }
  ::close(fd);
  if (!status.ok()) return status.error();
  return load_string(text, path);
}

// A `{rank}` template written bare inside a flow sequence (`paths: [/nvme/run/rank{rank}]`,
// as docs/parallel.md once showed) is not valid YAML: inside [ ] a `{` opens a mapping, and
// yaml-cpp only says "end of sequence flow not found". This finds the first line with a `{`
// glued to a bare item of a [ ] list and says, for that line and key, how to quote it.
// Block mappings are followed by indentation for the dotted key; nullopt when no line fits.
static std::optional<std::string> bare_brace_in_flow_hint(const std::string& text) {
  std::vector<std::pair<size_t, std::string>> open_keys;  // (indent, key) of the enclosing `key:` lines
  size_t line_start = 0;
  for (size_t line_number = 1; line_start < text.size(); ++line_number) {
    size_t line_end = text.find('\n', line_start);
    if (line_end == std::string::npos) line_end = text.size();
    const std::string line = text.substr(line_start, line_end - line_start);
    line_start = line_end + 1;
    const size_t indent = line.find_first_not_of(' ');
    if (indent == std::string::npos || line[indent] == '#') continue;
    // This line's key: `name:` at its start (none for a list item or a flow mapping).
    std::string key;
    const size_t colon = line.find(':', indent);
    if (colon != std::string::npos && line.find_first_of(" '\"[]{},#", indent) > colon)
      key = line.substr(indent, colon - indent);
    while (!open_keys.empty() && open_keys.back().first >= indent) open_keys.pop_back();

    char quote = 0;
    int depth = 0;  // of [ ]
    for (size_t at = indent; at < line.size(); ++at) {
      const char c = line[at];
      if (quote != 0) {
        if (c == quote) quote = 0;
      } else if (c == '\'' || c == '"') {
        quote = c;
      } else if (c == '#' && at > 0 && line[at - 1] == ' ') {
        break;  // a comment
      } else if (c == '[') {
        ++depth;
      } else if (c == ']') {
        depth = std::max(0, depth - 1);
      } else if (c == '{' && depth > 0 && std::string_view(" [,{").find(line[at - 1]) == std::string_view::npos) {
        // `{` glued to the text before it: never a mapping the writer meant. Quote each item
        // of this line's [ ] in the example.
        const size_t close = line.find('}', at);
        const std::string placeholder = line.substr(at, close == std::string::npos ? 1 : close - at + 1);
        const size_t list_open = line.find('['), list_close = line.rfind(']');
        std::string example = "[\"/nvme/run/rank{rank}\"]";
        if (list_open != std::string::npos && list_close != std::string::npos && list_close > list_open) {
          std::vector<std::string> items;
          std::string_view rest(line.data() + list_open + 1, list_close - list_open - 1);
          while (!rest.empty()) {
            const size_t comma = rest.find(',');
            std::string item(rest.substr(0, comma));
            item.erase(0, item.find_first_not_of(' '));
            item.erase(item.find_last_not_of(' ') + 1);
            if (!item.empty() && item.front() != '"' && item.front() != '\'') item = "\"" + item + "\"";
            if (!item.empty()) items.push_back(item);
            rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
          }
          example = fmt::format("[{}]", fmt::join(items, ", "));
        }
        // The key is named only when the list is its value (not in `nvme: {paths: [...]}`).
        const bool list_is_value = !key.empty() && line.find_first_not_of(' ', colon + 1) == list_open;
        std::string full_key;
        for (const auto& [open_indent, open_key] : open_keys) full_key += open_key + ".";
        full_key += key;
        const std::string where = list_is_value ? fmt::format("line {}: key '{}'", line_number, full_key)
                                                : fmt::format("line {}", line_number);
        return fmt::format("{}: a bare '{}' inside [ ] opens a YAML mapping; quote the path: {}{}", where,
                           placeholder, list_is_value ? key + ": " : "", example);
      }
    }
    // A `key:` with nothing after it opens a block mapping for the lines indented below it.
    if (!key.empty() && line.find_first_not_of(' ', colon + 1) == std::string::npos) open_keys.emplace_back(indent, key);
  }
  return std::nullopt;
}

Result<ConfigNode> ConfigNode::load_string(const std::string& text, const std::string& source_name) {
  try {
    YAML::Node node = YAML::Load(text);
    return top_level(node, source_name, [](std::unique_ptr<YAML::Node> n, std::string name) {
      return ConfigNode(std::move(n), std::move(name), "");
    });
  } catch (const YAML::Exception& e) {
    if (std::optional<std::string> hint = bare_brace_in_flow_hint(text))
      return make_error(ErrorKind::invalid_argument, fmt::format("{}: {}", source_name, *hint));
    return make_error(ErrorKind::invalid_argument,
                      fmt::format("{}: not valid YAML: {}", source_name, e.what()));
  }
}

std::string ConfigNode::full_key(std::string_view key) const {
  return key_path_.empty() ? std::string(key) : key_path_ + "." + std::string(key);
}

Error ConfigNode::error_at(std::string_view key, const std::string& what) const {
  return make_error(ErrorKind::invalid_argument,
                    fmt::format("{}: key '{}': {}", source_name_, full_key(key), what));
}

bool ConfigNode::has(std::string_view key) const {
  return static_cast<bool>((*node_)[std::string(key)]);
}

std::string ConfigNode::resolve_path(const std::string& path) const {
  std::filesystem::path p(path);
  if (source_name_.empty() && !p.is_absolute()) return path;
  // Made absolute and normalized here, once, while the working directory is the one the config
  // was named from: the store refuses a manifest naming `/run/configs/../data/strata.data`
  // (memory/store.h), and a relative path would name another place from another folder.
  const std::filesystem::path base = std::filesystem::path(source_name_).parent_path();
  std::error_code error;
  const std::filesystem::path absolute = std::filesystem::absolute(base / p, error);
  if (error) return (base / p).lexically_normal().string();  // no working directory: left relative
  return absolute.lexically_normal().string();
}

std::unique_ptr<YAML::Node> ConfigNode::lookup(std::string_view key) {
  known_keys_.emplace(key);
  YAML::Node value = (*node_)[std::string(key)];
  if (!value || value.IsNull()) return nullptr;
  return std::make_unique<YAML::Node>(value);
}

template <typename T>
static Result<T> missing_or_default(const ConfigNode& node, std::string_view key,
                                    const std::optional<T>& fallback, const std::string& what) {
  if (fallback) return *fallback;
  return node.error_at(key, "is required; expected " + what);
}

Result<uint64_t> ConfigNode::size(std::string_view key, std::optional<uint64_t> fallback,
                                  uint64_t min_bytes, uint64_t max_bytes) {
  std::string accepted = max_bytes == UINT64_MAX
                             ? fmt::format("a size of at least {}", format_size(min_bytes))
                             : fmt::format("a size from {} to {}", format_size(min_bytes),
                                           format_size(max_bytes));
  auto value = lookup(key);
  if (!value) return missing_or_default(*this, key, fallback, accepted + " (" + kSizeFormsHelp + ")");
  if (!value->IsScalar()) return error_at(key, "expected " + accepted);
  Result<uint64_t> parsed = parse_size(value->Scalar());
  if (!parsed.ok()) return error_at(key, parsed.error().message);
  if (*parsed < min_bytes || *parsed > max_bytes)
    return error_at(key, fmt::format("{} is out of range; expected {}", value->Scalar(), accepted));
  return parsed;
}

Result<int64_t> ConfigNode::integer(std::string_view key, std::optional<int64_t> fallback,
                                    int64_t min_value, int64_t max_value) {
  std::string accepted = fmt::format("an integer from {} to {}", min_value, max_value);
  auto value = lookup(key);
  if (!value) return missing_or_default(*this, key, fallback, accepted);
  int64_t parsed = 0;
  if (!value->IsScalar() || !YAML::convert<int64_t>::decode(*value, parsed))
    return error_at(key, fmt::format("'{}' is not {}", YAML::Dump(*value), accepted));
  if (parsed < min_value || parsed > max_value)
    return error_at(key, fmt::format("{} is out of range; expected {}", parsed, accepted));
  return parsed;
}

Result<double> ConfigNode::number(std::string_view key, std::optional<double> fallback,
                                  double min_value, double max_value) {
  std::string accepted = fmt::format("a number from {} to {}", min_value, max_value);
  auto value = lookup(key);
  if (!value) return missing_or_default(*this, key, fallback, accepted);
  double parsed = 0;
  if (!value->IsScalar() || !YAML::convert<double>::decode(*value, parsed))
    return error_at(key, fmt::format("'{}' is not {}", YAML::Dump(*value), accepted));
  if (!(parsed >= min_value && parsed <= max_value))
    return error_at(key, fmt::format("{} is out of range; expected {}", parsed, accepted));
  return parsed;
}

Result<bool> ConfigNode::boolean(std::string_view key, std::optional<bool> fallback) {
  auto value = lookup(key);
  if (!value) return missing_or_default(*this, key, fallback, std::string("true or false"));
  bool parsed = false;
  if (!value->IsScalar() || !YAML::convert<bool>::decode(*value, parsed))
    return error_at(key, fmt::format("'{}' is not true or false", YAML::Dump(*value)));
  return parsed;
}

Result<std::string> ConfigNode::string(std::string_view key, std::optional<std::string> fallback) {
  auto value = lookup(key);
  if (!value) return missing_or_default(*this, key, fallback, std::string("a string"));
  if (!value->IsScalar()) return error_at(key, "expected a string");
  return value->Scalar();
}

Result<std::string> ConfigNode::choice(std::string_view key, const std::vector<std::string>& accepted,
                                       std::optional<std::string> fallback) {
  std::string accepted_text = fmt::format("one of {}", fmt::join(accepted, ", "));
  auto value = lookup(key);
  if (!value) return missing_or_default(*this, key, fallback, accepted_text);
  if (!value->IsScalar()) return error_at(key, "expected " + accepted_text);
  for (const std::string& option : accepted)
    if (value->Scalar() == option) return option;
  return error_at(key, fmt::format("'{}' is not accepted; use {}", value->Scalar(), accepted_text));
}

Result<std::vector<std::string>> ConfigNode::string_list(
    std::string_view key, std::optional<std::vector<std::string>> fallback) {
  auto value = lookup(key);
  if (!value) return missing_or_default(*this, key, fallback, std::string("a list of strings"));
  std::vector<std::string> items;
  if (value->IsScalar()) return std::vector<std::string>{value->Scalar()};
  if (!value->IsSequence()) return error_at(key, "expected a list of strings");
  for (const YAML::Node& item : *value) {
    // `[{rank}]` parses, as a list holding the mapping {rank: null}: say how to write a string.
    if (item.IsMap())
      return error_at(key, "expected a list of strings, and an item is a mapping: inside [ ] a '{' opens one; "
                           "quote the item, e.g. [\"/nvme/run/rank{rank}\"]");
    if (!item.IsScalar()) return error_at(key, "expected a list of strings");
    items.push_back(item.Scalar());
  }
  return items;
}

Result<std::vector<double>> ConfigNode::number_list(std::string_view key, size_t count,
                                                    std::optional<std::vector<double>> fallback,
                                                    double min_value, double max_value) {
  std::string accepted = fmt::format("a list of {} numbers from {} to {}", count, min_value, max_value);
  auto value = lookup(key);
  if (!value) return missing_or_default(*this, key, fallback, accepted);
  if (!value->IsSequence() || value->size() != count) return error_at(key, "expected " + accepted);
  std::vector<double> items;
  for (const YAML::Node& item : *value) {
    double parsed = 0;
    if (!item.IsScalar() || !YAML::convert<double>::decode(item, parsed) ||
        !(parsed >= min_value && parsed <= max_value))
      return error_at(key, "expected " + accepted);
    items.push_back(parsed);
  }
  return items;
}

Result<ConfigNode> ConfigNode::child(std::string_view key, bool required) {
  auto value = lookup(key);
  if (!value) {
    if (required) return error_at(key, "is required; expected a mapping of keys");
    return ConfigNode(std::make_unique<YAML::Node>(YAML::NodeType::Map), source_name_, full_key(key));
  }
  if (!value->IsMap()) return error_at(key, "expected a mapping of keys");
  return ConfigNode(std::move(value), source_name_, full_key(key));
}

Status ConfigNode::finish() const {
  for (const auto& entry : *node_) {
    std::string key = entry.first.Scalar();
    if (!known_keys_.contains(key)) {
      return make_error(ErrorKind::invalid_argument,
                        fmt::format("{}: unknown key '{}'; accepted here: {}", source_name_,
                                    full_key(key), fmt::join(known_keys_, ", ")));
    }
  }
  return Status();
}

}  // namespace strata
