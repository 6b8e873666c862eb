// strata/train/zero/zero_reslice.h — resuming a ZeRO run on another number of ranks (issue 15):
// `--resume` with another `mpirun -np` (or a plain `strata train` after an N-rank run) re-slices
// the committed state into the new job's stores before the trainer opens them. No conversion
// step: the config's `{rank}` template names every old rank's folder, the old N is read from the
// stores' metadata (`parallel.ranks`).
//
// What moves. The partition is by whole store tensors (train/zero/zero.h): an optimizer chunk
// [master | m | v] is one tensor, held by exactly one old store; a compute copy is one tensor per
// unit, held by every old store at stages 1 and 2. New rank r builds the plan it will train with
// (build_train_plan with the new owners) and copies each of its persistent tensors WHOLE, bytes
// and checksums verified on the read, from whichever old store holds that name; NVMe-homed
// gradients are written as zeros (they are rewritten before they are read). At stage 3 the
// compute copies are cut into shares (`params.<unit>.<c0>-<c1>`, the elements of the chunks a
// rank owns): each new share is assembled from the old shares that overlap it — their names and
// ranges from the plans the old ranks trained with — each old share read whole (checksum
// verified) and its overlapping element range copied; the cuts are chunk boundaries, so nothing
// finer than a chunk moves. A plan tensor that no old store holds, or holds with another size,
// and a share the old shares do not cover, are refused naming it.
//
// Crash safety (docs/parallel.md, "Resume on another number of ranks"). Folders: R_r is rank r's
// expanded first nvme path, its store R_r/store.
//   1. rank 0 finishes an interrupted switch (step 4) if R_0/reslice.journal exists; reconciles
//      the old stores' global commit (the newest committed step; a store that only prepared it
//      is rolled forward) and checks them against each other and the config;
//   2. each new rank r builds a complete new store in R_r/store.reslice (its data file inside
//      that folder) and commits it there — old stores are only read, and an old store's
//      committed extents stay intact while it is not written;
//   3. every rank reports success (allgather); then rank 0 writes R_0/reslice.journal (from, to,
//      step, the folders) durably: THIS is the commit point of the re-slice;
//   4. rank 0 switches every folder, idempotently: r < new N: R_r/store → R_r/store.before-reslice,
//      R_r/store.reslice → R_r/store; r ≥ new N: R_r/store → R_r/store.before-reslice (marked,
//      intact, never opened as a store again); then removes the journal.
// A kill before the journal leaves the old stores exactly as committed (the old N resumes as if
// nothing happened; the new N redoes the re-slice, discarding the partial store.reslice
// folders). A kill after it is finished by whichever job starts next (old or new N) before it
// opens anything; the old N then re-slices back. A `store.before-reslice` from an earlier
// re-slice is removed (with its data files) when its folder is switched again.
// Assumes every rank sees every rank's folder (one machine, or a shared file system): re-slicing
// reads other ranks' stores by path.
//
// Test hook: STRATA_TEST_RESLICE_KILL=POINT[:RANK] SIGKILLs that rank (default 0) at POINT —
// `copy` (new store half written), `built` (new store committed, before the journal), `journal`
// (journal written, nothing switched), `switch` (first folder switched, the others not).
//
// Threads: the caller's only; before any Run exists. Allocates one staging buffer (the largest
// tensor moved, or old share read) per rank, and at stage 3 a second of that size, where a new
// share is assembled.
#pragma once

#include <cstdint>

#include "comm/comm.h"
#include "common/status.h"
#include "run/train_config.h"
#include "run/train_plan.h"

namespace strata {

// Run by EVERY rank of the job, with the job's config as written (nvme.paths still holding
// `{rank}`), before the trainer opens its store. Does nothing but finish an interrupted switch
// when the stores were committed by this job's number of ranks, when there is no committed run,
// or without `resume` (the trainer then refuses in its usual words). Refuses in one line: an
// old rank's store missing (naming the folder), old stores at steps the global commit cannot
// reconcile, another model, precision or optimizer.chunk_elements than the stores hold.
[[nodiscard]] Status reslice_if_needed(comm::Communicator& comm, const TrainConfig& config, bool resume);

}  // namespace strata
