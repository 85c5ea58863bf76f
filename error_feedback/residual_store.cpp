// The in-memory residual store (error_feedback/residual_store.h); its file is
// error_feedback/checkpoint_file.cpp.
#include "error_feedback/residual_store.h"

#include <algorithm>
#include <utility>

#include "error_feedback/checkpoint_file.h"
#include "error_feedback/device_residual.h"
#include "gradzip/error.h"

namespace gradzip::error_feedback {
namespace {

// Compares the loaded tensors (all of lane 0) with the registered ones (both sorted by name)
// and throws on the first difference.
template <typename Store>
void require_same_tensors(const CheckpointTensors& file, const Store& store, const std::string& path) {
  auto in_file = file.begin();
  auto in_store = store.begin();
  while (in_file != file.end() || in_store != store.end()) {
    if (in_store == store.end() || (in_file != file.end() && in_file->first.name < in_store->first)) {
      GZ_THROW(ErrorCode::invalid_argument, "ResidualStore::load: '", path, "' holds tensor '",
               in_file->first.name, "', which this store does not have (the file has ", file.size(),
               " tensors, the store ", store.size(), ")");
    }
    if (in_file == file.end() || in_store->first < in_file->first.name) {
      GZ_THROW(ErrorCode::invalid_argument, "ResidualStore::load: this store has tensor '",
               in_store->first, "', which '", path, "' does not hold (the file has ",
               file.size(), " tensors, the store ", store.size(), ")");
    }
    GZ_REQUIRE(in_file->second.size() == in_store->second.values.size(), ErrorCode::size_mismatch,
               "ResidualStore::load: tensor '", in_file->first.name, "' has ",
               in_file->second.size(), " elements in '", path, "' and ",
               in_store->second.values.size(), " in this store");
    ++in_file;
    ++in_store;
  }
}

}  // namespace

ResidualStore::ResidualStore(std::uint32_t world_size, std::uint32_t rank, ResizePolicy policy)
    : world_size_(world_size), rank_(rank), policy_(policy) {
  GZ_REQUIRE(world_size >= 1 && rank < world_size, ErrorCode::invalid_argument,
             "ResidualStore: rank ", rank, " of world size ", world_size,
             " (need world size >= 1 and rank < world size)");
}

ResidualStore::Tensor& ResidualStore::registered(std::string_view name, std::size_t count) {
  GZ_REQUIRE(!name.empty(), ErrorCode::invalid_argument,
             "ResidualStore::residual: empty tensor name (", count, " elements)");
  if (journal_.open) journal_first_use(name);
  auto found = residuals_.find(name);
  if (found == residuals_.end()) {
    found = residuals_.emplace(std::string(name), Tensor{std::vector<float>(count, 0.0f), clock_, nullptr, true}).first;
    return found->second;
  }
  found->second.last_use = clock_;
  if (found->second.values.size() != count) {
    GZ_REQUIRE(policy_ == ResizePolicy::reset, ErrorCode::size_mismatch,
               "ResidualStore::residual: tensor '", name, "' changed size from ",
               found->second.values.size(), " to ", count,
               " elements (rank ", rank_, "; ef_resize=error; use ef_resize=reset to start a new "
               "zero residual)");
    // Build the new buffer first: if the allocation throws, the old one is kept.
    std::vector<float> fresh(count, 0.0f);
    if (journal_.open) {
      JournalEntry& entry = journal_.open->find(name)->second;
      if (!entry.replaced) entry.replaced = std::move(found->second.values);
    }
    found->second.values = std::move(fresh);
    found->second.device.reset();
    found->second.zeros = true;
  }
  return found->second;
}

void ResidualStore::journal_first_use(std::string_view name) {
  if (journal_.open->find(name) != journal_.open->end()) return;
  JournalEntry entry;
  const auto found = residuals_.find(name);
  if (found != residuals_.end()) {
    const Tensor& tensor = found->second;
    entry.existed = true;
    entry.last_use = tensor.last_use;
    entry.zeros = tensor.zeros;
    entry.count = tensor.values.size();
    if (tensor.device) {
      entry.device = tensor.device;
      entry.device_copy = std::make_shared<DeviceResidual>(tensor.device->count(),
                                                           tensor.device->device(), false);
      entry.device_copy->copy_from(*tensor.device);
    } else if (!tensor.zeros) {
      entry.host_values = tensor.values;
    }
  }
  journal_.open->emplace(std::string(name), std::move(entry));
}

void ResidualStore::begin_journal() {
  GZ_REQUIRE(journal_.open == nullptr, ErrorCode::internal,
             "ResidualStore::begin_journal: a journal is already open");
  journal_.open = std::make_unique<Journal>();
}

void ResidualStore::end_journal(bool undo) {
  if (!journal_.open) return;
  const std::unique_ptr<Journal> journal = std::move(journal_.open);
  if (!undo) return;
  for (auto& [name, entry] : *journal) {
    if (!entry.existed) {
      residuals_.erase(name);
      continue;
    }
    Tensor& tensor = residuals_[name];
    tensor.last_use = entry.last_use;
    tensor.zeros = entry.zeros;
    if (entry.replaced) tensor.values = std::move(*entry.replaced);  // the buffer spans point at
    if (tensor.values.size() != entry.count) tensor.values.assign(entry.count, 0.0f);
    if (entry.device) {
      entry.device->copy_from(*entry.device_copy);
      tensor.device = std::move(entry.device);  // `values` is its mirror, refreshed by readers
    } else {
      tensor.device.reset();
      if (entry.zeros) std::fill(tensor.values.begin(), tensor.values.end(), 0.0f);
      else std::copy(entry.host_values.begin(), entry.host_values.end(), tensor.values.begin());
    }
  }
}

void ResidualStore::bring_home(Tensor& tensor) {
  if (!tensor.device) return;
  tensor.device->download(tensor.values);
  tensor.device.reset();
}

void ResidualStore::refresh_mirror(const Tensor& tensor) {
  if (tensor.device) tensor.device->download(tensor.values);
}

std::span<float> ResidualStore::residual(std::string_view name, std::size_t count) {
  Tensor& tensor = registered(name, count);
  bring_home(tensor);
  tensor.zeros = false;  // the caller may write through the span
  return tensor.values;
}

void ResidualStore::register_tensor(std::string_view name, std::size_t count) {
  registered(name, count);
}

float* ResidualStore::device_residual(std::string_view name, std::size_t count, int device) {
  Tensor& tensor = registered(name, count);
  if (tensor.device && tensor.device->device() == device) return tensor.device->data();
  bring_home(tensor);  // from another device, if it was on one
  auto moved = std::make_shared<DeviceResidual>(count, device);  // zeros
  if (!tensor.zeros) moved->upload(tensor.values);
  tensor.device = std::move(moved);
  return tensor.device->data();
}

bool ResidualStore::on_device(std::string_view name) const {
  const auto found = residuals_.find(name);
  return found != residuals_.end() && found->second.device != nullptr;
}

std::span<const float> ResidualStore::residual(std::string_view name) const {
  const auto found = residuals_.find(name);
  GZ_REQUIRE(found != residuals_.end(), ErrorCode::invalid_argument,
             "ResidualStore::residual: tensor '", name, "' has no residual (rank ", rank_, ", ",
             residuals_.size(), " tensors registered)");
  refresh_mirror(found->second);
  return found->second.values;
}

bool ResidualStore::contains(std::string_view name) const {
  return residuals_.find(name) != residuals_.end();
}

std::vector<std::string> ResidualStore::names() const {
  std::vector<std::string> sorted;
  sorted.reserve(residuals_.size());
  for (const auto& entry : residuals_) sorted.push_back(entry.first);
  return sorted;
}

std::size_t ResidualStore::total_bytes() const noexcept {
  std::size_t bytes = 0;
  for (const auto& entry : residuals_) bytes += entry.second.values.size() * sizeof(float);
  return bytes;
}

void ResidualStore::clear() noexcept {
  journal_.open.reset();
  residuals_.clear();
  placements_.clear();
}

void ResidualStore::set_placement(std::string_view name, std::string_view parent,
                                  std::size_t offset) {
  GZ_REQUIRE(!name.empty() && !parent.empty() && name != parent, ErrorCode::invalid_argument,
             "set_placement: residual '", name, "' placed in '", parent,
             "' (both names non-empty and different)");
  Placement& placement = placements_[std::string(name)];
  placement.parent = std::string(parent);
  placement.offset = offset;
}

std::vector<std::pair<std::string, std::size_t>> ResidualStore::placed_in(std::string_view root) const {
  // Where each registered residual sits: the end of its placement chain and the summed offset.
  struct Place {
    std::string_view root;
    std::size_t offset = 0;
    bool placed = false;
  };
  const auto place_of = [&](std::string_view name) {
    Place place{name, 0, false};
    std::size_t hops = 0;
    for (auto found = placements_.find(place.root); found != placements_.end();
         found = placements_.find(place.root)) {
      place.offset += found->second.offset;
      place.root = found->second.parent;
      place.placed = true;
      GZ_REQUIRE(++hops <= placements_.size(), ErrorCode::internal, "residuals placed in '", root,
                 "': the placements of '", name, "' form a cycle");
    }
    return place;
  };
  std::vector<std::pair<std::string, std::size_t>> placed;
  for (const auto& entry : residuals_) {
    const Place place = place_of(entry.first);
    if (place.placed && place.root == root) placed.emplace_back(entry.first, place.offset);
  }
  return placed;
}

namespace {

// A residual of `size` elements placed at `offset` of a root of `root_size` elements must lie
// inside it: a placement outside its root is a bookkeeping error of the algorithm that made it.
void require_fits(std::size_t root_size, std::string_view root, std::string_view name,
                  std::size_t size, std::size_t offset) {
  GZ_REQUIRE(offset <= root_size && size <= root_size - offset, ErrorCode::internal, "fold_into '",
             root, "': residual '", name, "' (", size, " elements at ", offset,
             ") does not fit in its ", root_size, " elements");
}

void add_at(std::vector<float>& into, const std::vector<float>& values, std::size_t offset) {
  for (std::size_t i = 0; i < values.size(); ++i) into[offset + i] += values[i];
}

}  // namespace

std::size_t ResidualStore::fold_into(std::string_view root, std::size_t count) {
  // Every place is found before anything is erased: folding one residual erases its placement,
  // which may be a link in another's chain ("sra-server:x@hier" -> "x@hier" -> "x").
  const std::vector<std::pair<std::string, std::size_t>> to_fold = placed_in(root);
  if (to_fold.empty()) return 0;
  auto target = residuals_.find(root);
  if (target == residuals_.end()) {
    residual(root, count);
    target = residuals_.find(root);
  }
  bring_home(target->second);
  target->second.zeros = false;
  for (const auto& [name, offset] : to_fold) bring_home(residuals_.find(name)->second);
  std::vector<float>& into = target->second.values;
  // Checked in full before the first add, so that a misplaced residual changes nothing.
  for (const auto& [name, offset] : to_fold)
    require_fits(into.size(), root, name, residuals_.find(name)->second.values.size(), offset);
  for (const auto& [name, offset] : to_fold) {
    const auto tensor = residuals_.find(name);
    add_at(into, tensor->second.values, offset);
    residuals_.erase(tensor);
    placements_.erase(name);
  }
  return to_fold.size();
}

std::optional<std::vector<float>> ResidualStore::folded_copy(std::string_view root,
                                                             std::size_t count) const {
  const std::vector<std::pair<std::string, std::size_t>> placed = placed_in(root);
  const auto target = residuals_.find(root);
  if (target == residuals_.end() && placed.empty()) return std::nullopt;
  std::vector<float> folded;
  if (target != residuals_.end()) {
    refresh_mirror(target->second);
    folded = target->second.values;
  } else {
    folded.assign(count, 0.0f);
  }
  for (const auto& [name, offset] : placed) {
    const Tensor& tensor = residuals_.find(name)->second;
    refresh_mirror(tensor);
    require_fits(folded.size(), root, name, tensor.values.size(), offset);
    add_at(folded, tensor.values, offset);
  }
  return folded;
}

std::size_t ResidualStore::erase_tree(std::string_view root) {
  GZ_REQUIRE(!journaling(), ErrorCode::internal, "erase_tree '", root,
             "': residuals cannot be forgotten while a journal is open");
  std::vector<std::pair<std::string, std::size_t>> tree = placed_in(root);
  tree.emplace_back(std::string(root), 0);
  std::size_t erased = 0;
  for (const auto& [name, offset] : tree) {
    erased += residuals_.erase(name);
    placements_.erase(name);
  }
  // Placements recorded for residuals not registered (yet) stay: they name where a residual
  // would sit, which is harmless; only registered ones hold memory.
  return erased;
}

std::size_t ResidualStore::release_unused_before(std::uint64_t oldest_kept,
                                                 std::vector<std::string>* released_names) {
  std::size_t released = 0;
  for (auto tensor = residuals_.begin(); tensor != residuals_.end();) {
    if (tensor->second.last_use >= oldest_kept) {
      ++tensor;
      continue;
    }
    if (released_names != nullptr) released_names->push_back(tensor->first);
    placements_.erase(tensor->first);
    tensor = residuals_.erase(tensor);
    ++released;
  }
  return released;
}

void ResidualStore::save(const std::filesystem::path& path,
                         const CheckpointOwnerState& owner_state) const {
  std::vector<CheckpointTensorView> tensors;
  tensors.reserve(residuals_.size());
  for (const auto& [name, tensor] : residuals_) {
    refresh_mirror(tensor);
    tensors.push_back({0, name, tensor.values});
  }
  write_checkpoint_file(path, world_size_, rank_, tensors, owner_state);
}

CheckpointContents ResidualStore::load(const std::filesystem::path& path) {
  CheckpointContents contents = read_checkpoint_file(path);
  require_loadable(path, contents);
  adopt_tensors(contents);
  return contents;
}

void ResidualStore::require_loadable(const std::filesystem::path& path,
                                     const CheckpointContents& contents) const {
  const std::string name_of_file = path.string();
  require_same_world_and_rank(contents, world_size_, rank_, name_of_file, "ResidualStore::load");
  // Keys sort by lane, then name: the last key has the highest lane in the file, and the
  // message names that lane's first tensor.
  if (!contents.tensors.empty() && contents.tensors.rbegin()->first.lane != 0) {
    const std::uint32_t lane = contents.tensors.rbegin()->first.lane;
    const CheckpointTensorKey& first = contents.tensors.lower_bound({lane, ""})->first;
    GZ_THROW(ErrorCode::invalid_argument, "ResidualStore::load: '", name_of_file,
             "' holds tensor '", first.name, "' in lane ", lane,
             "; a store takes lane 0 only (a Reducer's checkpoint of several lanes?)");
  }
  if (!residuals_.empty()) require_same_tensors(contents.tensors, residuals_, name_of_file);
}

void ResidualStore::adopt_tensors(CheckpointContents& contents) {
  CheckpointTensors loaded = std::move(contents.tensors);
  contents.tensors.clear();
  if (residuals_.empty()) {
    for (auto& [key, values] : loaded)
      residuals_.emplace_hint(residuals_.end(), key.name, Tensor{std::move(values), clock_, nullptr, false});
    return;
  }
  // Same names and counts (require_loadable): copy into the existing buffers so that spans
  // stay valid (and into the device memory of a residual that lives there).
  auto source = loaded.begin();
  for (auto& entry : residuals_) {
    std::copy(source->second.begin(), source->second.end(), entry.second.values.begin());
    entry.second.zeros = false;
    if (entry.second.device) entry.second.device->upload(entry.second.values);
    ++source;
  }
}

}  // namespace gradzip::error_feedback
