// `strata generate`: sampling with the weights streaming from the store (generate/generate.h) —
// from what `strata train` committed (a config), or from a Hugging Face folder staged into a
// store first (--model, budgets on the command line).
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "common/size.h"
#include "apps/cli/commands.h"
#include "generate/generate.h"
#include "models/hf/hf.h"
#include "run/train_config.h"
#include "io/io_config.h"

namespace strata::cli {

namespace {

struct Options {
  std::string config_path;
  std::string model_dir;
  std::string host_memory = "512MiB";
  std::string device_memory = "256MiB";
  std::string nvme_dir;
  std::string io_file;
  uint32_t seq_len = 0;
  std::string precision = "bf16";
  std::string prompt = "The ";
  std::string prompt_ids;
  std::string tokenizer;
  SamplingOptions sampling;
  std::string verify_reads;  // empty: the config's nvme.verify_reads (always with --model)
  bool json = false;
};

Error usage(const std::string& what) { return make_error(ErrorKind::invalid_argument, what); }

// --prompt-ids: the prompt as token ids ("15496,11"), for a model without a tokenizer at hand;
// sampled tokens print as " <id>".
class IdCodec final : public TokenCodec {
 public:
  Result<std::vector<int32_t>> encode(std::string_view text, uint32_t vocab_size) const override {
    std::vector<int32_t> ids;
    size_t begin = 0;
    while (begin < text.size()) {
      size_t end = text.find(',', begin);
      if (end == std::string_view::npos) end = text.size();
      const std::string piece(text.substr(begin, end - begin));
      char* stop = nullptr;
      const long id = std::strtol(piece.c_str(), &stop, 10);
      if (piece.empty() || *stop != '\0' || id < 0 || id >= static_cast<long>(vocab_size))
        return usage(fmt::format("--prompt-ids: '{}' is not a token id below {}", piece, vocab_size));
      ids.push_back(static_cast<int32_t>(id));
      begin = end + 1;
    }
    return ids;
  }
  std::string decode(int32_t token) const override { return fmt::format(" <{}>", token); }
};

// The run a --model folder and the command line describe: no YAML, the same TrainConfig.
Result<TrainConfig> config_from_flags(const Options& o) {
  if (o.nvme_dir.empty()) return usage("--model needs --nvme DIR: the weights are staged into a store there");
  TrainConfig config;
  config.source_path = "strata generate --model";
  std::error_code error;
  const std::string folder = std::filesystem::absolute(o.model_dir, error).lexically_normal().string();
  if (!hf::is_folder(folder)) return usage(fmt::format("--model {}: not a folder", o.model_dir));
  STRATA_ASSIGN_OR_RETURN(config.model, hf::read_config(folder));
  config.model.init = folder;
  if (o.seq_len > 0) {
    if (o.seq_len > config.model.seq_len)
      return usage(fmt::format("--seq-len {} exceeds {}'s {} positions", o.seq_len, o.model_dir, config.model.seq_len));
    config.model.seq_len = o.seq_len;
  }
  STRATA_ASSIGN_OR_RETURN(config.host_memory_bytes, parse_size(o.host_memory));
  STRATA_ASSIGN_OR_RETURN(config.device_memory_bytes, parse_size(o.device_memory));
  STRATA_ASSIGN_OR_RETURN(config.precision, parse_dtype(o.precision));
  if (config.precision == DType::f16) return usage("--precision: use bf16 or fp32");
  std::filesystem::create_directories(o.nvme_dir, error);
  if (error || !hf::is_folder(o.nvme_dir))
    return usage(fmt::format("--nvme {}: not a folder that can be created ({})", o.nvme_dir, error.message()));
  config.nvme_paths = {std::filesystem::absolute(o.nvme_dir, error).lexically_normal().string()};
  if (!o.io_file.empty()) {
    STRATA_ASSIGN_OR_RETURN(config.io, io::load_io_settings_file(o.io_file));
  }
  return config;
}

void print_summary(const GenerateSummary& s, const Options& o) {
  if (o.json) {
    nlohmann::ordered_json json = {{"text", s.text},
                                   {"tokens", s.tokens},
                                   {"top2_margins", s.top2_margins},
                                   {"prompt_tokens", s.prompt_tokens},
                                   {"prefill_seconds", s.prefill_seconds},
                                   {"decode_seconds", s.decode_seconds},
                                   {"tokens_per_s", s.tokens_per_s},
                                   {"weight_bytes", s.weight_bytes},
                                   {"nvme_read_bytes", s.nvme_read_bytes},
                                   {"nvme_read_trusted_bytes", s.nvme_read_trusted_bytes},
                                   {"read_MBps", s.read_MBps},
                                   {"tuned", s.tuned},
                                   {"io_floor_tokens_per_s", s.io_floor_tokens_per_s},
                                   {"read_busy_seconds", s.read_busy_seconds},
                                   {"stall_seconds", s.stall_seconds},
                                   {"kv_cache_bytes", s.kv_cache_bytes},
                                   {"bf16_scratch_bytes", s.bf16_scratch_bytes},
                                   {"pool_bytes", s.pool_bytes},
                                   {"host_high_water_bytes", s.host_high_water_bytes},
                                   {"peak_rss_bytes", s.peak_rss_bytes}};
    // A sample may end inside a UTF-8 character: such bytes print as U+FFFD rather than throw.
    fmt::print("{}\n", json.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace));
    return;
  }
  fmt::print("{}{}\n", o.prompt, s.text);
  fmt::print(stderr,
             "{} tokens: {:.2f} tokens/s (prompt of {} in {:.2f} s) | I/O floor {:.2f} tokens/s = {} of weights per "
             "token at {:.0f} MB/s ({}) | NVMe read {} | host pool {} (peak {}), KV cache {}, bf16 scratch {}, peak RSS {}\n",
             s.tokens.size(), s.tokens_per_s, s.prompt_tokens, s.prefill_seconds, s.io_floor_tokens_per_s,
             format_size(s.weight_bytes), s.read_MBps, s.tuned ? "tuned" : "untuned: this run's read rate",
             format_size(s.nvme_read_bytes), format_size(s.pool_bytes), format_size(s.host_high_water_bytes),
             format_size(s.kv_cache_bytes), format_size(s.bf16_scratch_bytes), format_size(s.peak_rss_bytes));
}

}  // namespace

void add_generate_command(CLI::App& app, CliState& state) {
  auto o = std::make_shared<Options>();
  CLI::App* gen = app.add_subcommand(
      "generate",
      "Sample text with the weights streaming from the NVMe store within the budgets, with a KV cache: from what "
      "`strata train CONFIG` committed, or from a Hugging Face folder (--model DIR --nvme DIR, staged into a "
      "store first).");
  gen->add_option("config", o->config_path, "the config the model was trained with");
  gen->add_option("--model", o->model_dir, "a Hugging Face model folder instead of a config");
  gen->add_option("--host-memory", o->host_memory, "with --model: the pinned host budget")->capture_default_str();
  gen->add_option("--device-memory", o->device_memory, "with --model: the device budget")->capture_default_str();
  gen->add_option("--nvme", o->nvme_dir, "with --model: the folder the store is staged into");
  gen->add_option("--io-file", o->io_file, "with --model: the io: settings `strata tune` wrote (the tuned bandwidth)");
  gen->add_option("--seq-len", o->seq_len, "with --model: the window (default: the model's positions)");
  gen->add_option("--precision", o->precision, "with --model: the staged compute copy, bf16 or fp32")
      ->capture_default_str();
  gen->add_option("--prompt", o->prompt, "text to continue")->capture_default_str();
  gen->add_option("--prompt-ids", o->prompt_ids, "the prompt as comma-separated token ids (instead of --prompt)");
  gen->add_option("--tokenizer", o->tokenizer,
                  "tokenizer.json, tokenizer.model or their folder (default: data.tokenizer, or the one in the model's "
                  "Hugging Face folder; none: bytes)");
  gen->add_option("--tokens", o->sampling.tokens, "tokens to sample")->capture_default_str();
  gen->add_option("--temperature", o->sampling.temperature, "softmax temperature; 0 is greedy")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 100.0));
  gen->add_option("--top-p", o->sampling.top_p, "nucleus sampling: keep the most likely tokens up to this mass")
      ->capture_default_str()
      ->check(CLI::Range(1e-6, 1.0));
  gen->add_option("--seed", o->sampling.seed, "sampling seed")->capture_default_str();
  gen->add_option("--verify-reads", o->verify_reads,
                  "hash every weight read (always), or each extent only until it was seen intact once (once); "
                  "default: the config's nvme.verify_reads, always with --model")
      ->check(CLI::IsMember({"always", "once"}));
  gen->add_flag("--json", o->json, "print the text and the figures as one JSON object on stdout");
  gen->callback([o, &state] {
    if (o->config_path.empty() == o->model_dir.empty()) {
      failed(Status(usage("give a config, or --model HF_DIR with --nvme DIR (not both)")), state);
      return;
    }
    o->sampling.progress = !o->json;
    Result<TrainConfig> config = o->model_dir.empty() ? load_train_config(o->config_path) : config_from_flags(*o);
    if (failed(config, state)) return;
    if (!o->verify_reads.empty()) config->verify_reads = *memory::parse_verify_reads(o->verify_reads);  // IsMember
    if (!o->model_dir.empty() && failed(stage_hf_weights(*config, !o->json), state)) return;
    const bool ids = !o->prompt_ids.empty();
    if (ids) o->prompt.clear();
    Result<std::unique_ptr<TokenCodec>> codec =
        ids ? Result<std::unique_ptr<TokenCodec>>(std::make_unique<IdCodec>()) : make_codec(*config, o->tokenizer);
    if (failed(codec, state)) return;
    Result<GenerateSummary> summary =
        generate_offloaded(*config, ids ? o->prompt_ids : o->prompt, o->sampling, **codec);
    if (failed(summary, state)) return;
    print_summary(*summary, *o);
  });
}

}  // namespace strata::cli
