// A timeline of what one rank did, written as Chrome trace events (the JSON "Trace Event
// Format" that chrome://tracing and ui.perfetto.dev load): spans ("ph":"X") nested per track,
// instants ("ph":"i"), async spans ("ph":"b"/"e", one id each: buckets, which overlap each other)
// and track names ("ph":"M"). pid is the rank, tid a track. docs/reducer.md ("Timeline") says
// which tracks and spans the Reducer and the DDP hook record.
//
// Recording from collectives: while a TimelineScope lives on a thread, run_call records each
// collective call of that thread as a span (category "call", its stats as args) and StageTimer
// each encode / communicate / decode stage inside it (category "stage", the bytes it counted as
// args). Without a scope nothing is recorded and the cost is one thread-local read per stage.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace gradzip::collectives {

using TimelineClock = std::chrono::steady_clock;

class Timeline {
 public:
  // Timestamps ("ts") are microseconds since construction (three decimals: nanoseconds, exact
  // in a double); otherData.origin_epoch_us is the system clock at construction, in
  // microseconds since the Unix epoch: adding it lines up the files of several ranks (exactly on
  // one host, across hosts as well as their clocks agree).
  explicit Timeline(int rank);
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  int rank() const noexcept { return rank_; }
  // A time as the file gives it (microseconds since construction), and back: for recorders
  // that hold times as numbers (the DDP hook, in Python).
  double microseconds_at(TimelineClock::time_point at) const noexcept;
  TimelineClock::time_point time_at(double microseconds) const noexcept;

  // `args`: JSON object members without the braces (e.g. "\"bytes\":12,\"step\":3"), or empty.
  // Every call is thread-safe.
  void name_track(int track, std::string_view name);
  void span(int track, std::string_view name, std::string_view category,
            TimelineClock::time_point begin, TimelineClock::time_point end,
            std::string_view args = {});
  void instant(int track, std::string_view name, std::string_view category,
               TimelineClock::time_point at, std::string_view args = {});
  // A span that may overlap others of its category (its own row in the viewers): begin and end
  // events with the same `id`.
  void async_span(std::string_view name, std::string_view category, std::uint64_t id,
                  TimelineClock::time_point begin, TimelineClock::time_point end,
                  std::string_view args = {});

  // Events recorded, track names not counted.
  std::size_t event_count() const;
  // {"traceEvents":[...],"displayTimeUnit":"ms","otherData":{"rank":R,"origin_epoch_us":T}}
  std::string to_json() const;
  // to_json() into `path` (replaced). Throws gradzip::Error(io_error) naming the path when it
  // cannot be written.
  void write(const std::string& path) const;
  void clear();

 private:
  std::string timestamp(TimelineClock::time_point at) const;
  void append(std::string event);

  int rank_;
  TimelineClock::time_point origin_;
  std::int64_t origin_epoch_us_;
  mutable std::mutex mutex_;
  std::vector<std::string> events_;  // serialised, in recording order
  std::size_t track_names_ = 0;      // of events_
};

// The file rank `rank` of `ranks` writes for the timeline path `path`: "{rank}" in the path is
// replaced by the rank; a path without it gets ".rank<R>" before its extension (or at its end)
// when there is more than one rank, so ranks never write the same file.
std::string timeline_path_for_rank(std::string_view path, int rank, int ranks);
// `path` with `suffix` inserted before the extension of its last component (or at its end).
std::string insert_before_extension(std::string_view path, std::string_view suffix);

// Which steps to record and where, after the environment: GRADZIP_TIMELINE, when set and not
// empty, replaces `path`; GRADZIP_TIMELINE_STEPS ("COUNT" or "FIRST:COUNT", decimal) replaces
// the steps (ErrorCode::invalid_argument naming the variable when malformed or COUNT is 0).
struct TimelineRequest {
  std::string path;  // empty: no timeline
  std::uint64_t first_step = 1;
  std::uint64_t steps = 1;

  bool records(std::uint64_t step) const noexcept {
    return !path.empty() && step >= first_step && step - first_step < steps;
  }
  bool is_last(std::uint64_t step) const noexcept { return records(step) && step - first_step == steps - 1; }
};
// `given.steps` = 0 is refused (invalid_argument) whatever the environment says: the one check
// of the Reducer's and the DDP hook's options.
TimelineRequest timeline_request_from_environment(TimelineRequest given);
// `given` with the steps of `text` ("COUNT" or "FIRST:COUNT"); errors name `source`.
TimelineRequest with_timeline_steps(TimelineRequest given, std::string_view text,
                                    std::string_view source);

// What the thread records into: a timeline and a track, or {nullptr, 0}.
struct ThreadTimeline {
  Timeline* timeline = nullptr;
  int track = 0;
};
ThreadTimeline current_thread_timeline() noexcept;

// Sets the thread's timeline and track for its lifetime (the previous one comes back at its
// end). A null timeline records nothing.
class TimelineScope {
 public:
  TimelineScope(Timeline* timeline, int track) noexcept;
  ~TimelineScope();
  TimelineScope(const TimelineScope&) = delete;
  TimelineScope& operator=(const TimelineScope&) = delete;

 private:
  ThreadTimeline previous_;
};

}  // namespace gradzip::collectives
