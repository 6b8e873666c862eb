// Proves comm/'s collectives on however many ranks launched it (mpirun -np 1/2/3, or plainly:
// the one-rank communicator): each rank stamps its data with (rank, index) so a misplaced or
// dropped block shows, and every floating-point result is compared bit for bit with the
// rank-ordered sum computed here independently — the determinism comm/comm.h promises.
// With "nccl" as argument it makes an NCCL communicator over the same ranks (one rank needs no
// MPI: one GPU) and checks a real all-reduce on device buffers against the exact sum (small
// integers, exact in fp32 in any order). Exit 77 only where no GPU is visible or this build has
// no NCCL; NCCL missing on a machine with a GPU, or any CUDA/NCCL error, fails.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "strata_build_config.h"

#if STRATA_HAVE_NCCL
#include <cuda_runtime.h>
#endif

namespace {

int failures = 0;
int my_rank = 0;

void expect(bool ok, const std::string& what) {
  if (!ok) {
    std::fprintf(stderr, "rank %d: FAIL %s\n", my_rank, what.c_str());
    ++failures;
  }
}

// Values whose sum depends on the order of addition in fp32 (mixed magnitudes), so a transport
// that summed in another order would not match bit for bit.
float value(int rank, uint64_t i) {
  return static_cast<float>((rank + 1) * 1.0e-3 + std::sin(static_cast<double>(i)) * std::pow(10.0, rank % 3));
}

float ordered_sum(int ranks, uint64_t i) {
  float acc = value(0, i);
  for (int r = 1; r < ranks; ++r) acc += value(r, i);
  return acc;
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

void check(strata::comm::Communicator& comm) {
  const int n = comm.size();
  const int r = comm.rank();
  // allreduce, fp32: a count not divisible by N (padding path).
  {
    std::vector<float> data(1001);
    for (uint64_t i = 0; i < data.size(); ++i) data[i] = value(r, i);
    expect(comm.allreduce_sum(data).ok(), "allreduce f32 status");
    bool ok = true;
    for (uint64_t i = 0; i < data.size(); ++i) ok &= same_bits(data[i], ordered_sum(n, i));
    expect(ok, "allreduce f32 equals the rank-ordered sum bit for bit");
  }
  // allreduce, f64 (the loss and the squared norm).
  {
    std::vector<double> data = {static_cast<double>(r) + 0.5, 1.0e-9 * r};
    expect(comm.allreduce_sum(data).ok(), "allreduce f64 status");
    double expected0 = 0.5, expected1 = 0.0;
    for (int q = 1; q < n; ++q) expected0 += q + 0.5, expected1 += 1.0e-9 * q;
    expect(data[0] == expected0 && data[1] == expected1, "allreduce f64 values");
  }
  // reduce_scatter_block: rank q gets the sum of everyone's block q.
  {
    const uint64_t block = 37;
    std::vector<float> send(block * n), recv(block, -1.0f);
    for (uint64_t i = 0; i < send.size(); ++i) send[i] = value(r, i);
    expect(comm.reduce_scatter_block(send.data(), recv.data(), block).ok(), "reduce_scatter status");
    bool ok = true;
    for (uint64_t i = 0; i < block; ++i) ok &= same_bits(recv[i], ordered_sum(n, block * r + i));
    expect(ok, "reduce_scatter_block equals the rank-ordered sum of block rank");
  }
  // reduce_sum to the last rank; others keep their data.
  {
    std::vector<float> data(99);
    for (uint64_t i = 0; i < data.size(); ++i) data[i] = value(r, i);
    const int root = n - 1;
    expect(comm.reduce_sum(data.data(), data.size(), root).ok(), "reduce status");
    bool ok = true;
    for (uint64_t i = 0; i < data.size(); ++i) ok &= same_bits(data[i], r == root ? ordered_sum(n, i) : value(r, i));
    expect(ok, "reduce_sum at the root; untouched elsewhere");
  }
  // allgather (blocking, async, and in place), byte-exact with odd sizes.
  {
    const uint64_t block_bytes = 13;
    std::vector<unsigned char> send(block_bytes), recv(block_bytes * n, 0);
    for (uint64_t i = 0; i < block_bytes; ++i) send[i] = static_cast<unsigned char>(r * 31 + i);
    expect(comm.allgather(send.data(), recv.data(), block_bytes).ok(), "allgather status");
    bool ok = true;
    for (int q = 0; q < n; ++q)
      for (uint64_t i = 0; i < block_bytes; ++i) ok &= recv[q * block_bytes + i] == static_cast<unsigned char>(q * 31 + i);
    expect(ok, "allgather places block q at q");
    std::vector<unsigned char> inplace(block_bytes * n, 0);
    std::memcpy(inplace.data() + block_bytes * r, send.data(), block_bytes);
    auto request = comm.allgather_async(inplace.data() + block_bytes * r, inplace.data(), block_bytes);
    expect(request.ok(), "allgather_async status");
    if (request.ok()) expect(comm.wait(*request).ok(), "wait status");
    expect(inplace == recv, "in-place async allgather equals the blocking one");
  }
  // broadcast from rank 1 (rank 0 with one rank).
  {
    const int root = n > 1 ? 1 : 0;
    std::vector<uint64_t> data(5, static_cast<uint64_t>(r));
    if (r == root)
      for (uint64_t i = 0; i < data.size(); ++i) data[i] = 1000 + i;
    expect(comm.broadcast(data.data(), data.size() * 8, root).ok(), "broadcast status");
    bool ok = true;
    for (uint64_t i = 0; i < data.size(); ++i) ok &= data[i] == 1000 + i;
    expect(ok, "broadcast reaches every rank");
  }
  expect(comm.barrier().ok(), "barrier");
  if (n > 1) {
    const strata::comm::CommStats stats = comm.stats();
    expect(stats.sent_bytes > 0 && stats.received_bytes > 0 && stats.calls > 0, "bytes and calls are counted");
  }
}

}  // namespace

int main(int argc, char** argv) {
  const bool nccl = argc > 1 && std::string(argv[1]) == "nccl";
  strata::comm::CommOptions options;
  options.use_mpi = strata::comm::launched_by_mpirun();
  options.timeout_s = 60;
  auto world = strata::comm::make_world_communicator(options);
  if (!world.ok()) {
    std::fprintf(stderr, "%s\n", world.error().to_string().c_str());
    return 1;
  }
  my_rank = (*world)->rank();
  if (!nccl) {
    check(**world);
  } else {
#if !STRATA_HAVE_NCCL
    std::fprintf(stderr, "skip: this build has no NCCL (needs CUDA and nccl.h at setup)\n");
    return 77;
#else
    int devices = 0;
    const cudaError_t probe = cudaGetDeviceCount(&devices);
    if (probe == cudaErrorNoDevice || probe == cudaErrorInsufficientDriver || (probe == cudaSuccess && devices == 0)) {
      std::fprintf(stderr, "skip: no CUDA device (%s)\n", cudaGetErrorString(probe));
      return 77;
    }
    if (probe != cudaSuccess) {
      std::fprintf(stderr, "cudaGetDeviceCount failed: %s\n", cudaGetErrorString(probe));
      return 1;
    }
    auto gpu = strata::comm::make_nccl_communicator(**world);
    if (!gpu.ok()) {
      std::fprintf(stderr, "%s\n", gpu.error().to_string().c_str());
      return 1;
    }
    expect((*gpu)->size() == (*world)->size(), "nccl size");
    // Rank r holds r + 1 + (i % 7): the sum over n ranks is n(n+1)/2 + n(i % 7), exact in fp32.
    constexpr uint64_t kCount = 1 << 20;  // 4 MiB: past NCCL's small-message protocol
    std::vector<float> host(kCount);
    for (uint64_t i = 0; i < kCount; ++i) host[i] = static_cast<float>(my_rank + 1 + static_cast<int>(i % 7));
    float* device = nullptr;
    if (cudaMalloc(&device, kCount * sizeof(float)) != cudaSuccess ||
        cudaMemcpy(device, host.data(), kCount * sizeof(float), cudaMemcpyHostToDevice) != cudaSuccess) {
      std::fprintf(stderr, "cudaMalloc/cudaMemcpy of %llu floats failed\n", static_cast<unsigned long long>(kCount));
      return 1;
    }
    const strata::Status reduced = (*gpu)->allreduce_sum(std::span<float>(device, kCount));
    expect(reduced.ok(), "nccl allreduce status: " + (reduced.ok() ? std::string("ok") : reduced.error().to_string()));
    expect(cudaMemcpy(host.data(), device, kCount * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess,
           "copy back");
    const int n = (*world)->size();
    uint64_t wrong = 0;
    for (uint64_t i = 0; i < kCount; ++i)
      wrong += host[i] != static_cast<float>(n * (n + 1) / 2 + n * static_cast<int>(i % 7)) ? 1 : 0;
    expect(wrong == 0, "nccl allreduce: " + std::to_string(wrong) + " of " + std::to_string(kCount) + " sums wrong");
    (void)cudaFree(device);
#endif
  }
  if (failures == 0) std::fprintf(stderr, "rank %d of %d (%s): all collectives passed\n", my_rank, (*world)->size(),
                                  (*world)->transport());
  return failures == 0 ? 0 : 1;
}
