// The deadline policy (collectives/transport/deadline.h): parsing GRADZIP_TIMEOUT_S's text,
// resolving CommunicatorOptions, the grace window, and the current-operation context that
// timeout reports name. The behaviour on expiry runs under mpirun in
// tests/multirank/run_timeout_tests.py.
#include <gtest/gtest.h>

#include <cstdlib>
#include <limits>
#include <string>

#include "collectives/transport/deadline.h"
#include "gradzip/error.h"

namespace gradzip::collectives {
namespace {

ErrorCode code_of_parse(const char* text) {
  try {
    parse_timeout_seconds(text, "GRADZIP_TIMEOUT_S");
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("GRADZIP_TIMEOUT_S"), std::string::npos)
        << error.what();
    EXPECT_NE(std::string(error.what()).find(std::string("'") + text + "'"), std::string::npos)
        << error.what();
    return error.code();
  }
  return ErrorCode::internal;  // accepted: not what the callers below expect
}

TEST(TimeoutPolicy, ParsesWholeSecondsAndFractions) {
  EXPECT_EQ(parse_timeout_seconds("600", "GRADZIP_TIMEOUT_S"), 600.0);
  EXPECT_EQ(parse_timeout_seconds("2.5", "GRADZIP_TIMEOUT_S"), 2.5);
  EXPECT_EQ(parse_timeout_seconds("0.001", "GRADZIP_TIMEOUT_S"), 0.001);
  EXPECT_EQ(parse_timeout_seconds("1e3", "GRADZIP_TIMEOUT_S"), 1000.0);
}

TEST(TimeoutPolicy, RefusesTextThatIsNotAPositiveFiniteNumberNamingTheVariable) {
  for (const char* bad : {"", "abc", "10s", " 5", "5 ", "0", "-1", "-0.5", "inf", "nan", "1e999",
                          "0x"}) {
    SCOPED_TRACE(std::string("text '") + bad + "'");
    EXPECT_EQ(code_of_parse(bad), ErrorCode::invalid_argument);
  }
}

TEST(TimeoutPolicy, OptionsGiveTheDeadlineWhenTheVariableIsUnset) {
  if (std::getenv("GRADZIP_TIMEOUT_S") != nullptr) GTEST_SKIP() << "GRADZIP_TIMEOUT_S is set";
  CommunicatorOptions options;
  DeadlinePolicy policy = resolve_deadline_policy(options);
  EXPECT_EQ(policy.seconds, 600.0);
  EXPECT_EQ(policy.action, TimeoutAction::abort);
  options.timeout_seconds = -3;  // <= 0: the default
  EXPECT_EQ(resolve_deadline_policy(options).seconds, 600.0);
  options.timeout_seconds = 2.25;
  options.on_timeout = TimeoutAction::throw_error;
  policy = resolve_deadline_policy(options);
  EXPECT_EQ(policy.seconds, 2.25);
  EXPECT_EQ(policy.action, TimeoutAction::throw_error);
  options.timeout_seconds = std::numeric_limits<double>::infinity();
  EXPECT_THROW(resolve_deadline_policy(options), Error);
}

TEST(TimeoutPolicy, GraceWindowIsFivePercentCappedAtFiveSeconds) {
  EXPECT_DOUBLE_EQ(timeout_grace_seconds({3.0, TimeoutAction::abort}), 0.15);
  EXPECT_DOUBLE_EQ(timeout_grace_seconds({100.0, TimeoutAction::abort}), 5.0);
  EXPECT_DOUBLE_EQ(timeout_grace_seconds({600.0, TimeoutAction::abort}), 5.0);
}

TEST(TimeoutPolicy, CurrentOperationNamesTheInnermostCallAndItsPhase) {
  EXPECT_EQ(current_operation(), nullptr);
  EXPECT_EQ(describe_current_operation(), "no gradzip call (the transport was used directly)");
  {
    const OperationScope outer(CurrentOperation{"allreduce", "layer1.weight", 17, 42, "the call check"});
    EXPECT_EQ(describe_current_operation(),
              "allreduce 'layer1.weight' (step 17, call 42 of its communicator), in the call check");
    set_operation_phase("the data exchange");
    EXPECT_EQ(describe_current_operation(),
              "allreduce 'layer1.weight' (step 17, call 42 of its communicator), in the data exchange");
    {
      const OperationScope inner(CurrentOperation{"allgather", "w", 0, 1, ""});
      EXPECT_EQ(describe_current_operation(), "allgather 'w' (step 0, call 1 of its communicator)");
    }
    EXPECT_EQ(current_operation()->sequence, 42u);
  }
  EXPECT_EQ(current_operation(), nullptr);
  set_operation_phase("ignored outside a call");  // no-op, no crash
}

}  // namespace
}  // namespace gradzip::collectives
