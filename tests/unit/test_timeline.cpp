// collectives/timeline.h: the file each rank writes, the steps GRADZIP_TIMELINE_STEPS selects,
// what StageTimer records under a TimelineScope (and nothing without one), and the events'
// JSON. The Reducer's whole timeline is checked across ranks by tests/bench/check_timeline.py.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

#include "collectives/collective_job.h"
#include "collectives/timeline.h"
#include "gradzip/error.h"

namespace gradzip::collectives {
namespace {

TEST(Timeline, EachRankGetsItsOwnFile) {
  EXPECT_EQ(timeline_path_for_rank("trace.json", 0, 1), "trace.json");
  EXPECT_EQ(timeline_path_for_rank("trace.json", 0, 2), "trace.rank0.json");
  EXPECT_EQ(timeline_path_for_rank("out/trace.json", 3, 4), "out/trace.rank3.json");
  // The extension is the last component's: a dot in a folder name is not one.
  EXPECT_EQ(timeline_path_for_rank("run.v2/trace", 2, 3), "run.v2/trace.rank2");
  EXPECT_EQ(timeline_path_for_rank("run/.trace", 1, 2), "run/.trace.rank1");
  // "{rank}" is replaced, whatever the world size, and nothing is added.
  EXPECT_EQ(timeline_path_for_rank("out/{rank}/trace.json", 3, 4), "out/3/trace.json");
  EXPECT_EQ(timeline_path_for_rank("t-{rank}.json", 0, 1), "t-0.json");
  EXPECT_EQ(insert_before_extension("a/b.c.json", ".spec1"), "a/b.c.spec1.json");
}

TEST(Timeline, StepsAreCountOrFirstColonCount) {
  const TimelineRequest given{"t.json", 1, 1};
  TimelineRequest request = with_timeline_steps(given, "5", "VAR");
  EXPECT_EQ(request.first_step, 1u);
  EXPECT_EQ(request.steps, 5u);
  request = with_timeline_steps(given, "10:3", "VAR");
  EXPECT_EQ(request.first_step, 10u);
  EXPECT_EQ(request.steps, 3u);
  EXPECT_FALSE(request.records(9));
  EXPECT_TRUE(request.records(10));
  EXPECT_TRUE(request.records(12));
  EXPECT_FALSE(request.records(13));
  EXPECT_FALSE(request.is_last(11));
  EXPECT_TRUE(request.is_last(12));
  request.path.clear();
  EXPECT_FALSE(request.records(10)) << "no path: nothing is recorded";

  for (const char* bad : {"", "x", "3:", ":2", "2:0", "0", "-1", "1:2:3", " 2", "2 "}) {
    try {
      with_timeline_steps(given, bad, "GRADZIP_TIMELINE_STEPS");
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& error) {
      EXPECT_EQ(error.code(), ErrorCode::invalid_argument);
      EXPECT_NE(std::string(error.what()).find("GRADZIP_TIMELINE_STEPS='" + std::string(bad) + "'"),
                std::string::npos)
          << error.what();
    }
  }
}

TEST(Timeline, StagesAreRecordedOnlyInsideAScopeWithTheBytesTheyCounted) {
  Timeline timeline(3);
  CollectiveStats stats;
  {
    StageTimer outside(stats, Stage::encode);
    count_encoded(stats, 10, 24);
  }
  EXPECT_EQ(timeline.event_count(), 0u) << "no scope: nothing recorded";
  EXPECT_GT(stats.encode_seconds, 0.0);

  {
    const TimelineScope scope(&timeline, 7);
    EXPECT_EQ(current_thread_timeline().timeline, &timeline);
    EXPECT_EQ(current_thread_timeline().track, 7);
    {
      StageTimer encode(stats, Stage::encode);
      count_encoded(stats, 100, 64);  // 400 input bytes, 64 message bytes
    }
    {
      StageTimer communicate(stats, Stage::communicate);
      communicate.note_bytes(96);
      stats.received_bytes += 40;
    }
    {
      StageTimer total(stats, Stage::total);  // run_call records calls: no stage span
    }
    {
      const TimelineScope off(nullptr, 0);  // an inner scope without a timeline records nothing
      StageTimer decode(stats, Stage::decode);
    }
  }
  EXPECT_EQ(current_thread_timeline().timeline, nullptr) << "the scope's end restores none";
  ASSERT_EQ(timeline.event_count(), 2u);
  const std::string json = timeline.to_json();
  EXPECT_NE(json.find("{\"ph\":\"X\",\"name\":\"encode\",\"cat\":\"stage\",\"pid\":3,\"tid\":7,"),
            std::string::npos)
      << json;
  EXPECT_NE(json.find("\"args\":{\"encoded_input_bytes\":400,\"encoded_message_bytes\":64}"),
            std::string::npos)
      << json;
  EXPECT_NE(json.find("\"name\":\"communicate\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"args\":{\"bytes\":96,\"received_bytes\":40}"), std::string::npos) << json;
  EXPECT_EQ(json.find("\"decode\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"otherData\":{\"rank\":3,\"origin_epoch_us\":"), std::string::npos) << json;
}

TEST(Timeline, SpansInstantsAndAsyncSpansAsTraceEvents) {
  Timeline timeline(1);
  const auto t0 = TimelineClock::now();
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  const auto t1 = TimelineClock::now();
  timeline.name_track(0, "training \"loop\"");
  timeline.span(2, "a\\b", "task", t0, t1, "\"bytes\":5");
  timeline.instant(0, "mark_ready w", "ready", t1);
  timeline.async_span("bucket 0", "bucket", 9, t1, t0);  // an end before the begin is clamped
  const std::string json = timeline.to_json();
  EXPECT_NE(json.find("\"args\":{\"name\":\"training \\\"loop\\\"\"}"), std::string::npos) << json;
  EXPECT_NE(json.find("\"name\":\"a\\\\b\",\"cat\":\"task\",\"pid\":1,\"tid\":2,\"ts\":"),
            std::string::npos)
      << json;
  // The span lasts the 2 ms slept, at least; its duration is in microseconds.
  const std::size_t at = json.find("\"dur\":");
  ASSERT_NE(at, std::string::npos);
  const double duration_us = std::stod(json.substr(at + 6));
  EXPECT_GE(duration_us, 2000.0);
  EXPECT_LT(duration_us, 2e6);
  EXPECT_NE(json.find("\"ph\":\"i\",\"name\":\"mark_ready w\",\"cat\":\"ready\",\"pid\":1,\"tid\":0,\"s\":\"t\""),
            std::string::npos)
      << json;
  const std::size_t begin = json.find("\"ph\":\"b\"");
  const std::size_t end = json.find("\"ph\":\"e\"");
  ASSERT_NE(begin, std::string::npos);
  ASSERT_NE(end, std::string::npos);
  const auto ts_after = [&](std::size_t from) {
    return std::stod(json.substr(json.find("\"ts\":", from) + 5));
  };
  EXPECT_EQ(ts_after(begin), ts_after(end)) << json;
  EXPECT_NE(json.find("\"id\":9"), std::string::npos);
  EXPECT_EQ(timeline.event_count(), 4u) << "track names are not counted";
  timeline.clear();
  EXPECT_EQ(timeline.event_count(), 0u);
}

TEST(Timeline, WriteNamesAPathItCannotWrite) {
  Timeline timeline(0);
  try {
    timeline.write("/nonexistent-folder-of-gradzip/trace.json");
    ADD_FAILURE() << "wrote into a folder that does not exist";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::io_error);
    EXPECT_NE(std::string(error.what()).find("/nonexistent-folder-of-gradzip/trace.json"),
              std::string::npos)
        << error.what();
  }
}

}  // namespace
}  // namespace gradzip::collectives
