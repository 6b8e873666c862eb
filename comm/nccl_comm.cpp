// The NCCL communicator (comm/comm.h): collectives between GPUs, one per rank, on a stream of
// its own; the ncclUniqueId travels over the bootstrap communicator (MPI, or the one-rank
// communicator for a single GPU). Built whenever CUDA is and nccl.h is found; tests/comm skips it
// (77) without a GPU.
//
// libnccl is loaded at run time, like cuBLAS (kernels/cuda/cublas_loader.cpp): it is 213 MB,
// never travels with a strata bundle (scripts/gpu-bundle.sh), and lives on a GPU machine in the
// CUDA toolkit or in PyTorch's nvidia-nccl wheel (common/runtime_library.h searches both). The
// forwarders below take nccl.h's exact declarations (a drifting signature is a compile error);
// a process that never makes an NCCL communicator never opens the library, and one that does on
// a machine without NCCL gets one error line at creation naming the places searched.
#include <dlfcn.h>

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdint>
#include <cstring>

#include <fmt/format.h>

#include "comm/comm_impl.h"
#include "common/log.h"
#include "common/runtime_library.h"

namespace strata::comm {
namespace {

#define STRATA_NCCL_STRINGIFY_INNER(x) #x
#define STRATA_NCCL_STRINGIFY(x) STRATA_NCCL_STRINGIFY_INNER(x)

// The library of the major version nccl.h describes (the ABI the forwarders were compiled for).
const RuntimeLibrary& nccl_library() {
  static const RuntimeLibrary library = open_runtime_library("libnccl.so." STRATA_NCCL_STRINGIFY(NCCL_MAJOR));
  return library;
}

}  // namespace

Result<std::string> find_nccl_library() {
  const RuntimeLibrary& library = nccl_library();
  if (library.handle == nullptr)
    return make_error(ErrorKind::unsupported,
                      "NCCL not found (tried " + library.tried +
                          "); install the CUDA toolkit's NCCL or the nvidia-nccl wheel, or put its lib folder on "
                          "LD_LIBRARY_PATH");
  int version = 0;
  if (ncclGetVersion(&version) != ncclSuccess) return make_error(ErrorKind::internal, "NCCL: ncclGetVersion failed");
  // NCCL_VERSION_CODE since 2.9: major*10000 + minor*100 + patch.
  return fmt::format("{} (NCCL {}.{}.{})", library.path, version / 10000, version / 100 % 100, version % 100);
}

}  // namespace strata::comm

namespace {

template <typename Fn>
Fn resolve_nccl(const char* name) {
  void* library = strata::comm::nccl_library().handle;
  return library == nullptr ? nullptr : reinterpret_cast<Fn>(dlsym(library, name));
}

}  // namespace

// ncclSystemError when the library or the symbol is missing: find_nccl_library, called first by
// make_nccl_communicator, has already said which.
#define STRATA_NCCL_FORWARD(name, params, args)                     \
  extern "C" ncclResult_t name params {                             \
    static const auto fn = resolve_nccl<decltype(&name)>(#name);    \
    return fn == nullptr ? ncclSystemError : fn args;               \
  }

STRATA_NCCL_FORWARD(ncclGetVersion, (int* version), (version))
STRATA_NCCL_FORWARD(ncclGetUniqueId, (ncclUniqueId * unique_id), (unique_id))
STRATA_NCCL_FORWARD(ncclCommInitRank, (ncclComm_t * comm, int nranks, ncclUniqueId comm_id, int rank),
                    (comm, nranks, comm_id, rank))
STRATA_NCCL_FORWARD(ncclCommDestroy, (ncclComm_t comm), (comm))
STRATA_NCCL_FORWARD(ncclGroupStart, (), ())
STRATA_NCCL_FORWARD(ncclGroupEnd, (), ())
STRATA_NCCL_FORWARD(ncclAllReduce,
                    (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                     ncclComm_t comm, cudaStream_t stream),
                    (sendbuff, recvbuff, count, datatype, op, comm, stream))
STRATA_NCCL_FORWARD(ncclReduceScatter,
                    (const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype, ncclRedOp_t op,
                     ncclComm_t comm, cudaStream_t stream),
                    (sendbuff, recvbuff, recvcount, datatype, op, comm, stream))
STRATA_NCCL_FORWARD(ncclReduce,
                    (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                     int root, ncclComm_t comm, cudaStream_t stream),
                    (sendbuff, recvbuff, count, datatype, op, root, comm, stream))
STRATA_NCCL_FORWARD(ncclAllGather,
                    (const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype, ncclComm_t comm,
                     cudaStream_t stream),
                    (sendbuff, recvbuff, sendcount, datatype, comm, stream))
STRATA_NCCL_FORWARD(ncclBroadcast,
                    (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                     ncclComm_t comm, cudaStream_t stream),
                    (sendbuff, recvbuff, count, datatype, root, comm, stream))

// The one forwarder that returns text: a missing library has no error strings to give.
extern "C" const char* ncclGetErrorString(ncclResult_t result) {
  static const auto fn = resolve_nccl<decltype(&ncclGetErrorString)>("ncclGetErrorString");
  return fn == nullptr ? "NCCL library not loaded" : fn(result);
}

namespace strata::comm {
namespace {

Status cuda_check(cudaError_t code, const char* what) {
  if (code == cudaSuccess) return Status();
  return make_error(ErrorKind::internal, fmt::format("CUDA {} failed: {}", what, cudaGetErrorString(code)));
}
Status nccl_check(ncclResult_t code, const char* what) {
  if (code == ncclSuccess) return Status();
  return make_error(ErrorKind::io, fmt::format("NCCL {} failed: {}", what, ncclGetErrorString(code)));
}

// NCCL's own ring/tree reductions are used as they are: for a fixed N and topology they are
// deterministic run to run (NCCL_ALGO/NCCL_PROTO pinned by the environment when it matters),
// but not in rank order — the trainer's bit-identity across transports is MPI's promise only.
class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(Communicator& bootstrap) : bootstrap_(bootstrap) {}
  ~NcclCommunicator() override {
    if (comm_ != nullptr) ncclCommDestroy(comm_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  Status init() {
    Result<std::string> library = find_nccl_library();
    if (!library.ok()) return library.status();
    spdlog::info("NCCL: {}", *library);
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0)
      return make_error(ErrorKind::unsupported, "NCCL: no CUDA device is visible to this process");
    STRATA_RETURN_IF_ERROR(cuda_check(cudaSetDevice(bootstrap_.rank() % devices), "cudaSetDevice"));
    STRATA_RETURN_IF_ERROR(cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate"));
    ncclUniqueId id;
    std::memset(&id, 0, sizeof(id));
    if (bootstrap_.rank() == 0) STRATA_RETURN_IF_ERROR(nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId"));
    STRATA_RETURN_IF_ERROR(bootstrap_.broadcast(&id, sizeof(id), 0));
    return nccl_check(ncclCommInitRank(&comm_, bootstrap_.size(), id, bootstrap_.rank()), "ncclCommInitRank");
  }

  int rank() const override { return bootstrap_.rank(); }
  int size() const override { return bootstrap_.size(); }
  const char* transport() const override { return "nccl"; }

  Status allreduce_sum(std::span<float> data) override {
    return finish(ncclAllReduce(data.data(), data.data(), data.size(), ncclFloat32, ncclSum, comm_, stream_),
                  "allreduce", data.size_bytes() * 2);
  }
  Status allreduce_sum(std::span<double> data) override {
    return finish(ncclAllReduce(data.data(), data.data(), data.size(), ncclFloat64, ncclSum, comm_, stream_),
                  "allreduce", data.size_bytes() * 2);
  }
  Status reduce_scatter_block(const float* send, float* recv, uint64_t block_count) override {
    return finish(ncclReduceScatter(send, recv, block_count, ncclFloat32, ncclSum, comm_, stream_),
                  "reduce_scatter", block_count * 4);
  }
  Status reduce_sum(float* data, uint64_t count, int root) override {
    return finish(ncclReduce(data, data, count, ncclFloat32, ncclSum, root, comm_, stream_), "reduce", count * 4);
  }
  Status allgather(const void* send, void* recv, uint64_t block_bytes) override {
    return finish(ncclAllGather(send, recv, block_bytes, ncclUint8, comm_, stream_), "allgather", block_bytes);
  }
  Status broadcast(void* data, uint64_t size_bytes, int root) override {
    return finish(ncclBroadcast(data, data, size_bytes, ncclUint8, root, comm_, stream_), "broadcast", size_bytes);
  }
  Status barrier() override { return bootstrap_.barrier(); }
  Result<Request> allgather_async(const void* send, void* recv, uint64_t block_bytes) override {
    STRATA_RETURN_IF_ERROR(
        nccl_check(ncclAllGather(send, recv, block_bytes, ncclUint8, comm_, stream_), "allgather"));
    stats_.sent_bytes += block_bytes * static_cast<uint64_t>(size() - 1);
    stats_.received_bytes += block_bytes * static_cast<uint64_t>(size() - 1);
    return Request{1};
  }
  Status wait(Request) override { return cuda_check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); }
  // NCCL has no allgatherv: one broadcast per rank with a block, each root sending its own block
  // in place, fused into one launch by the group. Counts of 0 are skipped (NCCL would still
  // synchronize the ranks for them).
  Result<Request> allgatherv_inplace_async(void* data, std::span<const uint64_t> counts_bytes,
                                           std::span<const uint64_t> displs_bytes) override {
    if (counts_bytes.size() != static_cast<size_t>(size()) || displs_bytes.size() != static_cast<size_t>(size()))
      return make_error(ErrorKind::internal, "comm: allgatherv needs one count and one displacement per rank");
    auto* bytes = static_cast<uint8_t*>(data);
    uint64_t others_bytes = 0;
    STRATA_RETURN_IF_ERROR(nccl_check(ncclGroupStart(), "ncclGroupStart"));
    for (size_t r = 0; r < counts_bytes.size(); ++r) {
      if (counts_bytes[r] == 0) continue;
      if (static_cast<int>(r) != rank()) others_bytes += counts_bytes[r];
      const ncclResult_t code = ncclBroadcast(bytes + displs_bytes[r], bytes + displs_bytes[r], counts_bytes[r],
                                              ncclUint8, static_cast<int>(r), comm_, stream_);
      if (code != ncclSuccess) {
        (void)ncclGroupEnd();  // close the group before reporting; the first error is the one to tell
        return nccl_check(code, "broadcast (allgatherv)");
      }
    }
    STRATA_RETURN_IF_ERROR(nccl_check(ncclGroupEnd(), "ncclGroupEnd (allgatherv)"));
    // Accounted as MPI's allgatherv: this rank's block leaves once per other rank; it takes in
    // every other rank's block.
    stats_.sent_bytes += counts_bytes[static_cast<size_t>(rank())] * static_cast<uint64_t>(size() - 1);
    stats_.received_bytes += others_bytes;
    return Request{1};
  }

 private:
  // Counts a rank's share of the traffic by ZeRO's accounting ((N−1)/N of `unit_bytes` per
  // direction per pass) and waits for the stream.
  Status finish(ncclResult_t code, const char* what, uint64_t unit_bytes) {
    STRATA_RETURN_IF_ERROR(nccl_check(code, what));
    ++stats_.calls;
    const uint64_t share = unit_bytes * static_cast<uint64_t>(size() - 1) / static_cast<uint64_t>(size());
    stats_.sent_bytes += share;
    stats_.received_bytes += share;
    return cuda_check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }

  Communicator& bootstrap_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
};

}  // namespace

Result<std::unique_ptr<Communicator>> make_nccl_communicator(Communicator& bootstrap) {
  auto comm = std::make_unique<NcclCommunicator>(bootstrap);
  STRATA_RETURN_IF_ERROR(comm->init());
  return std::unique_ptr<Communicator>(std::move(comm));
}

}  // namespace strata::comm
