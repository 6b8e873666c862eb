// strata/device/cuda_device.cpp — the CUDA device: cudaStream_t streams, cudaEvent_t
// events (timing disabled: they are for ordering), one cudaMalloc region carved by the shared
// range allocator, cudaMemcpyAsync copies (which overlap compute only from pinned host memory,
// hence register_host_memory). Built only when nvcc is found; compiled as C++ against the
// runtime API, since nothing here is device code.
#include <cassert>

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include "common/size.h"
#include "device/backend.h"

namespace strata::device {
namespace {

// Device memory kept free beside the arena, which takes the budget whole at start-up: what the
// process allocates outside it later — cuBLAS's workspace (32 MiB a handle on Hopper), the
// modules of kernels loaded lazily on first launch (tens of MiB), NCCL's communicator buffers
// (a few MiB per channel and peer: up to a few hundred MiB on 8 GPUs). Without it a budget just
// under cudaMemGetInfo's free fits at start and fails at the first GEMM or collective.
constexpr uint64_t kCudaHeadroomBytes = uint64_t{512} << 20;

Error cuda_error(cudaError_t code, const char* op) {
  Error error = make_error(code == cudaErrorMemoryAllocation ? ErrorKind::no_space : ErrorKind::internal,
                           fmt::format("{} ({})", cudaGetErrorString(code), cudaGetErrorName(code)));
  error.op = op;  // Error::to_string prints "op: message"
  return error;
}

#define STRATA_CUDA_CHECK(expr, op)                 \
  do {                                              \
    cudaError_t strata_cuda_code_ = (expr);         \
    if (strata_cuda_code_ != cudaSuccess) return cuda_error(strata_cuda_code_, op); \
  } while (0)

class CudaStream final : public StreamBackend {
 public:
  CudaStream(const Device* owner, int ordinal, std::string name, cudaStream_t stream)
      : owner_(owner), ordinal_(ordinal), name_(std::move(name)), stream_(stream) {}
  ~CudaStream() override {
    cudaSetDevice(ordinal_);
    cudaStreamSynchronize(stream_);  // destroying must not cut enqueued work short
    cudaStreamDestroy(stream_);
  }
  const std::string& name() const override { return name_; }
  void* native_handle() const override { return stream_; }
  const Device* owner() const override { return owner_; }
  cudaStream_t stream() const { return stream_; }

 private:
  const Device* owner_;
  int ordinal_;
  std::string name_;
  cudaStream_t stream_;
};

class CudaEvent final : public EventBackend {
 public:
  CudaEvent(const Device* owner, cudaEvent_t event) : owner_(owner), event_(event) {}
  ~CudaEvent() override { cudaEventDestroy(event_); }
  const Device* owner() const override { return owner_; }
  cudaEvent_t event() const { return event_; }

 private:
  const Device* owner_;
  cudaEvent_t event_;
};

class CudaDevice final : public Device {
 public:
  CudaDevice(int ordinal, void* region, uint64_t budget_bytes)
      : Device(budget_bytes, region), ordinal_(ordinal), region_(region) {}
  ~CudaDevice() override {
    cudaSetDevice(ordinal_);
    cudaDeviceSynchronize();
    cudaFree(region_);
  }

  Kind kind() const override { return Kind::cuda; }
  std::string describe() const override {
    cudaDeviceProp props{};
    cudaGetDeviceProperties(&props, ordinal_);
    return fmt::format("cuda:{} {} ({} arena)", ordinal_, props.name, format_size(budget_bytes()));
  }

  Result<Stream> create_stream(std::string name) override {
    STRATA_CUDA_CHECK(cudaSetDevice(ordinal_), "cudaSetDevice");
    cudaStream_t stream = nullptr;
    STRATA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    return Stream(std::make_unique<CudaStream>(this, ordinal_, std::move(name), stream));
  }
  Result<Event> create_event() override {
    STRATA_CUDA_CHECK(cudaSetDevice(ordinal_), "cudaSetDevice");
    cudaEvent_t event = nullptr;
    STRATA_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate");
    return Event(std::make_unique<CudaEvent>(this, event));
  }
  Status record(Event& event, Stream& stream) override {
    STRATA_CUDA_CHECK(cudaEventRecord(own(event), own(stream)), "cudaEventRecord");
    return Status();
  }
  Status wait(Event& event) override {
    STRATA_CUDA_CHECK(cudaEventSynchronize(own(event)), "cudaEventSynchronize");
    return Status();
  }
  Result<bool> query(Event& event) override {
    cudaError_t code = cudaEventQuery(own(event));
    if (code == cudaSuccess) return true;
    if (code == cudaErrorNotReady) return false;
    return cuda_error(code, "cudaEventQuery");
  }
  Status stream_wait(Stream& stream, Event& event) override {
    STRATA_CUDA_CHECK(cudaStreamWaitEvent(own(stream), own(event), 0), "cudaStreamWaitEvent");
    return Status();
  }
  Status synchronize(Stream& stream) override {
    STRATA_CUDA_CHECK(cudaStreamSynchronize(own(stream)), "cudaStreamSynchronize");
    return Status();
  }

  Status copy_to_device(Stream& stream, void* device_dst, const void* host_src,
                        uint64_t size_bytes) override {
    STRATA_CUDA_CHECK(cudaMemcpyAsync(device_dst, host_src, size_bytes, cudaMemcpyHostToDevice, own(stream)),
                      "cudaMemcpyAsync(host→device)");
    return Status();
  }
  Status copy_to_host(Stream& stream, void* host_dst, const void* device_src,
                      uint64_t size_bytes) override {
    STRATA_CUDA_CHECK(cudaMemcpyAsync(host_dst, device_src, size_bytes, cudaMemcpyDeviceToHost, own(stream)),
                      "cudaMemcpyAsync(device→host)");
    return Status();
  }
  Status copy_on_device(Stream& stream, void* device_dst, const void* device_src,
                        uint64_t size_bytes) override {
    STRATA_CUDA_CHECK(cudaMemcpyAsync(device_dst, device_src, size_bytes, cudaMemcpyDeviceToDevice, own(stream)),
                      "cudaMemcpyAsync(device→device)");
    return Status();
  }
  Status launch(Stream& stream, std::function<void()> fn) override {
    // The callback owns its function object and frees it after running: one small heap node
    // per host callback, which on CUDA is rare (compute runs as kernels, not callbacks).
    auto* heap_fn = new std::function<void()>(std::move(fn));
    cudaError_t code = cudaLaunchHostFunc(
        own(stream),
        [](void* user) {
          auto* f = static_cast<std::function<void()>*>(user);
          (*f)();
          delete f;
        },
        heap_fn);
    if (code != cudaSuccess) {
      delete heap_fn;
      return cuda_error(code, "cudaLaunchHostFunc");
    }
    return Status();
  }
  Status bind_thread() override {
    STRATA_CUDA_CHECK(cudaSetDevice(ordinal_), "cudaSetDevice");
    return Status();
  }
  Status register_host_memory(void* base, uint64_t size_bytes) override {
    // Memory from cudaHostAlloc (the pinned arena of a CUDA run) is pinned already, and CUDA 13
    // answers cudaHostRegister on it with cudaErrorInvalidValue, not AlreadyRegistered (seen on
    // the first H100 run): ask what the pointer is first, and register only pageable memory.
    if (is_pinned_by_cuda(base)) return Status();
    cudaError_t code = cudaHostRegister(base, size_bytes, cudaHostRegisterDefault);
    if (code == cudaErrorHostMemoryAlreadyRegistered) {
      cudaGetLastError();
      return Status();
    }
    STRATA_CUDA_CHECK(code, "cudaHostRegister");
    return Status();
  }
  void unregister_host_memory(void* base) override {
    // Fails on cudaHostAlloc memory, which was never registered here: cleared, not an error.
    if (cudaHostUnregister(base) != cudaSuccess) cudaGetLastError();
  }

 private:
  // True for memory CUDA pinned itself: cudaHostAlloc's, whose host pointer is its own base.
  // Registered memory reports cudaMemoryTypeHost too, but register_host_memory's callers
  // register a region once, so telling the two apart is not needed there.
  static bool is_pinned_by_cuda(void* base) {
    cudaPointerAttributes attributes{};
    if (cudaPointerGetAttributes(&attributes, base) != cudaSuccess) {
      cudaGetLastError();  // pageable memory on older runtimes: an error, not a type
      return false;
    }
    return attributes.type == cudaMemoryTypeHost;
  }
  cudaStream_t own(Stream& stream) const {
    assert(stream.valid() && stream.backend().owner() == this);
    return static_cast<CudaStream&>(stream.backend()).stream();
  }
  cudaEvent_t own(Event& event) const {
    assert(event.valid() && event.backend().owner() == this);
    return static_cast<CudaEvent&>(event.backend()).event();
  }

  int ordinal_;
  void* region_;
};

}  // namespace

int cuda_device_count_impl() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // no driver or no GPU: clear the sticky error, report none
    return 0;
  }
  return count;
}

Result<int> cuda_device_count_checked_impl() {
  int count = 0;
  const cudaError_t code = cudaGetDeviceCount(&count);
  if (code == cudaErrorNoDevice || code == cudaErrorInsufficientDriver) {
    cudaGetLastError();
    return 0;
  }
  STRATA_CUDA_CHECK(code, "cudaGetDeviceCount");
  return count;
}

Result<std::unique_ptr<Device>> make_cuda_device(uint64_t budget_bytes, int ordinal) {
  const int count = cuda_device_count_impl();
  if (ordinal < 0 || ordinal >= count)
    return make_error(ErrorKind::unsupported,
                      fmt::format("cuda device {} requested but this machine shows {} CUDA device(s)", ordinal, count));
  STRATA_CUDA_CHECK(cudaSetDevice(ordinal), "cudaSetDevice");
  // Asked after cudaSetDevice, so the context this process now holds is already counted out.
  size_t free_bytes = 0, total_bytes = 0;
  STRATA_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
  const uint64_t usable_bytes = free_bytes > kCudaHeadroomBytes ? free_bytes - kCudaHeadroomBytes : 0;
  if (budget_bytes > usable_bytes)
    return make_error(ErrorKind::invalid_argument,
                      fmt::format("device.memory is {} but cuda:{} has {} free (of {}), less the {} kept beside the "
                                  "arena for cuBLAS's workspace, NCCL's buffers and the kernels' modules: set "
                                  "device.memory to at most {}",
                                  format_size(budget_bytes), ordinal, format_size(free_bytes),
                                  format_size(total_bytes), format_size(kCudaHeadroomBytes),
                                  format_size(usable_bytes)));
  void* region = nullptr;
  cudaError_t code = cudaMalloc(&region, budget_bytes);
  if (code != cudaSuccess) {
    Error error = cuda_error(code, "cudaMalloc");
    error.message = fmt::format("cannot reserve the {} device arena on cuda:{}: {}", format_size(budget_bytes),
                                ordinal, error.message);
    return error;
  }
  return std::unique_ptr<Device>(std::make_unique<CudaDevice>(ordinal, region, budget_bytes));
}

}  // namespace strata::device
