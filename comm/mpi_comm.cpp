// The MPI communicator (comm/comm.h): Open MPI over MPI_COMM_WORLD for CPU ranks. Data moves
// with non-blocking MPI collectives polled against a deadline (a lost rank cannot hang us);
// floating-point sums are done here, in rank order, never by MPI_SUM.
// The C API only: Open MPI's deprecated C++ bindings would come with <mpi.h> otherwise.
#define OMPI_SKIP_MPICXX 1
#include <mpi.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include "comm/comm_impl.h"

namespace strata::comm::detail {
namespace {

using Clock = std::chrono::steady_clock;

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(const CommOptions& options) : timeout_s_(options.timeout_s) {}
  ~MpiCommunicator() override {
    if (initialized_) MPI_Finalize();
  }

  Status init() {
    int provided = 0;
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
      return make_error(ErrorKind::internal, "MPI_Init_thread failed");
    initialized_ = true;
    if (provided < MPI_THREAD_SERIALIZED)
      return make_error(ErrorKind::unsupported, "this MPI does not give MPI_THREAD_SERIALIZED");
    // Errors come back as codes (turned into one line here), not MPI's default abort.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    return Status();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* transport() const override { return "mpi"; }

  Status allreduce_sum(std::span<float> data) override { return allreduce(data.data(), data.size(), MPI_FLOAT); }
  Status allreduce_sum(std::span<double> data) override { return allreduce(data.data(), data.size(), MPI_DOUBLE); }

  Status reduce_scatter_block(const float* send, float* recv, uint64_t block_count) override {
    // Block r of every rank goes to rank r (all-to-all), which adds them in rank order.
    const uint64_t n = static_cast<uint64_t>(size_);
    std::vector<float>& staging = staging_f32(block_count * n);
    STRATA_RETURN_IF_ERROR(alltoall(send, staging.data(), block_count * sizeof(float), "reduce_scatter_block"));
    sum_in_rank_order(staging.data(), block_count, size_, recv);
    return Status();
  }

  Status reduce_sum(float* data, uint64_t count, int root) override {
    std::vector<float>& staging = staging_f32(rank_ == root ? count * static_cast<uint64_t>(size_) : 0);
    MPI_Request request = MPI_REQUEST_NULL;
    STRATA_RETURN_IF_ERROR(check(MPI_Igather(data, bytes_int(count * 4), MPI_BYTE, staging.data(), bytes_int(count * 4),
                                             MPI_BYTE, root, MPI_COMM_WORLD, &request),
                                 "reduce"));
    STRATA_RETURN_IF_ERROR(complete(request, "reduce"));
    if (rank_ == root) {
      sum_in_rank_order(staging.data(), count, size_, data);
      stats_.received_bytes += count * 4 * static_cast<uint64_t>(size_ - 1);
    } else {
      stats_.sent_bytes += count * 4;
    }
    return Status();
  }

  Status allgather(const void* send, void* recv, uint64_t block_bytes) override {
    STRATA_ASSIGN_OR_RETURN(Request request, allgather_async(send, recv, block_bytes));
    return wait(request);
  }

  Status broadcast(void* data, uint64_t size_bytes, int root) override {
    MPI_Request request = MPI_REQUEST_NULL;
    STRATA_RETURN_IF_ERROR(
        check(MPI_Ibcast(data, bytes_int(size_bytes), MPI_BYTE, root, MPI_COMM_WORLD, &request), "broadcast"));
    STRATA_RETURN_IF_ERROR(complete(request, "broadcast"));
    // Counted as the data a binomial tree moves per rank on average: the root's N−1 copies
    // spread over the ranks (ZeRO's accounting of a broadcast).
    if (rank_ == root) stats_.sent_bytes += size_bytes;
    else stats_.received_bytes += size_bytes;
    return Status();
  }

  Status barrier() override {
    MPI_Request request = MPI_REQUEST_NULL;
    STRATA_RETURN_IF_ERROR(check(MPI_Ibarrier(MPI_COMM_WORLD, &request), "barrier"));
    return complete(request, "barrier");
  }

  Result<Request> allgather_async(const void* send, void* recv, uint64_t block_bytes) override {
    MPI_Request request = MPI_REQUEST_NULL;
    // In place when send already sits at this rank's slot of recv (MPI forbids aliasing).
    const void* source = send == static_cast<const char*>(recv) + block_bytes * static_cast<uint64_t>(rank_)
                             ? MPI_IN_PLACE
                             : send;
    STRATA_RETURN_IF_ERROR(check(MPI_Iallgather(source, bytes_int(block_bytes), MPI_BYTE, recv, bytes_int(block_bytes),
                                                MPI_BYTE, MPI_COMM_WORLD, &request),
                                 "allgather"));
    const uint64_t id = ++next_request_;
    pending_[id] = Pending{request, "allgather", {}, {}};
    stats_.sent_bytes += block_bytes * static_cast<uint64_t>(size_ - 1);  // a ring: N−1 hops out
    stats_.received_bytes += block_bytes * static_cast<uint64_t>(size_ - 1);
    return Request{id};
  }

  Status wait(Request request) override {
    auto found = pending_.find(request.id);
    if (found == pending_.end()) return make_error(ErrorKind::internal, "comm: wait on an unknown request");
    Pending pending = std::move(found->second);  // its count arrays live until MPI is done
    pending_.erase(found);
    return complete(pending.request, pending.what);
  }

  Result<Request> allgatherv_inplace_async(void* data, std::span<const uint64_t> counts_bytes,
                                           std::span<const uint64_t> displs_bytes) override {
    if (counts_bytes.size() != static_cast<size_t>(size_) || displs_bytes.size() != static_cast<size_t>(size_))
      return make_error(ErrorKind::internal, "comm: allgatherv needs one count and one displacement per rank");
    Pending pending{MPI_REQUEST_NULL, "allgatherv", std::vector<int>(counts_bytes.size()),
                    std::vector<int>(displs_bytes.size())};
    uint64_t others_bytes = 0;
    for (size_t r = 0; r < counts_bytes.size(); ++r) {
      pending.counts[r] = bytes_int(counts_bytes[r]);
      pending.displs[r] = bytes_int(displs_bytes[r]);
      if (static_cast<int>(r) != rank_) others_bytes += counts_bytes[r];
    }
    STRATA_RETURN_IF_ERROR(check(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_BYTE, data, pending.counts.data(),
                                                 pending.displs.data(), MPI_BYTE, MPI_COMM_WORLD, &pending.request),
                                 "allgatherv"));
    const uint64_t id = ++next_request_;
    pending_[id] = std::move(pending);
    // Ring accounting, as allgather: this rank's block leaves once per other rank; it takes in
    // every other rank's block.
    stats_.sent_bytes += counts_bytes[static_cast<size_t>(rank_)] * static_cast<uint64_t>(size_ - 1);
    stats_.received_bytes += others_bytes;
    return Request{id};
  }

 private:
  // Allreduce = reduce-scatter over N near-equal blocks (all-to-all, rank-ordered sums) then
  // allgather of the sums: 2·(N−1)/N of the data out and in per rank, like a ring allreduce.
  template <typename T>
  Status allreduce(T* data, uint64_t count, MPI_Datatype) {
    if (size_ == 1 || count == 0) return Status();
    const uint64_t n = static_cast<uint64_t>(size_);
    const uint64_t block = (count + n - 1) / n;
    std::vector<char>& padded = staging_bytes_a(block * n * sizeof(T));
    std::memset(padded.data(), 0, padded.size());
    std::memcpy(padded.data(), data, count * sizeof(T));
    std::vector<char>& received = staging_bytes_b(block * n * sizeof(T));
    STRATA_RETURN_IF_ERROR(alltoall(padded.data(), received.data(), block * sizeof(T), "allreduce"));
    T* mine = reinterpret_cast<T*>(padded.data()) + block * static_cast<uint64_t>(rank_);
    sum_in_rank_order(reinterpret_cast<const T*>(received.data()), block, size_, mine);
    STRATA_RETURN_IF_ERROR(allgather(mine, padded.data(), block * sizeof(T)));
    std::memcpy(data, padded.data(), count * sizeof(T));
    return Status();
  }

  Status alltoall(const void* send, void* recv, uint64_t block_bytes, const char* what) {
    MPI_Request request = MPI_REQUEST_NULL;
    STRATA_RETURN_IF_ERROR(check(MPI_Ialltoall(send, bytes_int(block_bytes), MPI_BYTE, recv, bytes_int(block_bytes),
                                               MPI_BYTE, MPI_COMM_WORLD, &request),
                                 what));
    STRATA_RETURN_IF_ERROR(complete(request, what));
    stats_.sent_bytes += block_bytes * static_cast<uint64_t>(size_ - 1);
    stats_.received_bytes += block_bytes * static_cast<uint64_t>(size_ - 1);
    return Status();
  }

  // Polls one request to completion. Past the deadline the job is lost (a peer died or hangs):
  // MPI cannot recover from that, so this rank says so in one line and leaves.
  Status complete(MPI_Request& request, const char* what) {
    ++stats_.calls;
    const auto start = Clock::now();
    const auto deadline = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s_));
    for (uint64_t polls = 0;; ++polls) {
      int done = 0;
      STRATA_RETURN_IF_ERROR(check(MPI_Test(&request, &done, MPI_STATUS_IGNORE), what));
      if (done) break;
      // Spin briefly (a collective between ranks on one box completes in microseconds), then
      // yield the core: ranks share cores with each other and with the compute threads.
      if (polls > 2000) std::this_thread::sleep_for(std::chrono::microseconds(50));
      if (Clock::now() > deadline) {
        std::fprintf(stderr,
                     "strata: rank %d of %d: no answer from the other ranks in %s for %.0f s — a rank was lost; "
                     "exiting (resume the job with --resume from the last global commit)\n",
                     rank_, size_, what, timeout_s_);
        std::fflush(stderr);
        ::_exit(75);
      }
    }
    stats_.wait_ns += static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count());
    return Status();
  }

  Status check(int code, const char* what) const {
    if (code == MPI_SUCCESS) return Status();
    char text[MPI_MAX_ERROR_STRING] = {};
    int length = 0;
    MPI_Error_string(code, text, &length);
    return make_error(ErrorKind::io, fmt::format("rank {} of {}: MPI {} failed: {}", rank_, size_, what, text));
  }

  static int bytes_int(uint64_t bytes) {
    // Callers move one unit or one chunk per call: far below 2 GiB (optimizer.chunk_elements
    // bounds a chunk); a larger one is a programmer error.
    if (bytes > static_cast<uint64_t>(INT32_MAX)) std::abort();
    return static_cast<int>(bytes);
  }

  std::vector<float>& staging_f32(uint64_t count) {
    if (f32_.size() < count) f32_.resize(count);
    return f32_;
  }
  std::vector<char>& staging_bytes_a(uint64_t bytes) {
    if (a_.size() < bytes) a_.resize(bytes);
    return a_;
  }
  std::vector<char>& staging_bytes_b(uint64_t bytes) {
    if (b_.size() < bytes) b_.resize(bytes);
    return b_;
  }

  double timeout_s_;
  bool initialized_ = false;
  int rank_ = 0;
  int size_ = 1;
  uint64_t next_request_ = 0;
  // A collective in flight: MPI reads the count arrays of a v-collective until it completes.
  struct Pending {
    MPI_Request request = MPI_REQUEST_NULL;
    const char* what = "";
    std::vector<int> counts, displs;
  };
  std::unordered_map<uint64_t, Pending> pending_;
  std::vector<float> f32_;
  std::vector<char> a_, b_;
};

}  // namespace

Result<std::unique_ptr<Communicator>> make_mpi_communicator(const CommOptions& options) {
  auto comm = std::make_unique<MpiCommunicator>(options);
  STRATA_RETURN_IF_ERROR(comm->init());
  return std::unique_ptr<Communicator>(std::move(comm));
}

}  // namespace strata::comm::detail
