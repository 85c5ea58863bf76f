// The link algo=auto's model is given (collectives/link_calibration.h): CommunicatorOptions'
// three fields and GRADZIP_LINK's text, parsed exactly and refused with an error that names
// what was wrong.
#include <gtest/gtest.h>

#include <limits>
#include <string>

#include "collectives/link_calibration.h"
#include "gradzip/error.h"
#include "tests/unit/test_support.h"

namespace gradzip {
namespace {

using collectives::given_link;
using collectives::LinkModel;
using collectives::parse_link_variable;

TEST(LinkOptions, GivenFieldsBecomeTheLinkAndZeroRateMeansMeasure) {
  const std::optional<LinkModel> link = given_link(25, 8, 4);
  ASSERT_TRUE(link.has_value());
  EXPECT_DOUBLE_EQ(link->latency_s, 25e-6);
  EXPECT_DOUBLE_EQ(link->bytes_per_s, 1e9);
  EXPECT_DOUBLE_EQ(link->exchange_bytes_per_s, 5e8);
  EXPECT_EQ(link->collective_latency_s, 0.0);
  EXPECT_FALSE(given_link(0, 0, 0).has_value());
}

TEST(LinkOptions, VariableTextWithTwoOrThreeFields) {
  const LinkModel two = parse_link_variable("20,10");
  EXPECT_DOUBLE_EQ(two.latency_s, 20e-6);
  EXPECT_DOUBLE_EQ(two.bytes_per_s, 1.25e9);
  EXPECT_EQ(two.exchange_bytes_per_s, 0.0);
  const LinkModel three = parse_link_variable("0.5,1e2,40");
  EXPECT_DOUBLE_EQ(three.latency_s, 0.5e-6);
  EXPECT_DOUBLE_EQ(three.bytes_per_s, 1.25e10);
  EXPECT_DOUBLE_EQ(three.exchange_bytes_per_s, 5e9);
}

TEST(LinkOptions, MalformedTextsAndValuesAreRefusedNamingWhat) {
  for (const char* text : {"", "20", "20,", ",10", "20,10,5,1", "a,10", "20,0", "20, 10", "-1,10",
                           "20,10,-5", "20,inf", "1e999,10"}) {
    SCOPED_TRACE(std::string("text '") + text + "'");
    std::string message;
    EXPECT_EQ(testing::error_code_of([&] { parse_link_variable(text); }, &message),
              ErrorCode::invalid_argument);
    EXPECT_NE(message.find("GRADZIP_LINK"), std::string::npos) << message;
  }
  struct Case {
    double latency_us, gbps, exchange_gbps;
    const char* names;
  };
  for (const Case& c : {Case{-1, 10, 0, "link_latency_us"}, Case{5, -2, 0, "link_gbps"},
                        Case{5, 10, -3, "link_exchange_gbps"},
                        Case{5, std::numeric_limits<double>::quiet_NaN(), 0, "link_gbps"},
                        Case{5, 0, 0, "without CommunicatorOptions::link_gbps"}}) {
    std::string message;
    EXPECT_EQ(testing::error_code_of([&] { given_link(c.latency_us, c.gbps, c.exchange_gbps); },
                                     &message),
              ErrorCode::invalid_argument)
        << c.names;
    EXPECT_NE(message.find(c.names), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace gradzip
