// ZeRO stage 3's plan, without MPI (train/zero/zero.h, run/train_plan.h): for 2 and 3 ranks, the
// ranks' shares of every unit's compute copy are disjoint, each is exactly the elements of the
// optimizer chunks that rank owns, and together they are the model once (a replicated P fails) —
// for GPT-2 and for a Llama with Qwen 2's q/k/v biases (units of 1-D and 2-D tensors mixed);
// every gathering step reads the next gathering step's shares (the lookahead the gather of unit
// i+1 during unit i's compute needs; with K micro-batches across all K passes) and owner-only
// updates write the share; the two gather buffers are counted in the device scratch at stage 3
// only; the evaluation plan holds the same shares with the same lookahead; ZeRO's stage-3
// formula (with K micro-batches too).
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "models/model_layout.h"
#include "run/train_config.h"
#include "run/train_plan.h"
#include "train/zero/zero.h"

namespace strata {
namespace {

TrainConfig small_config(uint32_t stage) {
  TrainConfig config;
  config.model.n_layer = 2;
  config.model.n_head = 4;
  config.model.n_embd = 64;
  config.model.vocab_size = 256;
  config.model.seq_len = 16;
  config.batch_size = 6;
  config.precision = DType::f32;
  config.optimizer.chunk_elements = 20000;  // blocks of 3 chunks: shares cut units
  config.optimizer.grad_clip = 1.0;
  config.parallel.zero_stage = stage;
  return config;
}

// A Qwen 2-shaped Llama (3 k/v heads × 2 groups, head_dim 16, q/k/v biases) on the same run.
TrainConfig qwen_config(uint32_t stage) {
  TrainConfig config = small_config(stage);
  config.model.arch = "llama";
  config.model.n_head = 6;
  config.model.n_kv_head = 3;
  config.model.head_dim = 16;
  config.model.n_embd = 80;
  config.model.intermediate_size = 112;
  config.model.qkv_bias = true;
  return config;
}

bool step_reads(const TrainPlan& run, size_t step, scheduler::TensorId id) {
  const std::vector<scheduler::TensorId>& reads = run.plan.steps()[step].reads;
  return std::find(reads.begin(), reads.end(), id) != reads.end();
}

TEST(ZeroStage3Plan, SharesAreTheModelOnceAndTheOwnedChunks) {
  for (const TrainConfig& config : {small_config(3), qwen_config(3)}) {
    SCOPED_TRACE(config.model.arch);
    const ModelLayout layout(config.model);
    for (int ranks : {2, 3}) {
      const ChunkOwners owners = optimizer_chunk_owners(layout, config.optimizer.chunk_elements, config.optimizer.state(), ranks);
      uint64_t total_bytes = 0;
      std::set<std::string> names;
      for (int rank = 0; rank < ranks; ++rank) {
        const TrainPlan run = build_train_plan(config, layout, owners, rank);
        ASSERT_TRUE(run.params_gathered);
        uint64_t rank_bytes = 0;
        for (size_t u = 0; u < layout.units().size(); ++u) {
          const UnitIds& ids = run.units[u];
          uint64_t owned_elements = 0;
          for (size_t c = 0; c < ids.optim.size(); ++c)
            if (owners[u][c] == rank) {
              owned_elements += ids.optim[c].range.element_count;
              EXPECT_GE(ids.optim[c].range.begin_elements, ids.params_range.begin_elements);
              EXPECT_LE(ids.optim[c].range.begin_elements + ids.optim[c].range.element_count,
                        ids.params_range.begin_elements + ids.params_range.element_count);
            }
          EXPECT_EQ(ids.params_range.element_count, owned_elements) << layout.units()[u].name << " rank " << rank;
          if (owned_elements == 0) {
            EXPECT_EQ(ids.params, kNoTensor);
            continue;
          }
          ASSERT_NE(ids.params, kNoTensor);
          const scheduler::PlanTensor& share = run.plan.tensors()[ids.params];
          EXPECT_EQ(share.size_bytes, owned_elements * 4);
          EXPECT_TRUE(names.insert(share.name).second) << share.name << " is held by two ranks";
          rank_bytes += share.size_bytes;
        }
        EXPECT_LT(rank_bytes, layout.parameter_count() * 4) << "rank " << rank << " holds the whole compute copy";
        total_bytes += rank_bytes;
      }
      EXPECT_EQ(total_bytes, layout.parameter_count() * 4) << ranks << " ranks";
    }
  }
}

// With gradient accumulation (K passes per update) every pass gathers again: the lookahead runs
// through all K passes, so the last backward of pass k reads the embeddings' share for pass
// k+1's fwd.embed (and with clipping off, the fused updates of the last pass sit in between).
void check_gather_lookahead(uint32_t micro_batches, double grad_clip) {
  SCOPED_TRACE(testing::Message() << "K=" << micro_batches << " grad_clip " << grad_clip);
  TrainConfig config = small_config(3);
  config.gradient_accumulation_steps = micro_batches;
  config.optimizer.grad_clip = grad_clip;
  const ModelLayout layout(config.model);
  const ChunkOwners owners = optimizer_chunk_owners(layout, config.optimizer.chunk_elements, config.optimizer.state(), 2);
  int embed_holders = 0;
  for (int rank = 0; rank < 2; ++rank) {
    const TrainPlan run = build_train_plan(config, layout, owners, rank);
    ASSERT_TRUE(run.plan.validate().ok());
    std::vector<size_t> gathering;
    for (size_t s = 0; s < run.steps.size(); ++s)
      if (run.steps[s].kind != StepKind::optimize && run.steps[s].kind != StepKind::bwd_embed) gathering.push_back(s);
    // fwd.embed, fwd.h.*, head, bwd.h.* — once per micro-batch.
    ASSERT_EQ(gathering.size(), micro_batches * static_cast<size_t>(2 * layout.n_layer() + 2));
    size_t embed_reads_across_passes = 0;
    for (size_t g = 0; g + 1 < gathering.size(); ++g) {
      const StepInfo& next = run.steps[gathering[g + 1]];
      std::vector<size_t> units = {next.unit};
      if (next.kind == StepKind::head) units.push_back(layout.embed_unit());
      for (size_t unit : units) {
        if (run.units[unit].params == kNoTensor) continue;  // this rank holds none of it
        EXPECT_TRUE(step_reads(run, gathering[g], run.units[unit].params))
            << run.plan.steps()[gathering[g]].name << " does not read the share of " << layout.units()[unit].name;
        if (next.kind == StepKind::fwd_embed) ++embed_reads_across_passes;
      }
    }
    // The rank that holds a share of the embeddings announces it for each pass after the first.
    const bool holds_embed = run.units[layout.embed_unit()].params != kNoTensor;
    EXPECT_EQ(embed_reads_across_passes, holds_embed ? micro_batches - 1 : 0);
    embed_holders += holds_embed ? 1 : 0;
    // The updates run once, after the last pass: no optimize step before the last micro-batch's
    // head (the passes before it must all compute on the same shares).
    size_t last_head = 0;
    for (size_t s = 0; s < run.steps.size(); ++s)
      if (run.steps[s].kind == StepKind::head) last_head = s;
    EXPECT_EQ(run.steps[last_head].micro_batch + 1, micro_batches);
    for (size_t s = 0; s < last_head; ++s) EXPECT_NE(run.steps[s].kind, StepKind::optimize) << run.plan.steps()[s].name;
    for (size_t s = 0; s < run.steps.size(); ++s) {
      const StepInfo& info = run.steps[s];
      if (info.kind != StepKind::optimize) continue;
      const std::vector<scheduler::TensorId>& writes = run.plan.steps()[s].writes;
      const bool writes_share = std::find(writes.begin(), writes.end(), run.units[info.unit].params) != writes.end() &&
                                run.units[info.unit].params != kNoTensor;
      EXPECT_EQ(writes_share, owners[info.unit][info.chunk] == rank) << run.plan.steps()[s].name;
    }
  }
  EXPECT_GE(embed_holders, 1);
}

TEST(ZeroStage3Plan, EachGatheringStepReadsTheNextOnesShares) {
  for (uint32_t micro_batches : {1u, 2u, 3u})
    for (double grad_clip : {1.0, 0.0}) check_gather_lookahead(micro_batches, grad_clip);
}

// The evaluation plan at stage 3 (build_eval_plan with owners): the same share tensors as the
// training plan (names and sizes: the store holds only those), and each forward step reads the
// next forward step's shares, the head's being ln_f's and the embeddings'.
TEST(ZeroStage3Plan, EvalPlanGathersTheTrainingShares) {
  const TrainConfig config = small_config(3);
  const ModelLayout layout(config.model);
  const ChunkOwners owners = optimizer_chunk_owners(layout, config.optimizer.chunk_elements, config.optimizer.state(), 2);
  for (int rank = 0; rank < 2; ++rank) {
    const TrainPlan train = build_train_plan(config, layout, owners, rank);
    const TrainPlan eval = build_eval_plan(config, layout, owners, rank);
    ASSERT_TRUE(eval.plan.validate().ok());
    ASSERT_TRUE(eval.params_gathered);
    for (size_t u = 0; u < layout.units().size(); ++u) {
      ASSERT_EQ(eval.units[u].params == kNoTensor, train.units[u].params == kNoTensor) << layout.units()[u].name;
      EXPECT_EQ(eval.units[u].params_range.begin_elements, train.units[u].params_range.begin_elements);
      EXPECT_EQ(eval.units[u].params_range.element_count, train.units[u].params_range.element_count);
      if (eval.units[u].params == kNoTensor) continue;
      EXPECT_EQ(eval.plan.tensors()[eval.units[u].params].name, train.plan.tensors()[train.units[u].params].name);
      EXPECT_EQ(eval.plan.tensors()[eval.units[u].params].size_bytes,
                train.plan.tensors()[train.units[u].params].size_bytes);
    }
    ASSERT_EQ(eval.steps.size(), static_cast<size_t>(layout.n_layer() + 2));  // fwd.embed, fwd.h.*, head
    for (size_t s = 0; s + 1 < eval.steps.size(); ++s) {
      const StepInfo& next = eval.steps[s + 1];
      std::vector<size_t> units = {next.unit};
      if (next.kind == StepKind::head) units.push_back(layout.embed_unit());
      for (size_t unit : units) {
        if (eval.units[unit].params != kNoTensor) {
          EXPECT_TRUE(step_reads(eval, s, eval.units[unit].params))
              << eval.plan.steps()[s].name << " does not read the share of " << layout.units()[unit].name;
        }
      }
    }
  }
  // Without owners (one process, stages 1–2): whole units, nothing gathered.
  const TrainPlan whole = build_eval_plan(config, layout);
  EXPECT_FALSE(whole.params_gathered);
  EXPECT_EQ(whole.plan.tensors()[whole.units[layout.block_unit(0)].params].size_bytes,
            layout.units()[layout.block_unit(0)].element_count * 4);
}

TEST(ZeroStage3Plan, GatherBuffersCountedOnlyAtStage3) {
  const ModelLayout layout(small_config(3).model);
  const ChunkOwners owners = optimizer_chunk_owners(layout, 20000, optim::StateLayout(), 2);
  const TrainConfig stage3 = small_config(3);
  const TrainConfig stage2 = small_config(2);
  const TrainPlan run3 = build_train_plan(stage3, layout, owners, 0);
  const TrainPlan run2 = build_train_plan(stage2, layout, owners, 0);
  EXPECT_FALSE(run2.params_gathered);
  EXPECT_EQ(run2.plan.tensors()[run2.units[layout.block_unit(1)].params].size_bytes,
            layout.units()[layout.block_unit(1)].element_count * 4);
  const uint64_t buffer = gather_buffer_bytes(stage3, layout);
  EXPECT_GE(buffer, layout.largest_unit_elements() * 4);
  EXPECT_GE(buffer, gather_second_offset_bytes(stage3, layout) + layout.units()[layout.embed_unit()].element_count * 4);
  EXPECT_GE(device_scratch(stage3, layout, &run3).param_gather_bytes, 2 * buffer);
  EXPECT_EQ(device_scratch(stage3, layout, &run3).total(),
            device_scratch(stage2, layout, &run2).total() + device_scratch(stage3, layout, &run3).param_gather_bytes);
  EXPECT_EQ(device_scratch(stage2, layout, &run2).param_gather_bytes, 0u);
}

TEST(ZeroStage3Plan, Formula) {
  const uint64_t psi = 117504;
  const ZeroTraffic two = zero_formula_bytes(psi, DType::f32, 3, 2);
  EXPECT_EQ(two.gradient_bytes, psi * 4 / 2);
  EXPECT_EQ(two.parameter_bytes, 2 * (psi * 4 / 2));
  const ZeroTraffic three = zero_formula_bytes(psi, DType::bf16, 3, 3);
  EXPECT_EQ(three.gradient_bytes, psi * 4 * 2 / 3);
  EXPECT_EQ(three.parameter_bytes, 2 * (psi * 2 * 2 / 3));
  EXPECT_EQ(zero_formula_bytes(psi, DType::f32, 3, 1).total(), 0u);
  // K micro-batches: stage 3 gathers in every pass, the gradients are reduced once an update.
  const ZeroTraffic accumulated = zero_formula_bytes(psi, DType::f32, 3, 2, 4);
  EXPECT_EQ(accumulated.gradient_bytes, two.gradient_bytes);
  EXPECT_EQ(accumulated.parameter_bytes, 4 * two.parameter_bytes);
  EXPECT_EQ(zero_formula_bytes(psi, DType::f32, 2, 2, 4).total(), zero_formula_bytes(psi, DType::f32, 2, 2).total());
}

}  // namespace
}  // namespace strata
