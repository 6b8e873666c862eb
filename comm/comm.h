// strata/comm/comm.h — collectives between the ranks of one job: the one small interface the
// trainer's ZeRO partitioning (train/zero/zero.h) talks to, over MPI (CPU ranks) or NCCL (GPUs).
//
// Launch. A job started by Open MPI's `mpirun -np N` (OMPI_COMM_WORLD_SIZE in the environment:
// `launched_by_mpirun`, read once by the CLI and handed down) gets an MPI communicator over
// MPI_COMM_WORLD; anything else — a plain `strata train`, a test, a sanitizer build — gets a
// one-rank communicator that never calls MPI_Init, so single-process runs are unchanged and
// `mpirun -np 1` computes exactly what a plain run does.
//
// Determinism. Every floating-point reduction here sums the ranks' contributions in rank order
// (acc = x_0; acc += x_1; …), whatever the transport: the MPI implementation moves the blocks
// with MPI_Alltoall / MPI_Gather / MPI_Allgather (pure data movement) and adds them itself, never
// MPI_SUM, whose order depends on Open MPI's algorithm choice. A run is therefore bit-identical
// run to run for the same N, and every rank ends with the same bits.
//
// Ownership and lifetimes. A Communicator is move-free and owned by one unique_ptr; the MPI one
// calls MPI_Finalize in its destructor (MPI_Init once per process: make at most one). Buffers
// are the caller's and must stay valid until the call returns (blocking forms) or until `wait`
// returned (async forms). Staging for the ordered sums is grown to the largest call and kept.
//
// Threads. One thread at a time calls a communicator (MPI_THREAD_SERIALIZED). The async
// allgather may be left in flight while the caller computes; `wait` completes it.
//
// Failure. A lost rank must never hang the others: every blocking wait is bounded by
// `timeout_s` — past it the rank prints ONE line naming the operation and the ranks it was
// waiting for and exits the process (exit code 75), since MPI cannot be used after a peer
// died. Open MPI's launcher also tears the job down when a rank dies, naming the rank.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "common/status.h"

namespace strata::comm {

// Bytes moved by this rank and time spent waiting in collectives, since creation.
struct CommStats {
  uint64_t sent_bytes = 0;
  uint64_t received_bytes = 0;
  uint64_t calls = 0;
  uint64_t wait_ns = 0;
};

// A collective left in flight by an async call; completed by Communicator::wait exactly once.
struct Request {
  uint64_t id = 0;
};

struct CommOptions {
  bool use_mpi = false;      // launched_by_mpirun(): MPI over MPI_COMM_WORLD; else one rank
  double timeout_s = 120.0;  // a blocking collective waiting longer means a rank was lost
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const char* transport() const = 0;  // "local", "mpi", "nccl"

  // In place: every rank ends with the rank-ordered sum of every rank's `data`.
  [[nodiscard]] virtual Status allreduce_sum(std::span<float> data) = 0;
  [[nodiscard]] virtual Status allreduce_sum(std::span<double> data) = 0;
  // `send` holds size() blocks of `block_count` floats; rank r's `recv` gets the rank-ordered
  // sum of every rank's block r (ZeRO's gradient reduce-scatter).
  [[nodiscard]] virtual Status reduce_scatter_block(const float* send, float* recv, uint64_t block_count) = 0;
  // In place at `root`: it ends with the rank-ordered sum of `data`; other ranks' `data` are
  // left as they were (a reduce-scatter into an owner that holds a whole range).
  [[nodiscard]] virtual Status reduce_sum(float* data, uint64_t count, int root) = 0;
  // Rank r's `send` (block_bytes) lands at recv + r·block_bytes on every rank.
  [[nodiscard]] virtual Status allgather(const void* send, void* recv, uint64_t block_bytes) = 0;
  [[nodiscard]] virtual Status broadcast(void* data, uint64_t size_bytes, int root) = 0;
  [[nodiscard]] virtual Status barrier() = 0;

  // The allgather left in flight (stage 3's gather of the next unit while this one computes):
  // the buffers stay untouched until wait() returns.
  [[nodiscard]] virtual Result<Request> allgather_async(const void* send, void* recv, uint64_t block_bytes) = 0;
  [[nodiscard]] virtual Status wait(Request request) = 0;
  // In place, left in flight (ZeRO stage 3's parameter gather): rank r's block of
  // counts_bytes[r] bytes already sits at data + displs_bytes[r] on rank r; after wait() every
  // rank has every block at its displacement. Counts may differ (and be 0). Both spans are
  // copied: the caller's arrays may go away. A transport without it says `unsupported`.
  [[nodiscard]] virtual Result<Request> allgatherv_inplace_async(void* data, std::span<const uint64_t> counts_bytes,
                                                                 std::span<const uint64_t> displs_bytes);

  CommStats stats() const { return stats_; }

 protected:
  CommStats stats_;
};

// True when Open MPI's launcher started this process (OMPI_COMM_WORLD_SIZE is set). Read once,
// at the top of the CLI; nothing below reads the environment.
bool launched_by_mpirun();
// This process's rank as Open MPI's launcher numbered it (OMPI_COMM_WORLD_RANK), 0 when not
// launched by it: what the CLI needs before MPI_Init (one rank prints a config error every
// rank meets; the live metrics carry the rank).
int launched_rank();

// The job's communicator: MPI when options.use_mpi (an error when this build has no MPI),
// else one rank. At most one per process.
[[nodiscard]] Result<std::unique_ptr<Communicator>> make_world_communicator(const CommOptions& options);

// The one-rank communicator alone (tests; a plain run).
std::unique_ptr<Communicator> make_local_communicator();

// NCCL between the GPUs of the ranks of `bootstrap` (one GPU per rank, cudaSetDevice(local
// rank % GPUs)), its ncclUniqueId sent over `bootstrap`'s broadcast. Collectives take DEVICE
// pointers and run on the communicator's own stream, waited for before returning. `unsupported`
// when this build has no NCCL, libnccl is not found on this machine, or no GPU is visible.
// `bootstrap` may be the one-rank communicator (one GPU, no MPI).
[[nodiscard]] Result<std::unique_ptr<Communicator>> make_nccl_communicator(Communicator& bootstrap);

// Where this process finds libnccl (loaded at run time: common/runtime_library.h): "PATH (NCCL
// x.y.z)", or `unsupported` naming the places searched, or that this build has no NCCL.
[[nodiscard]] Result<std::string> find_nccl_library();

}  // namespace strata::comm
