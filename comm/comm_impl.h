// strata/comm/comm_impl.h — internals shared by the communicator implementations (not for
// callers: they use comm/comm.h).
#pragma once

#include <cstdint>
#include <memory>

#include "comm/comm.h"

namespace strata::comm::detail {

// acc[i] = blocks[0][i] + blocks[1][i] + … in rank order: the one summation order of comm/.
template <typename T>
void sum_in_rank_order(const T* blocks, uint64_t count, int ranks, T* out) {
  for (uint64_t i = 0; i < count; ++i) {
    T acc = blocks[i];
    for (int r = 1; r < ranks; ++r) acc += blocks[static_cast<uint64_t>(r) * count + i];
    out[i] = acc;
  }
}

[[nodiscard]] Result<std::unique_ptr<Communicator>> make_mpi_communicator(const CommOptions& options);

}  // namespace strata::comm::detail
