// tests/gpt2/test_gpt2_cuda.cpp — proves GPT-2 on CUDA — its model definition (models/gpt2.cpp)
// composing the CUDA backend's operations, as the trainer runs it — computes what the CPU
// kernels compute (which test_gpt2_torch ties to PyTorch): the same small GPT-2 is run through
// both, the streaming way (block_backward recomputing each block), and the loss, every gradient
// and the last-position logits (the definition's head_logits per sequence) must agree to
// max|gpu − cpu| / max|cpu| ≤ 1e-5 per tensor; two GPU runs must be bit-identical. Exits 77
// (skip) when no CUDA device is present.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "device/device.h"
#include "kernels/backend.h"
#include "models/model.h"
#include "tests/gpt2/gpt2_test_model.h"

namespace {

using strata::testing::BackwardMode;
using strata::testing::TinyGpt2;
namespace g2 = strata::reference::gpt2;

constexpr double kMaxRelativeError = 1e-5;

#define ASSERT_CUDA(expr) ASSERT_EQ((expr), cudaSuccess) << #expr
#define ASSERT_OK(expr)                                   \
  do {                                                    \
    const ::strata::Status status_ = (expr);              \
    ASSERT_TRUE(status_.ok()) << status_.to_string();     \
  } while (0)

// Device allocation owned for the test's scope.
template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(size_t count) : count_(count) {
    if (cudaMalloc(reinterpret_cast<void**>(&data_), std::max<size_t>(count, 1) * sizeof(T)) !=
        cudaSuccess) {
      data_ = nullptr;
    }
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  ~DeviceArray() { cudaFree(data_); }
  T* get() const { return data_; }
  size_t bytes() const { return count_ * sizeof(T); }

 private:
  T* data_ = nullptr;
  size_t count_;
};

struct GpuResult {
  float loss = 0.0f;
  std::vector<float> grads;
  std::vector<float> last_logits;
};

// The GPT-2 definition of `cfg` (models::gpt2_shape_config of it is cfg).
std::unique_ptr<const strata::models::ModelDefinition> gpt2_definition(const g2::Config& cfg) {
  strata::ModelConfig m;
  m.arch = "gpt2";
  m.n_layer = static_cast<uint32_t>(cfg.n_layer);
  m.n_head = static_cast<uint32_t>(cfg.n_head);
  m.n_embd = static_cast<uint32_t>(cfg.n_embd);
  m.vocab_size = static_cast<uint32_t>(cfg.vocab_size);
  m.seq_len = static_cast<uint32_t>(cfg.n_ctx);
  return strata::models::make_model_definition(m);
}

// Forward + backward of the whole model on the GPU through the definition on the CUDA backend,
// block by block with recompute; the buffers are cudaMalloc'd and copied with the synchronous
// cudaMemcpy before begin_step and after end_step (which waits for the backend's stream).
void run_on_gpu(const TinyGpt2& model, GpuResult& out) {
  const g2::Config& cfg = model.config();
  const g2::BatchShape& shape = model.shape();
  const size_t act = static_cast<size_t>(shape.rows() * cfg.n_embd);
  const auto def = gpt2_definition(cfg);
  ASSERT_EQ(strata::models::gpt2_shape_config(def->config()).vocab_size, cfg.vocab_size);
  auto device = strata::device::make_device(strata::device::Kind::cuda, uint64_t{1} << 30);
  ASSERT_TRUE(device.ok()) << device.error().to_string();
  auto made = strata::kernels::make_backend(**device, shape);
  ASSERT_TRUE(made.ok()) << made.error().to_string();
  strata::kernels::ComputeBackend& backend = **made;

  DeviceArray<float> params(model.params().size());
  DeviceArray<float> grads(model.params().size());
  const size_t ws_bytes = std::max(def->workspace_size_bytes(backend, shape),
                                   def->decode_workspace_size_bytes(strata::device::Kind::cuda, shape.seq_len,
                                                                    shape.seq_len));
  DeviceArray<float> ws(ws_bytes / sizeof(float) + 64);
  std::vector<std::unique_ptr<DeviceArray<float>>> x;
  for (int64_t i = 0; i <= cfg.n_layer; ++i) x.push_back(std::make_unique<DeviceArray<float>>(act));
  DeviceArray<float> d_x(act);
  DeviceArray<float> logits(static_cast<size_t>(shape.batch * cfg.vocab_size));
  ASSERT_NE(ws.get(), nullptr);
  ASSERT_CUDA(cudaMemcpy(params.get(), model.params().data(), params.bytes(), cudaMemcpyHostToDevice));
  ASSERT_CUDA(cudaMemset(grads.get(), 0, grads.bytes()));

  const g2::Workspace workspace{ws.get(), ws_bytes};
  // The parameter list is the definition's units back to back: wte and wpe (the embedding
  // unit), each block, ln_f's weight and bias (the final unit).
  auto at = [&](DeviceArray<float>& base, const std::string& name) {
    return base.get() + model.offset_of(name);
  };
  auto block = [&](DeviceArray<float>& base, int64_t layer) {
    return at(base, g2::block_param_name(layer, "ln_1.weight"));
  };
  ASSERT_OK(backend.begin_step({model.tokens().data(), model.targets().data(), shape.rows()}));
  ASSERT_OK(def->embedding_forward(backend, shape, at(params, "wte.weight"), x[0]->get()));
  for (int64_t layer = 0; layer < cfg.n_layer; ++layer) {
    ASSERT_OK(def->block_forward(backend, shape, block(params, layer), x[layer]->get(), x[layer + 1]->get(),
                                 workspace));
  }
  // Each sequence's last-position logits: its T rows, the logits of the last.
  for (int64_t b = 0; b < shape.batch; ++b) {
    ASSERT_OK(def->head_logits(backend, shape.seq_len, at(params, "ln_f.weight"), at(params, "wte.weight"),
                               cfg.vocab_size, x[cfg.n_layer]->get() + b * shape.seq_len * cfg.n_embd,
                               logits.get() + b * cfg.vocab_size, workspace));
  }
  ASSERT_OK(def->head_forward_backward(backend, shape, at(params, "ln_f.weight"), at(params, "wte.weight"),
                                       x[cfg.n_layer]->get(), d_x.get(), at(grads, "ln_f.weight"),
                                       at(grads, "wte.weight"), workspace));
  for (int64_t layer = cfg.n_layer - 1; layer >= 0; --layer) {
    ASSERT_OK(def->block_backward(backend, shape, block(params, layer), x[layer]->get(), d_x.get(), d_x.get(),
                                  block(grads, layer), workspace, /*recompute=*/true));
  }
  ASSERT_OK(def->embedding_backward(backend, shape, d_x.get(), at(grads, "wte.weight")));
  auto scalars = backend.end_step();
  ASSERT_TRUE(scalars.ok()) << scalars.error().to_string();
  out.loss = static_cast<float>(scalars->loss);
  out.grads.resize(model.params().size());
  out.last_logits.resize(static_cast<size_t>(shape.batch * cfg.vocab_size));
  ASSERT_CUDA(cudaMemcpy(out.grads.data(), grads.get(), grads.bytes(), cudaMemcpyDeviceToHost));
  ASSERT_CUDA(cudaMemcpy(out.last_logits.data(), logits.get(), logits.bytes(), cudaMemcpyDeviceToHost));
}

double relative_error(const float* gpu, const float* cpu, size_t count) {
  double max_diff = 0.0;
  double max_ref = 0.0;
  for (size_t i = 0; i < count; ++i) {
    max_diff = std::max(max_diff, std::abs(static_cast<double>(gpu[i]) - cpu[i]));
    max_ref = std::max(max_ref, std::abs(static_cast<double>(cpu[i])));
  }
  return max_ref == 0.0 ? max_diff : max_diff / max_ref;
}

struct Case {
  const char* name;
  g2::Config config;
  g2::BatchShape shape;
};

class Gpt2CudaMatchesCpu : public ::testing::TestWithParam<Case> {};

TEST_P(Gpt2CudaMatchesCpu, LossGradientsLogitsAndDeterminism) {
  const Case& c = GetParam();
  const TinyGpt2 model(c.config, c.shape, 99);
  std::vector<float> cpu_grads;
  const float cpu_loss = model.loss_and_grads(BackwardMode::recompute_streaming, cpu_grads);
  const std::vector<float> cpu_logits = model.last_logits();

  GpuResult first;
  ASSERT_NO_FATAL_FAILURE(run_on_gpu(model, first));
  EXPECT_LE(std::abs(first.loss - cpu_loss) / std::abs(cpu_loss), kMaxRelativeError)
      << "gpu " << first.loss << " cpu " << cpu_loss;
  double worst = 0.0;
  for (const auto& t : model.tensors()) {
    const double error = relative_error(first.grads.data() + t.offset,
                                        cpu_grads.data() + t.offset, static_cast<size_t>(t.numel()));
    EXPECT_LE(error, kMaxRelativeError) << "gradient of " << t.name;
    worst = std::max(worst, error);
  }
  EXPECT_LE(relative_error(first.last_logits.data(), cpu_logits.data(), cpu_logits.size()),
            kMaxRelativeError);
  std::printf("loss gpu %.8f cpu %.8f; worst gradient relative error %.2e\n", first.loss,
              cpu_loss, worst);

  GpuResult second;
  ASSERT_NO_FATAL_FAILURE(run_on_gpu(model, second));
  EXPECT_EQ(std::memcmp(&first.loss, &second.loss, sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(first.grads.data(), second.grads.data(),
                        first.grads.size() * sizeof(float)), 0);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, Gpt2CudaMatchesCpu,
    ::testing::Values(Case{"acceptance", {2, 4, 64, 97, 16}, {3, 16}},
                      Case{"ragged", {3, 4, 48, 61, 20}, {2, 13}},
                      Case{"head_chunks_and_tiles", {1, 4, 160, 600, 96}, {3, 96}}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

}  // namespace

int main(int argc, char** argv) {
  // Skip (77) only where there is no GPU or no driver; any other CUDA error is a failure.
  int devices = 0;
  const cudaError_t code = cudaGetDeviceCount(&devices);
  if (code == cudaErrorNoDevice || code == cudaErrorInsufficientDriver || (code == cudaSuccess && devices == 0)) {
    std::fprintf(stderr, "SKIP: no CUDA device (%s)\n",
                 code != cudaSuccess ? cudaGetErrorString(code) : "device count 0");
    return 77;
  }
  if (code != cudaSuccess) {
    std::fprintf(stderr, "FAIL: cudaGetDeviceCount: %s\n", cudaGetErrorString(code));
    return 1;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
