// Error-feedback residuals of one rank, keyed by a stable tensor name, in memory.
//
// A residual e holds, per element, what compression has not yet delivered of the gradients seen
// so far (ErrorFeedbackCodec: g' = g + e; send C(g'); e = g' - D(C(g'))). Losing it on a
// restart loses that mass, so the store saves and loads it with the rest of a checkpoint.
//
// Thread safety: a ResidualStore is NOT thread-safe. Calls on one store from several threads
// need external synchronisation. The f32 memory behind spans returned by residual() may be read
// and written from any thread while no thread calls a member of the store (different tensors'
// buffers never overlap).
//
// Reference validity: a span returned by residual(name, count) stays valid, and keeps pointing
// at the tensor's residual, until that same name is resized under ResizePolicy::reset or
// released (release_unused_before), or until clear() or destruction. Creating other tensors never moves existing buffers; load() into a
// store that already holds the checkpoint's tensors copies the values into the existing buffers,
// so spans stay valid across it too.
//
// Checkpoints: save() and load() write and read the file of error_feedback/checkpoint_file.h
// (its format is documented there) with this store's residuals as lane 0 and the owner's state.
//
// Where a residual lives: in host memory, or in the memory of one CUDA device once an encode of
// a CUDA tensor asked for it there (device_residual), so that error feedback on the device never
// copies it between host and device. The host memory behind a device residual is a mirror:
// residual(name) (read) and save() refresh it from the device; residual(name, count) (a host
// span to write through) and fold_into bring the values back to host memory for good (the next
// device_residual moves them out again). Each move is a synchronous copy; a steady state of
// device-only or host-only calls makes none.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "error_feedback/checkpoint_file.h"
#include "gradzip/compression_spec.h"

namespace gradzip::error_feedback {

class DeviceResidual;  // error_feedback/device_residual.h

class ResidualStore {
 public:
  // `world_size` >= 1 and `rank` < world_size (else ErrorCode::invalid_argument). Both are
  // recorded in checkpoints: a rank's residuals belong to that rank of that world.
  ResidualStore(std::uint32_t world_size, std::uint32_t rank, ResizePolicy policy);

  std::uint32_t world_size() const noexcept { return world_size_; }
  std::uint32_t rank() const noexcept { return rank_; }
  ResizePolicy resize_policy() const noexcept { return policy_; }
  // Changes what later residual(name, count) calls do on a size change. The Communicator sets
  // it from each call's spec (ef_resize=), so one store serves calls with different policies.
  void set_resize_policy(ResizePolicy policy) noexcept { policy_ = policy; }

  // The residual of tensor `name` (non-empty), `count` elements. The first call for a name
  // creates a zero buffer. When `count` differs from the registered count:
  //   ResizePolicy::error -> ErrorCode::size_mismatch naming the tensor and both counts; the
  //                          store is unchanged;
  //   ResizePolicy::reset -> the old buffer is dropped (spans to it dangle) and a new zero
  //                          buffer of `count` elements takes its place.
  std::span<float> residual(std::string_view name, std::size_t count);

  // Read-only view of a registered tensor's residual; ErrorCode::invalid_argument naming the
  // tensor when it is not registered. A residual on a device is copied into its host mirror
  // first (and stays on the device); the view is valid until the next call on the store.
  std::span<const float> residual(std::string_view name) const;

  // Registers tensor `name` with `count` elements as residual(name, count) does (creation,
  // resize policy, use stamp) without moving its values: what an encoder does before any
  // request is posted (collectives/job_encoder.h, register_residual).
  void register_tensor(std::string_view name, std::size_t count);

  // The residual of tensor `name`, `count` elements, in the memory of CUDA device `device`
  // (registered as above; values in host memory or on another device are moved there once).
  // The pointer stays valid until the tensor is moved back to host memory (residual(name,
  // count), fold_into), resized, released or cleared. Device work on it is ordered on the
  // calling thread's work stream.
  float* device_residual(std::string_view name, std::size_t count, int device);
  // True when `name`'s residual lives in device memory now (tests and `gradzip-bench calls`).
  bool on_device(std::string_view name) const;

  bool contains(std::string_view name) const;
  // Registered tensor names in byte-wise ascending order (the checkpoint's order).
  std::vector<std::string> names() const;
  // Number of registered tensors.
  std::size_t size() const noexcept { return residuals_.size(); }
  // Bytes of residual values held: 4 x the sum of the registered element counts.
  std::size_t total_bytes() const noexcept;
  // Forgets every tensor; every span handed out dangles.
  void clear() noexcept;

  // Use stamps, for releasing the residuals of tensors that are no longer reduced. Every
  // residual(name, count) call stamps the tensor with the current use clock (0 until set;
  // tensors taken from a checkpoint by load() get the clock at load time).
  // release_unused_before(t) forgets every tensor whose stamp is older than t (their spans
  // dangle) and returns how many it forgot. The Communicator sets the clock to its call number
  // (gradzip/communicator.h, CommunicatorOptions::release_unused_after_calls).
  void set_use_clock(std::uint64_t now) noexcept { clock_ = now; }
  // `released`, when given, receives the names it forgot (in byte-wise order).
  std::size_t release_unused_before(std::uint64_t oldest_kept,
                                    std::vector<std::string>* released = nullptr);

  // Placements: where an auxiliary residual's elements sit in another tensor's. Algorithms that
  // keep residuals besides the worker's "<name>" (SRA's owner side, the tree's root, halving /
  // doubling's steps and owner, the hierarchical all-reduce's shard) record, when they register
  // one, that its element i is element offset + i of `parent` (itself placed or a worker
  // residual). Not saved in checkpoints (they are re-recorded by the next call that uses them).
  void set_placement(std::string_view name, std::string_view parent, std::size_t offset);
  // Moves into residual `root` every registered residual placed in it (directly or through a
  // chain of placements): each element is added to root's element at its place, and the folded
  // residuals are released (the next call registers them again, zero). Per element the
  // residual mass this rank holds is unchanged, so error feedback still delivers all of it: what
  // a worker encode of root compensates next now includes what an owner or root encode would
  // have. Used before a tensor's layout changes (the DDP hook's bucket rebuild) and before its
  // residual is read per element. When `root` is not registered but something is placed in
  // it, it is registered first with `count` elements (zeros). Returns how many residuals it
  // folded; ErrorCode::internal when a placed residual does not fit inside its root.
  std::size_t fold_into(std::string_view root, std::size_t count);
  // The registered residuals whose chain of placements ends in `root` (placed in it directly or
  // in a residual placed in it, and so on), in name order, each with the offset of its element
  // 0 among root's elements: what fold_into(root) would fold (root itself is not listed; a
  // residual that is itself placed has nothing ending in it). ErrorCode::internal on a cycle.
  std::vector<std::pair<std::string, std::size_t>> placed_in(std::string_view root) const;
  // What residual(root) would hold after fold_into(root, count), computed without changing the
  // store (a checkpoint taken while training goes on must not change what the next call
  // sends): root's values, or `count` zeros when root is not registered, plus every residual
  // placed in it at its place. Empty (std::nullopt) when root is not registered and nothing is
  // placed in it. Device residuals are read through their mirrors. Same checks as fold_into.
  std::optional<std::vector<float>> folded_copy(std::string_view root, std::size_t count) const;
  // Forgets `root` and every residual placed in it, with their placements: a tensor that is gone
  // for good (the DDP hook's bucket layouts after DDP rebuilt its buckets, once their residuals
  // were carried over), so that the release window never reports them as released. Returns how
  // many residuals it forgot. Not inside a journal (ErrorCode::internal).
  std::size_t erase_tree(std::string_view root);

  // A journal, for calls that may be undone (a stream-ordered call on a CUDA tensor runs before
  // it knows whether every rank's input can be reduced: collectives/call.h, DeferredInput).
  // Between begin_journal() and end_journal(), the first use of each name (residual(name,
  // count), register_tensor, device_residual) records what an undo needs: whether the name was
  // new, its use stamp, and its values: a device residual's in a device copy queued on the
  // thread's work stream before any later work there (no wait), a host residual's in a host
  // copy. end_journal(true) undoes every journaled change: new names are forgotten, values
  // come back (device residuals by copies queued on the work stream, which any later host read
  // waits for), stamps are restored; end_journal(false) keeps the changes and drops the copies.
  // begin_journal while one is open: ErrorCode::internal. end_journal without one: nothing.
  void begin_journal();
  void end_journal(bool undo);
  bool journaling() const noexcept { return journal_.open != nullptr; }

  // Writes the checkpoint (write_checkpoint_file): this store's residuals as lane 0, and
  // `owner_state`. Refuses with invalid_argument what the file cannot hold (a call number with
  // an empty name, model inputs that break their contracts); throws ErrorCode::io_error naming
  // the path and the system's reason when the file cannot be written; the target is then left
  // as it was and the temporary file is removed.
  void save(const std::filesystem::path& path, const CheckpointOwnerState& owner_state = {}) const;

  // Reads a checkpoint (read_checkpoint_file, any version it reads) and takes its residuals.
  // The whole file is read and verified before the store changes; on any failure the store is
  // unchanged. Refusals: read_checkpoint_file's (io_error for a file that cannot be read or is
  // corrupt, invalid_argument for another format version) and require_loadable's. An empty
  // store takes the file's tensors; a non-empty store must hold exactly the file's tensors with
  // the same counts and gets their values copied into its existing buffers. Returns the rest of
  // the file: its header, owner state and version 2 counters (its tensors are in the store).
  CheckpointContents load(const std::filesystem::path& path);

  // load()'s two halves, for an owner that checks the rest of the file before the store changes.
  // require_loadable refuses, changing nothing:
  //   size_mismatch     another world size; the store is non-empty and a tensor has another
  //                     element count in the file (the message names it and both counts).
  //   invalid_argument  another rank; a tensor in a lane other than 0 (a Reducer's lanes); the
  //                     store is non-empty and a tensor name is in one of {file, store} only
  //                     (the message names the first such name in sorted order).
  // `path` names the file in messages.
  void require_loadable(const std::filesystem::path& path, const CheckpointContents& contents) const;
  // Takes `contents`' tensors (which leaves them empty); require_loadable must have accepted
  // `contents`. Tensors taken into an empty store get the current use clock.
  void adopt_tensors(CheckpointContents& contents);

 private:
  // std::less<> lets lookups take a string_view without building a std::string.
  // A tensor's residual and the use clock of its last residual(name, count) call.
  struct Tensor {
    // The residual (host-resident), or the mirror of `device`'s values (refreshed by readers).
    mutable std::vector<float> values;
    std::uint64_t last_use = 0;
    std::shared_ptr<DeviceResidual> device;  // set while the residual lives on a device
    bool zeros = false;  // `values` are known to be all zero (nothing written through a span)
  };
  using Tensors = std::map<std::string, Tensor, std::less<>>;

  // What end_journal(true) puts back for one name.
  struct JournalEntry {
    bool existed = false;
    std::uint64_t last_use = 0;
    bool zeros = false;
    std::size_t count = 0;
    std::shared_ptr<DeviceResidual> device;        // where the values lived (kept alive)
    std::shared_ptr<DeviceResidual> device_copy;   // a device residual's values
    std::vector<float> host_values;                // a host residual's values
    // The buffer a reset resize replaced inside the journal: an undo puts it back, so that
    // spans to it handed out before the journal stay valid.
    std::optional<std::vector<float>> replaced;
  };
  using Journal = std::map<std::string, JournalEntry, std::less<>>;

  // The registered tensor, created or resized as residual(name, count) documents.
  Tensor& registered(std::string_view name, std::size_t count);
  // Records `name` in the open journal on its first use there.
  void journal_first_use(std::string_view name);
  // Moves a device residual back into `values` for good.
  static void bring_home(Tensor& tensor);
  // Copies a device residual into its mirror (it stays on the device).
  static void refresh_mirror(const Tensor& tensor);

  std::uint32_t world_size_;
  std::uint32_t rank_;
  struct Placement {
    std::string parent;
    std::size_t offset = 0;
  };

  ResizePolicy policy_;
  Tensors residuals_;
  std::map<std::string, Placement, std::less<>> placements_;  // set_placement
  std::uint64_t clock_ = 0;  // the use clock (set_use_clock)
  // Open between begin_journal and end_journal. A copy of the store does not take it (the
  // journal is about this store's buffers).
  struct JournalSlot {
    std::unique_ptr<Journal> open;
    JournalSlot() = default;
    JournalSlot(const JournalSlot& /*other*/) noexcept {}
    JournalSlot& operator=(const JournalSlot& /*other*/) noexcept { return *this; }
    JournalSlot(JournalSlot&&) noexcept = default;
    JournalSlot& operator=(JournalSlot&&) noexcept = default;
    ~JournalSlot() = default;
  };
  JournalSlot journal_;
};

}  // namespace gradzip::error_feedback
