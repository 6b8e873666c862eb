// tests/backend/model_scenarios.h — the training and decoding scenarios of backend_harness.h's
// small shapes run through a model definition (models/model.h, make_model_definition) on one
// backend: GPT-2's and Llama's embedding, block and head on the packed unit buffers the trainer
// (or generation) hands them, outputs back as named host tensors. test_backend_ops runs each on
// CUDA and on the CPU and compares whole blocks per tensor (test_ops checks the same ops one by
// one); test_compose_gpt2 and test_compose_llama hold the CPU run to the kernels called
// directly, bit for bit.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "models/model.h"
#include "tests/backend/backend_harness.h"

namespace strata::testing {

// small_config()'s model: models::gpt2_shape_config of it is small_config().
inline ModelConfig small_model() {
  ModelConfig m;
  m.arch = "gpt2";
  const gk::Config c = small_config();
  m.n_layer = static_cast<uint32_t>(c.n_layer);
  m.n_head = static_cast<uint32_t>(c.n_head);
  m.n_embd = static_cast<uint32_t>(c.n_embd);
  m.vocab_size = static_cast<uint32_t>(c.vocab_size);
  m.seq_len = static_cast<uint32_t>(c.n_ctx);
  return m;
}

// small_llama_config()'s model, with q/k/v and o_proj biases when `biased`.
inline ModelConfig small_llama_model(bool biased) {
  const models::llama::Config c = small_llama_config();
  ModelConfig m;
  m.arch = "llama";
  m.n_layer = static_cast<uint32_t>(c.n_layer);
  m.n_head = static_cast<uint32_t>(c.n_head);
  m.n_kv_head = static_cast<uint32_t>(c.n_kv_head);
  m.head_dim = static_cast<uint32_t>(c.head_dim);
  m.n_embd = static_cast<uint32_t>(c.n_embd);
  m.intermediate_size = static_cast<uint32_t>(c.intermediate_size);
  m.vocab_size = static_cast<uint32_t>(c.vocab_size);
  m.seq_len = static_cast<uint32_t>(c.n_ctx);
  m.rope_theta = c.rope_theta;
  m.rope_scaling.type = "llama3";
  m.rope_scaling.factor = c.rope_factor;
  m.rope_scaling.low_freq_factor = c.rope_low_freq_factor;
  m.rope_scaling.high_freq_factor = c.rope_high_freq_factor;
  m.rope_scaling.original_max_position_embeddings = static_cast<uint32_t>(c.rope_original_max_positions);
  m.norm_eps = c.norm_eps;
  m.tie_word_embeddings = c.tie_word_embeddings;
  m.qkv_bias = m.o_proj_bias = biased;
  return m;
}

// A unit packed from its tensors in order, and one tensor of a unit back.
inline std::vector<float> unit_of(const std::vector<std::vector<float>>& tensors) {
  std::vector<float> unit;
  for (const auto& t : tensors) unit.insert(unit.end(), t.begin(), t.end());
  return unit;
}
inline std::vector<float> tensor_of(const std::vector<float>& unit, size_t begin, size_t count) {
  return {unit.begin() + static_cast<std::ptrdiff_t>(begin),
          unit.begin() + static_cast<std::ptrdiff_t>(begin + count)};
}

// GPT-2's scenarios; "packed_X" runs X on small_packing's batch; the head's loss-mask variants
// as apply_masks says.
inline const char* const kModelScenarios[] = {"embedding_forward",
                                              "embedding_backward",
                                              "block_forward",
                                              "block_backward",
                                              "head",
                                              "packed_embedding_forward",
                                              "packed_embedding_backward",
                                              "packed_block_forward",
                                              "packed_block_backward",
                                              "head_masked",
                                              "head_masked_normalizer",
                                              "head_all_masked"};

inline OpOutputs run_model_scenario(BackendEnv& env, const std::string& scenario_name) {
  Scenario scenario = make_scenario();
  auto& [c, s, rows, act, wte_n, wpe_n, block_n, tokens, targets] = scenario;
  const auto def = models::make_model_definition(small_model());
  kernels::ComputeBackend& b = env.backend();
  const std::string name = unpacked_scenario(scenario_name);
  const int64_t normalizer = apply_masks(name, targets);
  const SmallPacking packing = small_packing();
  kernels::StepBatch batch{tokens.data(), targets.data(), s.rows()};
  batch.loss_normalizer_tokens = normalizer;
  if (is_packed_scenario(scenario_name)) {
    batch.positions = packing.positions.data();
    batch.segments = packing.segments.data();
  }
  EXPECT_TRUE(b.begin_step(batch).ok());
  const gk::Workspace ws = env.workspace_for(def->workspace_size_bytes(b, s));
  OpOutputs out;
  auto expect_ok = [](const Status& status) { EXPECT_TRUE(status.ok()) << status.to_string(); };

  // GPT-2's embedding unit is wte then wpe; its final unit ln_f's weight then bias.
  if (name == "embedding_forward") {
    float* embed = env.upload(unit_of({random_floats(wte_n, 0.1f, 1), random_floats(wpe_n, 0.1f, 2)}));
    float* x0 = env.zeros<float>(act);
    expect_ok(def->embedding_forward(b, s, embed, x0));
    out.tensors.push_back({"x0", env.download(x0, act)});
  } else if (name == "embedding_backward") {
    float* d_x0 = env.upload(random_floats(act, 0.1f, 3));
    // accumulated into
    float* grads = env.upload(unit_of({random_floats(wte_n, 0.1f, 4), random_floats(wpe_n, 0.1f, 5)}));
    expect_ok(def->embedding_backward(b, s, d_x0, grads));
    const std::vector<float> unit = env.download(grads, wte_n + wpe_n);
    out.tensors.push_back({"d_wte", tensor_of(unit, 0, wte_n)});
    out.tensors.push_back({"d_wpe", tensor_of(unit, wte_n, wpe_n)});
  } else if (name == "block_forward") {
    float* w = env.upload(block_weights(c, 6));
    float* x_in = env.upload(random_floats(act, 1.0f, 7));
    float* x_out = env.zeros<float>(act);
    expect_ok(def->block_forward(b, s, w, x_in, x_out, ws));
    out.tensors.push_back({"x_out", env.download(x_out, act)});
  } else if (name == "block_backward") {
    float* w = env.upload(block_weights(c, 6));
    float* x_in = env.upload(random_floats(act, 1.0f, 7));
    float* d_x = env.upload(random_floats(act, 0.01f, 8));
    float* grads = env.zeros<float>(block_n);
    expect_ok(def->block_backward(b, s, w, x_in, d_x, d_x, grads, ws, /*recompute=*/true));
    expect_ok(b.sum_squares(grads, block_n));
    out.tensors.push_back({"d_in", env.download(d_x, act)});
    out.tensors.push_back({"grads", env.download(grads, block_n)});
  } else if (name.starts_with("head")) {
    const size_t ln_f_n = 2 * static_cast<size_t>(c.n_embd);
    float* ln_f = env.upload(random_floats(ln_f_n, 0.1f, 9, 0.5f));
    float* embed = env.upload(unit_of({random_floats(wte_n, 0.1f, 1), random_floats(wpe_n, 0.1f, 2)}));
    float* x = env.upload(random_floats(act, 1.0f, 10));
    float* d_x = env.zeros<float>(act);
    float* ln_f_grads = env.upload(random_floats(ln_f_n, 0.1f, 13));
    // The tied head adds into the embedding unit's wte rows (wpe's stay as they are).
    float* embed_grads = env.upload(unit_of({random_floats(wte_n, 0.1f, 14), random_floats(wpe_n, 0.1f, 15)}));
    expect_ok(b.zero(ln_f_grads, ln_f_n));
    expect_ok(def->head_forward_backward(b, s, ln_f, embed, x, d_x, ln_f_grads, embed_grads, ws));
    out.tensors.push_back({"d_x_final", env.download(d_x, act)});
    expect_masked_rows_zero(targets, out.tensors.back().second, c.n_embd);
    out.tensors.push_back({"d_ln_f", env.download(ln_f_grads, ln_f_n)});
    const std::vector<float> unit = env.download(embed_grads, wte_n + wpe_n);
    out.tensors.push_back({"d_wte", tensor_of(unit, 0, wte_n)});
    out.tensors.push_back({"d_wpe_untouched", tensor_of(unit, wte_n, wpe_n)});
  } else {
    ADD_FAILURE() << "unknown scenario " << scenario_name;
  }
  auto scalars = b.end_step();
  EXPECT_TRUE(scalars.ok());
  if (scalars.ok()) {
    out.loss = scalars->loss;
    out.grad_sum_squares = scalars->grad_sum_squares;
  }
  return out;
}

// Llama's: "llama_bias_X" runs llama_X with q/k/v and o_proj biases (Qwen 2's and Llama's
// attention_bias); "llama_packed_X" runs llama_X on small_packing's batch (RoPE per example,
// block-diagonal GQA). The decode ones run the backend's Llama decode ops (not yet the
// definition's).
inline const char* const kLlamaScenarios[] = {"llama_embedding",
                                              "llama_block_forward",
                                              "llama_block_backward",
                                              "llama_head",
                                              "llama_decode",
                                              "llama_bias_block_forward",
                                              "llama_bias_block_backward",
                                              "llama_bias_decode",
                                              "llama_packed_block_forward",
                                              "llama_packed_block_backward",
                                              "llama_head_masked",
                                              "llama_head_masked_normalizer",
                                              "llama_head_all_masked"};

inline OpOutputs run_llama_scenario(BackendEnv& env, const std::string& name) {
  namespace lk = models::llama;
  const bool biased = name.rfind("llama_bias_", 0) == 0;
  const std::string op = biased ? "llama_" + name.substr(11) : unpacked_scenario(name);
  lk::Config c = small_llama_config();
  c.qkv_bias = c.o_bias = biased;
  const auto def = models::make_model_definition(small_llama_model(biased));
  const gk::BatchShape s = small_shape();
  const auto rows = static_cast<size_t>(s.rows());
  const size_t act = rows * static_cast<size_t>(c.n_embd);
  const size_t table = static_cast<size_t>(c.vocab_size * c.n_embd);
  const auto block_n = static_cast<size_t>(lk::block_param_count(c));
  const auto tokens = random_tokens(rows, static_cast<int32_t>(c.vocab_size), 21);
  auto targets = random_tokens(rows, static_cast<int32_t>(c.vocab_size), 22);
  const int64_t normalizer = apply_masks(name, targets);
  kernels::ComputeBackend& b = env.backend();
  const SmallPacking packing = small_packing();
  kernels::StepBatch batch{tokens.data(), targets.data(), s.rows()};
  batch.loss_normalizer_tokens = normalizer;
  if (is_packed_scenario(name)) {
    batch.positions = packing.positions.data();
    batch.segments = packing.segments.data();
  }
  EXPECT_TRUE(b.begin_step(batch).ok());
  const gk::Workspace ws = env.workspace_for(def->workspace_size_bytes(b, s));
  OpOutputs out;
  auto expect_ok = [](const Status& status) { EXPECT_TRUE(status.ok()) << status.to_string(); };
  // Block weights: matrices and biases N(0, 0.1), the two RMSNorm weights around 1.
  std::vector<float> weights = random_floats(block_n, 0.1f, 23);
  const auto specs = lk::block_param_specs(c);
  size_t offset = 0;
  for (const auto& spec : specs) {
    if (spec.name_suffix.ends_with("layernorm.weight"))
      for (int64_t j = 0; j < spec.numel(); ++j) weights[offset + static_cast<size_t>(j)] += 1.0f;
    offset += static_cast<size_t>(spec.numel());
  }
  if (op == "llama_embedding") {
    float* embed = env.upload(random_floats(table, 0.1f, 24));
    float* x0 = env.zeros<float>(act);
    float* d_x0 = env.upload(random_floats(act, 0.1f, 25));
    float* d_embed = env.upload(random_floats(table, 0.1f, 26));
    expect_ok(def->embedding_forward(b, s, embed, x0));
    expect_ok(def->embedding_backward(b, s, d_x0, d_embed));
    out.tensors.push_back({"x0", env.download(x0, act)});
    out.tensors.push_back({"d_embed", env.download(d_embed, table)});
  } else if (op == "llama_block_forward") {
    float* w = env.upload(weights);
    float* x_in = env.upload(random_floats(act, 1.0f, 27));
    float* x_out = env.zeros<float>(act);
    expect_ok(def->block_forward(b, s, w, x_in, x_out, ws));
    out.tensors.push_back({"x_out", env.download(x_out, act)});
  } else if (op == "llama_block_backward") {
    float* w = env.upload(weights);
    float* x_in = env.upload(random_floats(act, 1.0f, 27));
    float* d_x = env.upload(random_floats(act, 0.01f, 28));
    float* grads = env.zeros<float>(block_n);
    expect_ok(def->block_backward(b, s, w, x_in, d_x, d_x, grads, ws, /*recompute=*/true));
    expect_ok(b.sum_squares(grads, block_n));
    out.tensors.push_back({"d_in", env.download(d_x, act)});
    out.tensors.push_back({"grads", env.download(grads, block_n)});
  } else if (op == "llama_decode") {
    // Generation: a 5-token prompt, then two tokens one at a time, against a 12-position cache:
    // each pass's block output and logits, and the cache (keys after RoPE) at the end.
    constexpr int64_t kPrompt = 5;
    constexpr int64_t kWindow = 12;
    const size_t cache_n = static_cast<size_t>(kWindow * c.kv_width());
    float* w = env.upload(weights);
    float* embed = env.upload(random_floats(table, 0.5f, 33));
    float* norm = env.upload(random_floats(static_cast<size_t>(c.n_embd), 0.1f, 34, 1.0f));
    float* lm_head = env.upload(random_floats(table, 0.1f, 35));
    float* keys = env.zeros<float>(cache_n);
    float* values = env.zeros<float>(cache_n);
    float* x0 = env.zeros<float>(static_cast<size_t>(kPrompt * c.n_embd));
    float* x1 = env.zeros<float>(static_cast<size_t>(kPrompt * c.n_embd));
    float* logits = env.zeros<float>(static_cast<size_t>(c.vocab_size));
    const gk::Workspace decode_ws =
        env.workspace_for(def->decode_workspace_size_bytes(env.device().kind(), kPrompt, kWindow));
    const gk::KvCacheBlock cache{keys, values, kWindow};
    int64_t past = 0;
    for (const int64_t step_rows : {kPrompt, int64_t{1}, int64_t{1}}) {
      expect_ok(def->embedding_decode(b, past, step_rows, tokens.data() + past, embed, c.vocab_size, nullptr, x0));
      expect_ok(def->block_decode(b, past, step_rows, w, x0, x1, cache, decode_ws));
      expect_ok(def->head_logits(b, step_rows, norm, lm_head, c.vocab_size, x1, logits, decode_ws));
      const std::string at = "@" + std::to_string(past);
      out.tensors.push_back({"x_out" + at, env.download(x1, static_cast<size_t>(step_rows * c.n_embd))});
      out.tensors.push_back({"logits" + at, env.download(logits, static_cast<size_t>(c.vocab_size))});
      past += step_rows;
    }
    out.tensors.push_back({"keys", env.download(keys, static_cast<size_t>(past * c.kv_width()))});
    out.tensors.push_back({"values", env.download(values, static_cast<size_t>(past * c.kv_width()))});
  } else if (op.starts_with("llama_head")) {
    // The untied final unit: the norm, then lm_head.
    const auto norm_n = static_cast<size_t>(c.n_embd);
    float* final_unit =
        env.upload(unit_of({random_floats(norm_n, 0.1f, 29, 1.0f), random_floats(table, 0.1f, 30)}));
    float* embed = env.upload(random_floats(table, 0.1f, 24));
    float* x = env.upload(random_floats(act, 1.0f, 31));
    float* d_x = env.zeros<float>(act);
    // d_norm from zero, d_lm_head accumulated into
    float* final_grads = env.upload(unit_of({std::vector<float>(norm_n), random_floats(table, 0.1f, 32)}));
    float* embed_grads = env.zeros<float>(table);
    expect_ok(def->head_forward_backward(b, s, final_unit, embed, x, d_x, final_grads, embed_grads, ws));
    out.tensors.push_back({"d_x_final", env.download(d_x, act)});
    expect_masked_rows_zero(targets, out.tensors.back().second, c.n_embd);
    const std::vector<float> grads = env.download(final_grads, norm_n + table);
    out.tensors.push_back({"d_norm", tensor_of(grads, 0, norm_n)});
    out.tensors.push_back({"d_lm_head", tensor_of(grads, norm_n, table)});
    out.tensors.push_back({"d_embed_untouched", env.download(embed_grads, table)});  // untied
  } else {
    ADD_FAILURE() << "unknown scenario " << name;
  }
  auto scalars = b.end_step();
  EXPECT_TRUE(scalars.ok());
  if (scalars.ok()) {
    out.loss = scalars->loss;
    out.grad_sum_squares = scalars->grad_sum_squares;
  }
  return out;
}

// The GPT-2 and Llama heads (through their definitions) of one step whose targets hold
// `bad_target` at their last row (the rest from the scenario): each backend must refuse both
// heads (kernels::check_targets, in its cross_entropy) rather than index a logits row by it.
// Returns the two heads' Statuses.
inline std::pair<Status, Status> heads_with_target(BackendEnv& env, int32_t bad_target) {
  Scenario scenario = make_scenario();
  auto& [c, s, rows, act, wte_n, wpe_n, block_n, tokens, targets] = scenario;
  targets.back() = bad_target;
  kernels::ComputeBackend& b = env.backend();
  EXPECT_TRUE(b.begin_step({tokens.data(), targets.data(), s.rows()}).ok());
  const auto gpt2 = models::make_model_definition(small_model());
  float* ln_f = env.upload(random_floats(2 * static_cast<size_t>(c.n_embd), 0.1f, 9, 0.5f));
  float* embed = env.upload(random_floats(wte_n + wpe_n, 0.1f, 1));
  float* x = env.upload(random_floats(act, 1.0f, 10));
  float* d_x = env.zeros<float>(act);
  float* ln_f_grads = env.zeros<float>(2 * static_cast<size_t>(c.n_embd));
  float* embed_grads = env.zeros<float>(wte_n + wpe_n);
  const Status gpt2_status =
      gpt2->head_forward_backward(b, s, ln_f, embed, x, d_x, ln_f_grads, embed_grads,
                                  env.workspace_for(gpt2->workspace_size_bytes(b, s)));
  ModelConfig llama_model = small_llama_model(false);
  llama_model.vocab_size = static_cast<uint32_t>(c.vocab_size);  // the same targets index the same vocabulary
  const auto llama = models::make_model_definition(llama_model);
  const size_t n_embd = llama_model.n_embd;
  const size_t table = llama_model.vocab_size * n_embd;
  const size_t llama_act = rows * n_embd;
  float* final_unit = env.upload(unit_of({random_floats(n_embd, 0.1f, 29, 1.0f), random_floats(table, 0.1f, 30)}));
  float* llama_embed = env.upload(random_floats(table, 0.1f, 24));
  float* lx = env.upload(random_floats(llama_act, 1.0f, 31));
  float* d_lx = env.zeros<float>(llama_act);
  float* final_grads = env.zeros<float>(n_embd + table);
  float* llama_embed_grads = env.zeros<float>(table);
  const Status llama_status =
      llama->head_forward_backward(b, s, final_unit, llama_embed, lx, d_lx, final_grads, llama_embed_grads,
                                   env.workspace_for(llama->workspace_size_bytes(b, s)));
  (void)b.end_step();
  return {gpt2_status, llama_status};
}


// --- Generation: the definitions' decode methods, f32 and bf16, GPT-2 and Llama ---
// A 5-token prompt, then two tokens one at a time, against a 12-position cache, through
// make_model_definition's embedding_decode / block_decode / head_logits (and the bf16 twins),
// sized as generation sizes them for the device's kind: each pass's block output and logits,
// and the cache (keys and values of every position) at the end. The bf16 scenarios give every
// backend the same bf16 bit patterns (the upper halves of the fp32 weights); the embedding
// stays fp32 (generation widens its rows before the op).
inline const char* const kDecodeScenarios[] = {"gpt2_decode", "gpt2_decode_bf16", "llama_decode_f32",
                                               "llama_decode_bf16"};

inline OpOutputs run_decode_scenario(BackendEnv& env, const std::string& name) {
  namespace lk = models::llama;
  constexpr int64_t kPrompt = 5;
  constexpr int64_t kWindow = 12;
  const bool bf16 = name.ends_with("_bf16");
  const bool llama = name.starts_with("llama_");
  kernels::ComputeBackend& b = env.backend();
  const device::Kind kind = env.device().kind();
  OpOutputs out;
  auto expect_ok = [](const Status& status) { EXPECT_TRUE(status.ok()) << status.to_string(); };
  const gk::Config gc = small_config();
  const lk::Config lc = small_llama_config();
  const auto def = models::make_model_definition(llama ? small_llama_model(false) : small_model());
  const int64_t c = llama ? lc.n_embd : gc.n_embd;
  const int64_t vocab = llama ? lc.vocab_size : gc.vocab_size;
  const int64_t kv_width = def->kv_cache_width();
  const auto table = static_cast<size_t>(vocab * c);
  const auto tokens = random_tokens(static_cast<size_t>(kPrompt + 2), static_cast<int32_t>(vocab), 41);
  // Block weights, packed as the block unit: LayerNorm / RMSNorm gains near 1, the rest small.
  std::vector<float> weights;
  if (llama) {
    weights = random_floats(static_cast<size_t>(lk::block_param_count(lc)), 0.1f, 42);
    size_t offset = 0;
    for (const auto& spec : lk::block_param_specs(lc)) {
      if (spec.name_suffix.ends_with("layernorm.weight"))
        for (int64_t j = 0; j < spec.numel(); ++j) weights[offset + static_cast<size_t>(j)] += 1.0f;
      offset += static_cast<size_t>(spec.numel());
    }
  } else {
    weights = block_weights(gc, 43);
  }
  const std::vector<float> embed_values = random_floats(table, 0.5f, 44);
  const std::vector<float> wpe_values = random_floats(static_cast<size_t>(gc.n_ctx * gc.n_embd), 0.1f, 45);
  const std::vector<float> gain_values = random_floats(static_cast<size_t>(c), 0.1f, 46, 1.0f);
  const std::vector<float> bias_values = random_floats(static_cast<size_t>(c), 0.1f, 47);
  const std::vector<float> lm_head_values = random_floats(table, 0.1f, 48);
  // The final norm as the final unit holds it: GPT-2's ln_f gain then bias, Llama's gain.
  const std::vector<float> final_norm_values = llama ? gain_values : unit_of({gain_values, bias_values});
  // GPT-2's head is tied: its projection is the token embedding.
  const std::vector<float>& projection_values = llama ? lm_head_values : embed_values;
  const float* w = env.upload(weights);
  const uint16_t* w_bits = env.upload(upper_halves(weights));
  const float* embed = env.upload(embed_values);
  const float* wpe = llama ? nullptr : env.upload(wpe_values);
  const float* final_norm = env.upload(final_norm_values);
  const float* projection = env.upload(projection_values);
  const uint16_t* final_norm_bits = env.upload(upper_halves(final_norm_values));
  const uint16_t* projection_bits = env.upload(upper_halves(projection_values));
  const size_t cache_n = static_cast<size_t>(kWindow * kv_width);
  float* keys = env.zeros<float>(cache_n);
  float* values = env.zeros<float>(cache_n);
  float* x0 = env.zeros<float>(static_cast<size_t>(kPrompt * c));
  float* x1 = env.zeros<float>(static_cast<size_t>(kPrompt * c));
  float* logits = env.zeros<float>(static_cast<size_t>(vocab));
  const gk::Workspace ws = env.workspace_for(def->decode_workspace_size_bytes(kind, kPrompt, kWindow));
  const gk::Workspace scratch = env.workspace_for(def->decode_bf16_scratch_bytes(kind));
  const gk::KvCacheBlock cache{keys, values, kWindow};
  int64_t past = 0;
  for (const int64_t rows : {kPrompt, int64_t{1}, int64_t{1}}) {
    expect_ok(def->embedding_decode(b, past, rows, tokens.data() + past, embed, vocab, wpe, x0));
    if (bf16) {
      expect_ok(def->block_decode_bf16(b, past, rows, w_bits, x0, x1, cache, ws, scratch));
      expect_ok(def->head_logits_bf16(b, rows, final_norm_bits, projection_bits, x1, logits, ws, scratch));
    } else {
      expect_ok(def->block_decode(b, past, rows, w, x0, x1, cache, ws));
      expect_ok(def->head_logits(b, rows, final_norm, projection, vocab, x1, logits, ws));
    }
    const std::string at = "@" + std::to_string(past);
    out.tensors.push_back({"x_out" + at, env.download(x1, static_cast<size_t>(rows * c))});
    out.tensors.push_back({"logits" + at, env.download(logits, static_cast<size_t>(vocab))});
    past += rows;
  }
  out.tensors.push_back({"keys", env.download(keys, static_cast<size_t>(past * kv_width))});
  out.tensors.push_back({"values", env.download(values, static_cast<size_t>(past * kv_width))});
  return out;
}

}  // namespace strata::testing
