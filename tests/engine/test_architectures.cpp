// tests/engine/test_architectures.cpp — the one list of architectures (models/architectures.h):
// each row agrees with the definition it makes (its name, its linears, its LoRA targets), its
// config.json mapping reads back what it writes as the same architecture, and a name no row has
// is refused by the config and store readers, which list every row's name.
#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "models/architectures.h"
#include "models/hf/hf.h"
#include "models/model.h"

namespace strata {
namespace {

// A small model of `arch` with every decoder key the row computes set away from its default, so
// a mapping that drops one shows in the round trip.
ModelConfig small_model(const models::Architecture& arch) {
  ModelConfig m;
  m.arch = std::string(arch.name);
  m.n_layer = 2;
  m.n_head = 4;
  m.n_embd = 64;
  m.vocab_size = 300;
  m.seq_len = 32;
  if (!arch.decoder_keys) return m;
  m.n_kv_head = 2;
  m.head_dim = 24;
  m.intermediate_size = 96;
  m.rope_theta = 500000.0;
  m.norm_eps = 1e-6;
  m.tie_word_embeddings = false;
  if (arch.attention_biases) m.qkv_bias = true;
  return m;
}

TEST(Architectures, NamesAreUniqueAndListed) {
  const std::vector<std::string> names = models::architecture_names();
  ASSERT_FALSE(names.empty());
  EXPECT_EQ(names.front(), "gpt2");  // the config's default
  std::vector<std::string> sorted = names;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(std::adjacent_find(sorted.begin(), sorted.end()), sorted.end());
  for (const std::string& name : names) {
    ASSERT_NE(models::find_architecture(name), nullptr) << name;
    EXPECT_NE(models::architecture_list().find(name), std::string::npos) << name;
  }
  EXPECT_EQ(models::find_architecture("bert"), nullptr);
  EXPECT_EQ(models::find_architecture(""), nullptr);
}

TEST(Architectures, EachRowMakesItsOwnDefinition) {
  for (const models::Architecture& arch : models::architectures()) {
    SCOPED_TRACE(std::string(arch.name));
    const ModelConfig m = small_model(arch);
    EXPECT_EQ(m.decoder_keys(), arch.decoder_keys);
    const auto definition = models::make_model_definition(m);
    ASSERT_NE(definition, nullptr);
    EXPECT_EQ(std::string(definition->arch()), arch.name);
    // Every linear of a block is some target's, every target adapts a linear, the defaults are targets.
    const std::vector<BlockLinear>& linears = definition->block_linears();
    ASSERT_FALSE(linears.empty());
    for (const BlockLinear& linear : linears) {
      EXPECT_TRUE(models::adapter_targets_linear(arch.adapter_targets, linear)) << linear.suffix;
      EXPECT_EQ(linear.conv1d, arch.conv1d) << linear.suffix;
    }
    for (const std::string& target : arch.adapter_targets) {
      const bool adapts = std::any_of(linears.begin(), linears.end(), [&](const BlockLinear& linear) {
        return models::adapter_targets_linear({target}, linear);
      });
      EXPECT_TRUE(adapts) << target;
    }
    for (const std::string& target : arch.default_adapter_targets)
      EXPECT_NE(std::find(arch.adapter_targets.begin(), arch.adapter_targets.end(), target), arch.adapter_targets.end())
          << target;
  }
}

TEST(Architectures, ConfigJsonReadsBackAsTheSameRow) {
  for (const models::Architecture& arch : models::architectures()) {
    SCOPED_TRACE(std::string(arch.name));
    const ModelConfig m = small_model(arch);
    const std::string text = hf::config_json(m);
    auto read = hf::parse_config_json(text, "config.json");
    ASSERT_TRUE(read.ok()) << read.error().message;
    EXPECT_EQ(read->arch, m.arch);
    EXPECT_EQ(models::first_shape_difference(*read, m), std::nullopt) << text;
    // The model_type it wrote is one of the row's.
    bool listed = false;
    for (std::string_view type : arch.hf_model_types) listed |= text.find(fmt::format("\"model_type\": \"{}\"", type)) !=
                                                                std::string::npos;
    EXPECT_TRUE(listed) << text;
  }
  // A model_type no row reads is refused naming the key and every type that is read.
  auto unknown = hf::parse_config_json(R"({"model_type": "bert"})", "/x/config.json");
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.error().kind, ErrorKind::invalid_argument);
  EXPECT_NE(unknown.error().message.find("/x/config.json: key 'model_type' is 'bert'"), std::string::npos)
      << unknown.error().message;
  for (const models::Architecture& arch : models::architectures())
    for (std::string_view type : arch.hf_model_types)
      EXPECT_NE(unknown.error().message.find(type), std::string::npos) << type;
}

TEST(Architectures, StoreMetadataOfEachRowReadsBackAndAnUnknownNameIsRefused) {
  for (const models::Architecture& arch : models::architectures()) {
    SCOPED_TRACE(std::string(arch.name));
    const ModelConfig m = small_model(arch);
    auto read = models::model_from_store_metadata(models::store_metadata(m), "/store");
    ASSERT_TRUE(read.ok()) << read.error().message;
    EXPECT_EQ(models::first_shape_difference(*read, m), std::nullopt);
  }
  std::map<std::string, std::string> metadata = models::store_metadata(small_model(models::architectures().front()));
  metadata["model.arch"] = "bert";
  auto refused = models::model_from_store_metadata(metadata, "/store");
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().kind, ErrorKind::corrupt);
  EXPECT_NE(refused.error().message.find("'model.arch' is 'bert', not " + models::architecture_list()),
            std::string::npos)
      << refused.error().message;
}

// A decoder key a row's definition does not compute is refused in a store's metadata, naming the
// architecture, rather than read and ignored.
TEST(Architectures, StoreRefusesWhatARowDoesNotCompute) {
  int checked = 0;
  for (const models::Architecture& arch : models::architectures()) {
    if (!arch.decoder_keys || arch.attention_biases) continue;
    SCOPED_TRACE(std::string(arch.name));
    std::map<std::string, std::string> metadata = models::store_metadata(small_model(arch));
    metadata["model.qkv_bias"] = "1";
    auto refused = models::model_from_store_metadata(metadata, "/store");
    ASSERT_FALSE(refused.ok());
    EXPECT_NE(refused.error().message.find("attention biases, which " + std::string(arch.label) + " has not"),
              std::string::npos)
        << refused.error().message;
    ++checked;
  }
  EXPECT_GT(checked, 0);  // Gemma 1 has no attention biases
}

}  // namespace
}  // namespace strata
