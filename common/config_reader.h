// strata/common/config_reader.h — strict reading of YAML configuration.
//
// Contract: every module reads its own section through a `ConfigNode`. Each getter names
// a key, its type and its accepted range; a wrong type or an out-of-range value is an
// `invalid_argument` error naming the file, the full key path ("nvme.io.read.queue_depth")
// and what is accepted. After reading a mapping the caller calls `finish()`, which rejects
// every key nobody asked for — a typo is an error, never silently ignored. A missing key
// takes the given default; a key without a default is required.
// Not thread-safe: one reader per parse, on one thread, before any work starts.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace YAML {
class Node;
}

namespace strata {

class ConfigNode {
 public:
  // Parses a YAML file / text; the top level must be a mapping. A file must be a regular file
  // of at most kMaxConfigBytes (anything else is refused before it is read).
  static constexpr uint64_t kMaxConfigBytes = 16u << 20;
  [[nodiscard]] static Result<ConfigNode> load_file(const std::string& path);
  [[nodiscard]] static Result<ConfigNode> load_string(const std::string& text,
                                                      const std::string& source_name);
  ConfigNode(const ConfigNode&);
  ConfigNode& operator=(const ConfigNode&);
  ~ConfigNode();

  bool has(std::string_view key) const;
  const std::string& source_name() const { return source_name_; }
  const std::string& key_path() const { return key_path_; }
  // "corpus.txt" resolved against the config file's folder, as an absolute, lexically
  // normalized path (no "." or ".." left); an absolute path is only normalized.
  std::string resolve_path(const std::string& path) const;

  [[nodiscard]] Result<uint64_t> size(std::string_view key, std::optional<uint64_t> fallback,
                                      uint64_t min_bytes = 0, uint64_t max_bytes = UINT64_MAX);
  [[nodiscard]] Result<int64_t> integer(std::string_view key, std::optional<int64_t> fallback,
                                        int64_t min_value, int64_t max_value);
  [[nodiscard]] Result<double> number(std::string_view key, std::optional<double> fallback,
                                      double min_value, double max_value);
  [[nodiscard]] Result<bool> boolean(std::string_view key, std::optional<bool> fallback);
  [[nodiscard]] Result<std::string> string(std::string_view key,
                                           std::optional<std::string> fallback);
  [[nodiscard]] Result<std::string> choice(std::string_view key,
                                           const std::vector<std::string>& accepted,
                                           std::optional<std::string> fallback);
  [[nodiscard]] Result<std::vector<std::string>> string_list(std::string_view key,
                                                             std::optional<std::vector<std::string>> fallback);
  [[nodiscard]] Result<std::vector<double>> number_list(std::string_view key, size_t count,
                                                        std::optional<std::vector<double>> fallback,
                                                        double min_value, double max_value);
  // A nested mapping. When absent and `required` is false, an empty mapping.
  [[nodiscard]] Result<ConfigNode> child(std::string_view key, bool required = false);
  // Rejects any key of this mapping that no getter asked for.
  [[nodiscard]] Status finish() const;

  // An error for this node's key, for checks that span several keys.
  Error error_at(std::string_view key, const std::string& what) const;

 private:
  ConfigNode(std::unique_ptr<YAML::Node> node, std::string source_name, std::string key_path);
  std::string full_key(std::string_view key) const;
  std::unique_ptr<YAML::Node> lookup(std::string_view key);

  std::unique_ptr<YAML::Node> node_;
  std::string source_name_;
  std::string key_path_;
  std::set<std::string, std::less<>> known_keys_;
};

}  // namespace strata
