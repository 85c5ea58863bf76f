// Chrome trace events of one rank (contract in collectives/timeline.h).
#include "collectives/timeline.h"

#include <cstdlib>
#include <cstdio>
#include <fstream>
#include <optional>

#include "collectives/json_text.h"
#include "gradzip/error.h"
#include "kernels/tunables.h"

namespace gradzip::collectives {
namespace {

thread_local ThreadTimeline t_thread_timeline;

std::string event_head(std::string_view phase, std::string_view name, std::string_view category,
                       int pid, int track) {
  return detail::concat("{\"ph\":\"", phase, "\",\"name\":", json_quoted(name),
                        ",\"cat\":", json_quoted(category), ",\"pid\":", pid, ",\"tid\":", track);
}

std::string args_member(std::string_view args) {
  return args.empty() ? std::string() : detail::concat(",\"args\":{", args, "}");
}

}  // namespace

Timeline::Timeline(int rank)
    : rank_(rank),
      origin_(TimelineClock::now()),
      origin_epoch_us_(std::chrono::duration_cast<std::chrono::microseconds>(
                           std::chrono::system_clock::now().time_since_epoch())
                           .count()) {}

double Timeline::microseconds_at(TimelineClock::time_point at) const noexcept {
  return std::chrono::duration<double, std::micro>(at - origin_).count();
}

TimelineClock::time_point Timeline::time_at(double microseconds) const noexcept {
  return origin_ + std::chrono::duration_cast<TimelineClock::duration>(
                       std::chrono::duration<double, std::micro>(microseconds));
}

std::string Timeline::timestamp(TimelineClock::time_point at) const {
  char text[48];
  std::snprintf(text, sizeof text, "%.3f", microseconds_at(at));
  return text;
}

void Timeline::append(std::string event) {
  std::lock_guard lock(mutex_);
  events_.push_back(std::move(event));
}

void Timeline::name_track(int track, std::string_view name) {
  std::string event = event_head("M", "thread_name", "__metadata", rank_, track) +
                      detail::concat(",\"args\":{\"name\":", json_quoted(name), "}}");
  std::lock_guard lock(mutex_);
  events_.push_back(std::move(event));
  ++track_names_;
}

void Timeline::span(int track, std::string_view name, std::string_view category,
                    TimelineClock::time_point begin, TimelineClock::time_point end,
                    std::string_view args) {
  const double duration_us = std::chrono::duration<double, std::micro>(end - begin).count();
  append(event_head("X", name, category, rank_, track) +
         detail::concat(",\"ts\":", timestamp(begin), ",\"dur\":",
                        json_number(duration_us > 0 ? duration_us : 0.0, 12), args_member(args),
                        "}"));
}

void Timeline::instant(int track, std::string_view name, std::string_view category,
                       TimelineClock::time_point at, std::string_view args) {
  append(event_head("i", name, category, rank_, track) +
         detail::concat(",\"s\":\"t\",\"ts\":", timestamp(at), args_member(args), "}"));
}

void Timeline::async_span(std::string_view name, std::string_view category, std::uint64_t id,
                          TimelineClock::time_point begin, TimelineClock::time_point end,
                          std::string_view args) {
  append(event_head("b", name, category, rank_, 0) +
         detail::concat(",\"id\":", id, ",\"ts\":", timestamp(begin), args_member(args), "}"));
  append(event_head("e", name, category, rank_, 0) +
         detail::concat(",\"id\":", id, ",\"ts\":", timestamp(end < begin ? begin : end), "}"));
}

std::size_t Timeline::event_count() const {
  std::lock_guard lock(mutex_);
  return events_.size() - track_names_;
}

std::string Timeline::to_json() const {
  std::string out = "{\"traceEvents\":[\n";
  {
    std::lock_guard lock(mutex_);
    for (std::size_t i = 0; i < events_.size(); ++i) {
      out += events_[i];
      out += i + 1 < events_.size() ? ",\n" : "\n";
    }
  }
  return out + detail::concat("],\"displayTimeUnit\":\"ms\",\"otherData\":{\"rank\":", rank_,
                              ",\"origin_epoch_us\":", origin_epoch_us_, "}}\n");
}

void Timeline::write(const std::string& path) const {
  const std::string text = to_json();
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  file.write(text.data(), static_cast<std::streamsize>(text.size()));
  file.close();
  GZ_REQUIRE(file.good(), ErrorCode::io_error, "timeline: cannot write '", path, "'");
}

void Timeline::clear() {
  std::lock_guard lock(mutex_);
  events_.clear();
  track_names_ = 0;
}

std::string timeline_path_for_rank(std::string_view path, int rank, int ranks) {
  std::string out(path);
  constexpr std::string_view kRankField = "{rank}";
  if (const std::size_t at = out.find(kRankField); at != std::string::npos) {
    out.replace(at, kRankField.size(), std::to_string(rank));
    return out;
  }
  return ranks <= 1 ? out : insert_before_extension(out, ".rank" + std::to_string(rank));
}

std::string insert_before_extension(std::string_view path, std::string_view suffix) {
  std::string out(path);
  const std::size_t slash = out.find_last_of('/');
  const std::size_t dot = out.find_last_of('.');
  const bool has_extension = dot != std::string::npos && (slash == std::string::npos || dot > slash + 1);
  out.insert(has_extension ? dot : out.size(), suffix);
  return out;
}

TimelineRequest with_timeline_steps(TimelineRequest given, std::string_view text,
                                    std::string_view source) {
  const std::size_t colon = text.find(':');
  const std::optional<std::uint64_t> first =
      colon == std::string_view::npos ? std::optional<std::uint64_t>(given.first_step)
                                      : kernels::parse_unsigned_integer(text.substr(0, colon));
  const std::optional<std::uint64_t> count =
      kernels::parse_unsigned_integer(colon == std::string_view::npos ? text : text.substr(colon + 1));
  GZ_REQUIRE(first && count && *count > 0, ErrorCode::invalid_argument, source, "='", text,
             "': expected COUNT or FIRST:COUNT (decimal, COUNT at least 1)");
  given.first_step = *first;
  given.steps = *count;
  return given;
}

TimelineRequest timeline_request_from_environment(TimelineRequest given) {
  GZ_REQUIRE(given.steps > 0, ErrorCode::invalid_argument,
             "timeline_steps = 0 (record at least one step, or give no timeline path)");
  if (const std::string& path = kernels::tunable_value("GRADZIP_TIMELINE"); !path.empty())
    given.path = path;
  if (std::getenv("GRADZIP_TIMELINE_STEPS") != nullptr) {
    given = with_timeline_steps(given, kernels::tunable_value("GRADZIP_TIMELINE_STEPS"),
                                "GRADZIP_TIMELINE_STEPS");
  }
  return given;
}

ThreadTimeline current_thread_timeline() noexcept { return t_thread_timeline; }

TimelineScope::TimelineScope(Timeline* timeline, int track) noexcept
    : previous_(t_thread_timeline) {
  t_thread_timeline = ThreadTimeline{timeline, track};
}

TimelineScope::~TimelineScope() { t_thread_timeline = previous_; }

}  // namespace gradzip::collectives
