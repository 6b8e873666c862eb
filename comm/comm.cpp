// The one-rank communicator, the launcher check and the dispatch to MPI (comm/comm.h).
#include "comm/comm.h"

#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "comm/comm_impl.h"
#include "strata_build_config.h"

namespace strata::comm {
namespace {

// One rank: every collective is the identity (a sum over one rank is its own value, bit for
// bit), so a plain run computes exactly what it did before comm/ existed.
class LocalCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const char* transport() const override { return "local"; }
  Status allreduce_sum(std::span<float>) override { return Status(); }
  Status allreduce_sum(std::span<double>) override { return Status(); }
  Status reduce_scatter_block(const float* send, float* recv, uint64_t block_count) override {
    if (send != recv) std::memmove(recv, send, block_count * sizeof(float));
    return Status();
  }
  Status reduce_sum(float*, uint64_t, int) override { return Status(); }
  Status allgather(const void* send, void* recv, uint64_t block_bytes) override {
    if (send != recv) std::memmove(recv, send, block_bytes);
    return Status();
  }
  Status broadcast(void*, uint64_t, int) override { return Status(); }
  Status barrier() override { return Status(); }
  Result<Request> allgather_async(const void* send, void* recv, uint64_t block_bytes) override {
    STRATA_RETURN_IF_ERROR(allgather(send, recv, block_bytes));
    return Request{0};
  }
  Status wait(Request) override { return Status(); }
  // One rank: its block is already in place.
  Result<Request> allgatherv_inplace_async(void*, std::span<const uint64_t>, std::span<const uint64_t>) override {
    return Request{0};
  }
};

}  // namespace

Result<Request> Communicator::allgatherv_inplace_async(void*, std::span<const uint64_t>, std::span<const uint64_t>) {
  return make_error(ErrorKind::unsupported, fmt::format("comm: the {} transport has no allgatherv", transport()));
}

bool launched_by_mpirun() { return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr; }

int launched_rank() {
  const char* text = std::getenv("OMPI_COMM_WORLD_RANK");
  return text == nullptr ? 0 : std::atoi(text);
}

std::unique_ptr<Communicator> make_local_communicator() { return std::make_unique<LocalCommunicator>(); }

Result<std::unique_ptr<Communicator>> make_world_communicator(const CommOptions& options) {
  if (!options.use_mpi) return make_local_communicator();
#if STRATA_HAVE_MPI
  return detail::make_mpi_communicator(options);
#else
  return make_error(ErrorKind::unsupported,
                    "this process was started by mpirun but strata was built without MPI (install "
                    "libopenmpi-dev and run meson setup again)");
#endif
}

#if !STRATA_HAVE_NCCL
Result<std::unique_ptr<Communicator>> make_nccl_communicator(Communicator&) {
  return make_error(ErrorKind::unsupported, "this build has no NCCL (needs CUDA and nccl.h at setup)");
}
Result<std::string> find_nccl_library() {
  return make_error(ErrorKind::unsupported, "this build has no NCCL (needs CUDA and nccl.h at setup)");
}
#endif

}  // namespace strata::comm
