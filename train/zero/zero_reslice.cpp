#include "train/zero/zero_reslice.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "common/size.h"
#include "models/model_layout.h"
#include "models/model.h"
#include "train/zero/zero.h"
#include "memory/store.h"
#include "run/run_store.h"

namespace strata {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr const char* kNextFolder = "store.reslice";           // the new store while it is built
constexpr const char* kBeforeFolder = "store.before-reslice";  // an old store, switched out
constexpr const char* kJournalName = "reslice.journal";        // in R_0: the re-slice's commit point

fs::path rank_folder(const TrainConfig& config, int rank) { return fs::path(expand_rank(config.nvme_paths.front(), rank)); }

bool has_manifest(const fs::path& store_dir) {
  std::error_code error;
  return fs::exists(store_dir / memory::kStoreManifestName, error);
}

// The test hook (see the header): SIGKILL, so nothing is flushed or unwound, as in a real crash.
void maybe_stop(std::string_view point, int rank) {
  const char* hook = std::getenv("STRATA_TEST_RESLICE_KILL");
  if (hook == nullptr) return;
  std::string_view wanted(hook);
  int wanted_rank = 0;
  if (const size_t colon = wanted.find(':'); colon != std::string_view::npos) {
    wanted_rank = std::atoi(std::string(wanted.substr(colon + 1)).c_str());
    wanted = wanted.substr(0, colon);
  }
  if (wanted != point || wanted_rank != rank) return;
  std::fprintf(stderr, "strata: STRATA_TEST_RESLICE_KILL: rank %d killed at '%.*s'\n", rank,
               static_cast<int>(point.size()), point.data());
  std::fflush(stderr);
  ::raise(SIGKILL);
}

Status fsync_dir(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return make_errno_error(errno, "open", dir.string());
  const int result = ::fsync(fd);
  const int saved = errno;
  ::close(fd);
  if (result != 0) return make_errno_error(saved, "fsync", dir.string());
  return Status();
}

Status rename_durably(const fs::path& from, const fs::path& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) return make_errno_error(errno, "rename", from.string());
  return fsync_dir(to.parent_path());
}

Status remove_folder(const fs::path& path) {
  std::error_code error;
  fs::remove_all(path, error);
  if (error) return make_errno_error(error.value(), "remove", path.string());
  return Status();
}

// --- the journal and the switch (rank 0 only) -----------------------------------------------

struct Journal {
  int from_ranks = 0;
  int to_ranks = 0;
  uint64_t step = 0;
  std::vector<std::string> folders;  // R_0 … R_{max(from, to) − 1}, expanded
};

Status write_journal(const fs::path& folder, const Journal& journal) {
  const nlohmann::json j = {{"from_ranks", journal.from_ranks},
                            {"to_ranks", journal.to_ranks},
                            {"step", journal.step},
                            {"folders", journal.folders}};
  const fs::path temp = folder / (std::string(kJournalName) + ".tmp");
  const std::string text = j.dump(1) + "\n";
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return make_errno_error(errno, "create", temp.string());
  const bool written = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) && ::fsync(fd) == 0;
  const int saved = errno;
  ::close(fd);
  if (!written) return make_errno_error(saved, "write", temp.string());
  return rename_durably(temp, folder / kJournalName);
}

Result<std::optional<Journal>> read_journal(const fs::path& folder) {
  const fs::path path = folder / kJournalName;
  std::error_code error;
  if (!fs::exists(path, error)) return std::optional<Journal>();
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // Written whole to a temporary and renamed into place: one that does not parse was damaged.
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  Journal journal;
  if (!j.is_object() || !j.contains("from_ranks") || !j["from_ranks"].is_number_integer() || !j.contains("to_ranks") ||
      !j["to_ranks"].is_number_integer() || !j.contains("folders") || !j["folders"].is_array())
    return make_error(ErrorKind::corrupt,
                      fmt::format("{} does not parse: a re-slice was interrupted and its journal is damaged; the "
                                  "store folders it names must be switched by hand",
                                  path.string()));
  journal.from_ranks = j["from_ranks"].get<int>();
  journal.to_ranks = j["to_ranks"].get<int>();
  for (const auto& folder_name : j["folders"]) {
    if (!folder_name.is_string()) return make_error(ErrorKind::corrupt, fmt::format("{}: a folder is not a string", path.string()));
    journal.folders.push_back(folder_name.get<std::string>());
  }
  return std::optional<Journal>(std::move(journal));
}

// The data files a store's manifest names (empty when it does not open).
std::vector<fs::path> data_files_of(const fs::path& store_dir) {
  memory::StoreOptions options;
  options.read_only = true;
  Result<memory::Store> store = memory::Store::open(store_dir.string(), options);
  std::vector<fs::path> files;
  if (store.ok())
    for (const memory::StoreFileInfo& file : store->stats().files) files.emplace_back(file.path);
  return files;
}

// Removes a store switched out by an earlier re-slice, with its data files outside its folder —
// unless `keep` (the store about to replace it as the folder's old store) names them too. The
// folder goes first: a crash then leaves at worst an orphan data file, which the trainer's fresh
// start removes, never a store whose data is gone.
Status purge_before(const fs::path& before, const fs::path& keep) {
  std::error_code error;
  if (!fs::exists(before, error)) return Status();
  const std::vector<fs::path> files = data_files_of(before);
  std::set<fs::path> kept;
  for (const fs::path& file : data_files_of(keep)) kept.insert(file.lexically_normal());
  STRATA_RETURN_IF_ERROR(remove_folder(before));
  for (const fs::path& file : files) {
    const fs::path normal = file.lexically_normal();
    if (kept.count(normal) != 0 || normal.parent_path() == before.lexically_normal()) continue;
    fs::remove(normal, error);
    if (error) return make_errno_error(error.value(), "remove", normal.string());
  }
  return fsync_dir(before.parent_path());
}

// Step 4 of the header, safe to redo from any point: a folder whose store.reslice is gone was
// switched already.
Status switch_folders(const Journal& journal) {
  for (size_t r = 0; r < journal.folders.size(); ++r) {
    const fs::path folder(journal.folders[r]);
    const fs::path store = folder / kStoreFolder, next = folder / kNextFolder, before = folder / kBeforeFolder;
    const bool is_new = static_cast<int>(r) < journal.to_ranks;
    std::error_code error;
    if (is_new && !fs::exists(next, error)) continue;
    if (fs::exists(store, error)) {
      STRATA_RETURN_IF_ERROR(purge_before(before, store));
      STRATA_RETURN_IF_ERROR(rename_durably(store, before));
    }
    if (is_new) STRATA_RETURN_IF_ERROR(rename_durably(next, store));
    if (r == 0) maybe_stop("switch", 0);
  }
  return Status();
}

// `interrupted`: a journal found on start, left by a job that was killed after its commit point.
Status finish_switch(const TrainConfig& config, bool interrupted) {
  const fs::path folder0 = rank_folder(config, 0);
  STRATA_ASSIGN_OR_RETURN(std::optional<Journal> journal, read_journal(folder0));
  if (!journal) return Status();
  if (interrupted)
    spdlog::warn("{}: finishing the switch of an interrupted re-slice from {} to {} ranks", (folder0 / kJournalName).string(),
               journal->from_ranks, journal->to_ranks);
  STRATA_RETURN_IF_ERROR(switch_folders(*journal));
  std::error_code error;
  fs::remove(folder0 / kJournalName, error);
  if (error) return make_errno_error(error.value(), "remove", (folder0 / kJournalName).string());
  return fsync_dir(folder0);
}

// --- the old stores (rank 0 only) -----------------------------------------------------------

struct OldSet {
  int ranks = 0;  // 0: nothing to re-slice
  uint64_t step = 0;
};

Result<memory::Store> open_read_only(const fs::path& dir) {
  memory::StoreOptions options;
  options.read_only = true;
  return memory::Store::open(dir.string(), options);
}

Result<uint64_t> ranks_of(const std::map<std::string, std::string>& metadata, const std::string& dir) {
  if (metadata.count("parallel.ranks") == 0) return uint64_t{1};  // stores from before ZeRO
  return models::metadata_integer(metadata, "parallel.ranks", 1, 1 << 20, dir);
}

// The stores must describe the model, precision and chunking the config trains with.
Status check_against_config(const std::map<std::string, std::string>& metadata, const std::string& dir,
                            const TrainConfig& config) {
  STRATA_ASSIGN_OR_RETURN(ModelConfig stored, committed_model(metadata, dir));
  if (std::optional<std::string> key = models::first_shape_difference(stored, config.model)) {
    const auto stored_keys = models::store_metadata(stored);
    const auto config_keys = models::store_metadata(config.model);
    auto value = [](const std::map<std::string, std::string>& keys, const std::string& k) {
      auto found = keys.find(k);
      return found == keys.end() ? std::string("(absent)") : found->second;
    };
    return make_error(ErrorKind::invalid_argument,
                      fmt::format("cannot re-slice {}: it holds another model than {} describes (key '{}' is {} in "
                                  "the store and {} in the config)",
                                  dir, config.source_path, *key, value(stored_keys, *key), value(config_keys, *key)));
  }
  auto precision = metadata.find("precision");
  if (precision == metadata.end() || precision->second != dtype_name(config.precision))
    return make_error(ErrorKind::invalid_argument,
                      fmt::format("{}: key 'precision': cannot re-slice {}, trained with precision {}",
                                  config.source_path, dir, precision == metadata.end() ? "?" : precision->second));
  STRATA_ASSIGN_OR_RETURN(const uint64_t chunk, models::metadata_integer(metadata, "optim_chunk_elements", 1,
                                                                         UINT64_MAX, dir));
  if (chunk != config.optimizer.chunk_elements)
    return make_error(ErrorKind::invalid_argument,
                      fmt::format("{}: key 'optimizer.chunk_elements': cannot re-slice {}, whose optimizer state is in "
                                  "chunks of {} elements, into chunks of {} (whole chunks move; set it back to {})",
                                  config.source_path, dir, chunk, config.optimizer.chunk_elements, chunk));
  // Whole chunks move as bytes: they must be read back as the layout they were written with.
  STRATA_ASSIGN_OR_RETURN(const optim::StateLayout stored_state, optim::StateLayout::from_metadata(metadata, dir));
  if (!(stored_state == config.optimizer.state()))
    return make_error(ErrorKind::invalid_argument,
                      fmt::format("{}: key 'optimizer.kind': cannot re-slice {}, which holds {} optimizer state, as {} "
                                  "(re-slicing does not convert optimizer state)",
                                  config.source_path, dir, stored_state.describe(), config.optimizer.state().describe()));
  return Status();
}

Result<OldSet> inspect_old_stores(const TrainConfig& config, int new_ranks, bool resume) {
  const fs::path dir0 = rank_folder(config, 0) / kStoreFolder;
  if (!resume || !has_manifest(dir0)) return OldSet{};
  std::map<std::string, std::string> metadata0;
  {
    STRATA_ASSIGN_OR_RETURN(memory::Store store, open_read_only(dir0));
    metadata0 = store.committed_metadata();
  }
  auto format = metadata0.find("format");
  if (format == metadata0.end() || format->second != kRunFormat) return OldSet{};  // the trainer says why
  STRATA_ASSIGN_OR_RETURN(const uint64_t old_ranks64, ranks_of(metadata0, dir0.string()));
  const int old_ranks = static_cast<int>(old_ranks64);
  if (old_ranks == new_ranks) return OldSet{};
  bool templated = false;
  for (const std::string& path : config.nvme_paths) templated = templated || path.find("{rank}") != std::string::npos;
  if (!templated)
    return make_error(ErrorKind::invalid_argument,
                      fmt::format("{}: key 'nvme.paths': {} was committed by {} ranks, whose stores are found through "
                                  "{{rank}} in nvme.paths; this config has none",
                                  config.source_path, dir0.string(), old_ranks));

  // The old job's global commit, as reconcile_global_commit would settle it (train/zero/zero.h).
  std::vector<fs::path> dirs;
  std::vector<int64_t> committed, prepared;
  for (int r = 0; r < old_ranks; ++r) {
    const fs::path dir = rank_folder(config, r) / kStoreFolder;
    if (!has_manifest(dir))
      return make_error(ErrorKind::not_found,
                        fmt::format("cannot re-slice the {}-rank run committed in {} onto {} rank{}: old rank {}'s "
                                    "store {} is missing",
                                    old_ranks, dir0.string(), new_ranks, new_ranks == 1 ? "" : "s", r, dir.string()));
    STRATA_ASSIGN_OR_RETURN(memory::Store store, open_read_only(dir));
    committed.push_back(store.committed_metadata().count("format") != 0 ? static_cast<int64_t>(store.committed_step())
                                                                        : -1);
    STRATA_ASSIGN_OR_RETURN(std::optional<uint64_t> step, memory::Store::prepared_commit_step(dir.string()));
    prepared.push_back(step ? static_cast<int64_t>(*step) : -1);
    dirs.push_back(dir);
  }
  const size_t newest = static_cast<size_t>(std::max_element(committed.begin(), committed.end()) - committed.begin());
  for (size_t r = 0; r < dirs.size(); ++r) {
    if (committed[r] == committed[newest]) continue;
    if (prepared[r] != committed[newest])
      return make_error(ErrorKind::corrupt,
                        fmt::format("cannot re-slice: store {} is at step {} but {} committed step {}, which it never "
                                    "prepared — these stores are not one job's (or one was replaced)",
                                    dirs[r].string(), committed[r], dirs[newest].string(), committed[newest]));
    STRATA_RETURN_IF_ERROR(memory::Store::roll_forward_prepared_commit(dirs[r].string()));
  }
  for (const fs::path& dir : dirs) {
    STRATA_ASSIGN_OR_RETURN(memory::Store store, open_read_only(dir));
    STRATA_ASSIGN_OR_RETURN(const uint64_t ranks, ranks_of(store.committed_metadata(), dir.string()));
    if (static_cast<int>(ranks) != old_ranks)
      return make_error(ErrorKind::corrupt,
                        fmt::format("cannot re-slice: store {} was committed by a job of {} ranks but {} by one of {}: "
                                    "they are not one job's stores",
                                    dir.string(), ranks, dir0.string(), old_ranks));
    STRATA_RETURN_IF_ERROR(check_against_config(store.committed_metadata(), dir.string(), config));
  }
  return OldSet{old_ranks, static_cast<uint64_t>(committed[newest])};
}

// --- the new stores (every rank) ------------------------------------------------------------

struct BuildFigures {
  uint64_t tensors = 0;
  uint64_t bytes = 0;
  double seconds = 0.0;
};

struct AlignedFree {
  void operator()(std::byte* p) const { std::free(p); }
};

Status wait_for(memory::Store& store, Result<memory::StoreTicket> ticket) {
  if (!ticket.ok()) return ticket.error();
  return store.wait(*ticket);
}

// Stage 3: where each old rank's share of each unit's compute copy sits — the plan that rank
// trained with names it (run/train_plan.h, params_share_name) and gives its element range.
// One old rank (or stages 1 and 2) holds every unit whole.
struct OldShare {
  int rank = 0;
  std::string name;
  ElementRange range;
};

std::vector<std::vector<OldShare>> old_shares_by_unit(const TrainConfig& mine, const ModelLayout& layout,
                                                      int old_ranks) {
  const ChunkOwners owners = old_ranks > 1 ? optimizer_chunk_owners(layout, mine.optimizer.chunk_elements, mine.optimizer.state(), old_ranks)
                                           : ChunkOwners{};
  std::vector<std::vector<OldShare>> shares(layout.units().size());
  for (int r = 0; r < old_ranks; ++r) {
    const TrainPlan plan = build_train_plan(mine, layout, owners, r);
    for (size_t u = 0; u < plan.units.size(); ++u) {
      const UnitIds& ids = plan.units[u];
      if (ids.params == kNoTensor) continue;
      shares[u].push_back(OldShare{r, plan.plan.tensors()[ids.params].name, ids.params_range});
    }
  }
  return shares;
}

// Step 2 of the header for `rank` of `ranks`.
Result<BuildFigures> build_new_store(const TrainConfig& config, int rank, int ranks, const OldSet& old) {
  const auto start = Clock::now();
  STRATA_ASSIGN_OR_RETURN(TrainConfig mine, config_for_rank(config, rank, ranks));
  const ModelLayout layout(mine.model);
  const ChunkOwners owners = ranks > 1 ? optimizer_chunk_owners(layout, mine.optimizer.chunk_elements, mine.optimizer.state(), ranks)
                                       : ChunkOwners{};
  const TrainPlan run = build_train_plan(mine, layout, owners, rank);

  std::vector<memory::Store> olds;
  for (int r = 0; r < old.ranks; ++r) {
    STRATA_ASSIGN_OR_RETURN(memory::Store store, open_read_only(rank_folder(config, r) / kStoreFolder));
    if (store.committed_step() != old.step)
      return make_error(ErrorKind::corrupt, fmt::format("store {} moved to step {} while it was being re-sliced "
                                                        "from step {}: is another job using it?",
                                                        store.dir(), store.committed_step(), old.step));
    olds.push_back(std::move(store));
  }

  const fs::path next = rank_folder(config, rank) / kNextFolder;
  STRATA_RETURN_IF_ERROR(remove_folder(next));  // a partial one from an interrupted attempt
  // The data file lives inside the folder (named relatively), so the folder can be renamed into
  // place whole; the old store keeps its own files until it is purged.
  STRATA_ASSIGN_OR_RETURN(memory::Store fresh, memory::Store::create(next.string(), {},
                                                                      training_store_capacity_bytes(run),
                                                                      store_options_for(mine)));
  // Stage 3: the compute copies are cut by rank (shares), so each new share is assembled from
  // the old shares that overlap it; every other tensor moves whole by name.
  const bool cut = mine.parallel.zero_stage == 3;
  const uint32_t param_bytes = dtype_size_bytes(mine.precision);
  std::vector<std::vector<OldShare>> old_shares;
  if (cut) old_shares = old_shares_by_unit(mine, layout, old.ranks);
  uint64_t largest = 0;
  for (const scheduler::PlanTensor& tensor : run.plan.tensors()) largest = std::max(largest, tensor.size_bytes);
  for (const std::vector<OldShare>& shares : old_shares)
    for (const OldShare& share : shares) largest = std::max(largest, share.range.element_count * param_bytes);
  const uint64_t buffer_bytes = align_up(std::max<uint64_t>(largest, 1), 4096);
  std::unique_ptr<std::byte, AlignedFree> buffer(static_cast<std::byte*>(std::aligned_alloc(4096, buffer_bytes)));
  // The share being assembled (stage 3 only).
  std::unique_ptr<std::byte, AlignedFree> assembled(
      cut ? static_cast<std::byte*>(std::aligned_alloc(4096, buffer_bytes)) : nullptr);
  if (!buffer || (cut && !assembled))
    return make_error(ErrorKind::no_space, fmt::format("re-slice: cannot allocate {}", format_size(buffer_bytes)));

  BuildFigures figures;
  std::vector<bool> is_share(run.plan.tensors().size(), false);
  if (cut) {
    for (size_t u = 0; u < run.units.size(); ++u) {
      const UnitIds& ids = run.units[u];
      if (ids.params == kNoTensor) continue;
      is_share[ids.params] = true;
      const scheduler::PlanTensor& tensor = run.plan.tensors()[ids.params];
      const uint64_t begin = ids.params_range.begin_elements;
      const uint64_t end = begin + ids.params_range.element_count;
      uint64_t covered = 0;
      for (const OldShare& share : old_shares[u]) {
        const uint64_t from = std::max(begin, share.range.begin_elements);
        const uint64_t to = std::min(end, share.range.begin_elements + share.range.element_count);
        if (from >= to) continue;
        memory::Store& holder = olds[static_cast<size_t>(share.rank)];
        const std::optional<memory::TensorRecord> record = holder.find(share.name);
        if (!record)
          return make_error(ErrorKind::not_found,
                            fmt::format("cannot re-slice: old rank {}'s share '{}' (for '{}' of rank {}) is not in {}",
                                        share.rank, share.name, tensor.name, rank, holder.dir()));
        if (record->size_bytes != share.range.element_count * param_bytes)
          return make_error(ErrorKind::corrupt,
                            fmt::format("cannot re-slice: tensor '{}' in {} has {} bytes, its share needs {}",
                                        share.name, holder.dir(), record->size_bytes,
                                        share.range.element_count * param_bytes));
        STRATA_RETURN_IF_ERROR(wait_for(holder, holder.read_tensor_async(share.name, buffer.get(), buffer_bytes)));
        std::memcpy(assembled.get() + (from - begin) * param_bytes,
                    buffer.get() + (from - share.range.begin_elements) * param_bytes, (to - from) * param_bytes);
        covered += to - from;
        figures.bytes += (to - from) * param_bytes;
      }
      // The old shares partition each unit, so this is short only when a store lost one.
      if (covered != ids.params_range.element_count)
        return make_error(ErrorKind::corrupt,
                          fmt::format("cannot re-slice: the old stores' shares cover {} of the {} elements of '{}' "
                                      "(rank {}'s new share)",
                                      covered, ids.params_range.element_count, tensor.name, rank));
      const int64_t shape[] = {static_cast<int64_t>(ids.params_range.element_count)};
      STRATA_RETURN_IF_ERROR(wait_for(fresh, fresh.write_tensor_async(tensor.name, mine.precision, shape,
                                                                      assembled.get(), tensor.size_bytes)));
      figures.tensors += 1;
      if (figures.tensors == 1) maybe_stop("copy", rank);
    }
  }
  for (scheduler::TensorId id = 0; id < run.plan.tensors().size(); ++id) {
    if (!is_store_tensor(run, id) || is_share[id]) continue;
    const scheduler::PlanTensor& tensor = run.plan.tensors()[id];
    if (!is_persistent(run, id)) {  // an NVMe-homed gradient: rewritten before it is read
      std::memset(buffer.get(), 0, tensor.size_bytes);
      const int64_t shape[] = {static_cast<int64_t>(tensor.size_bytes / 4)};
      STRATA_RETURN_IF_ERROR(wait_for(fresh, fresh.write_tensor_async(tensor.name, DType::f32, shape, buffer.get(),
                                                                      tensor.size_bytes)));
      continue;
    }
    // Whichever old store holds it; the compute copies are in all of them at stages 1 and 2, so
    // start at a different one per new rank to spread the reads.
    memory::Store* holder = nullptr;
    std::optional<memory::TensorRecord> record;
    for (size_t k = 0; k < olds.size() && holder == nullptr; ++k) {
      memory::Store& candidate = olds[(static_cast<size_t>(rank) + k) % olds.size()];
      if ((record = candidate.find(tensor.name))) holder = &candidate;
    }
    if (holder == nullptr)
      return make_error(ErrorKind::not_found,
                        fmt::format("cannot re-slice: tensor '{}' of rank {}'s new partition is in none of the {} old "
                                    "stores (in {})",
                                    tensor.name, rank, olds.size(), olds.front().dir()));
    if (record->size_bytes != tensor.size_bytes)
      return make_error(ErrorKind::corrupt,
                        fmt::format("cannot re-slice: tensor '{}' in {} has {} bytes, the plan needs {}", tensor.name,
                                    holder->dir(), record->size_bytes, tensor.size_bytes));
    STRATA_RETURN_IF_ERROR(wait_for(*holder, holder->read_tensor_async(tensor.name, buffer.get(), buffer_bytes)));
    STRATA_RETURN_IF_ERROR(wait_for(fresh, fresh.write_tensor_async(tensor.name, record->dtype, record->shape,
                                                                    buffer.get(), record->size_bytes)));
    figures.tensors += 1;
    figures.bytes += record->size_bytes;
    if (figures.tensors == 1) maybe_stop("copy", rank);
  }
  std::map<std::string, std::string> metadata = olds.front().committed_metadata();
  metadata["parallel.ranks"] = std::to_string(ranks);
  STRATA_RETURN_IF_ERROR(fresh.commit(old.step, metadata));
  figures.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return figures;
}

// A fixed-size message every rank receives from one (an outcome, or rank 0's decision).
struct Outcome {
  int64_t old_ranks = 0;
  uint64_t step = 0;
  int32_t failed = 0;
  int32_t kind = 0;  // ErrorKind
  char message[2048] = {};

  void set_error(const Error& error) {
    failed = 1;
    kind = static_cast<int32_t>(error.kind);
    std::snprintf(message, sizeof message, "%s", error.to_string().c_str());
  }
  Error error() const { return make_error(static_cast<ErrorKind>(kind), message); }
};

}  // namespace

Status reslice_if_needed(comm::Communicator& comm, const TrainConfig& config, bool resume) {
  const int rank = comm.rank();
  const int ranks = comm.size();
  // Rank 0 alone looks at (and may finish writing) the folders; the others wait for its word.
  Outcome decision;
  if (rank == 0) {
    Status finished = finish_switch(config, /*interrupted=*/true);
    Result<OldSet> old = finished.ok() ? inspect_old_stores(config, ranks, resume) : Result<OldSet>(finished.error());
    if (old.ok()) decision.old_ranks = old->ranks, decision.step = old->step;
    else decision.set_error(old.error());
  }
  STRATA_RETURN_IF_ERROR(comm.broadcast(&decision, sizeof decision, 0));
  if (decision.failed != 0) return decision.error();
  const fs::path next = rank_folder(config, rank) / kNextFolder;
  if (decision.old_ranks == 0) {
    // Nothing to re-slice; a store.reslice here is what an attempt killed before its commit
    // point left (no journal remains): garbage.
    std::error_code error;
    if (fs::exists(next, error)) STRATA_RETURN_IF_ERROR(remove_folder(next));
    return Status();
  }
  const OldSet old{static_cast<int>(decision.old_ranks), decision.step};
  if (rank == 0)
    spdlog::info("re-slicing step {} of the {}-rank run in {} onto {} rank{}", old.step, old.ranks,
                 (rank_folder(config, 0) / kStoreFolder).string(), ranks, ranks == 1 ? "" : "s");

  Result<BuildFigures> built = build_new_store(config, rank, ranks, old);
  if (built.ok()) maybe_stop("built", rank);
  Outcome mine;
  if (!built.ok()) mine.set_error(built.error());
  std::vector<Outcome> all(static_cast<size_t>(ranks));
  STRATA_RETURN_IF_ERROR(comm.allgather(&mine, all.data(), sizeof mine));
  if (!built.ok()) return built.error();
  for (int r = 0; r < ranks; ++r)
    if (all[static_cast<size_t>(r)].failed != 0)
      return make_error(static_cast<ErrorKind>(all[static_cast<size_t>(r)].kind),
                        fmt::format("re-slicing stopped: rank {} could not build its new store ({}); the committed "
                                    "stores are unchanged",
                                    r, all[static_cast<size_t>(r)].message));
  spdlog::info("rank {}: re-sliced store built: {} tensors, {} copied in {:.2f} s", rank, built->tensors,
               format_size(built->bytes), built->seconds);

  // Every new store is complete and committed: rank 0 commits the re-slice and switches.
  Outcome switched;
  if (rank == 0) {
    Journal journal{old.ranks, ranks, old.step, {}};
    for (int r = 0; r < std::max(old.ranks, ranks); ++r) journal.folders.push_back(rank_folder(config, r).string());
    Status status = write_journal(rank_folder(config, 0), journal);
    if (status.ok()) maybe_stop("journal", 0);
    if (status.ok()) status = finish_switch(config, /*interrupted=*/false);
    if (!status.ok()) switched.set_error(status.error());
    else
      spdlog::info("re-sliced step {} from {} to {} rank{}; the old stores are kept as {} until the next re-slice",
                   old.step, old.ranks, ranks, ranks == 1 ? "" : "s", kBeforeFolder);
  }
  STRATA_RETURN_IF_ERROR(comm.broadcast(&switched, sizeof switched, 0));
  if (switched.failed != 0) return switched.error();
  return Status();
}

}  // namespace strata
