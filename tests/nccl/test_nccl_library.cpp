// NCCL resolved at run time (collectives/transport/nccl/nccl_library.h): which library each
// search step finds, and the errors when none is usable. Needs no GPU: loading NCCL, its
// version and its error strings work without a device. Each case runs in a process of its own
// (gtest_discover_tests), so "already loaded" means loaded by that case.
#include <gtest/gtest.h>

#include <string>

#include "collectives/transport/nccl/nccl_library.h"
#include "gradzip/error.h"

namespace gradzip::collectives {
namespace {

NcclSearch only_configured() {
  NcclSearch search;
  search.already_loaded = false;
  search.loader_search = false;
  search.configured = default_nccl_search().configured;
  return search;
}

void expect_every_function(const NcclApi& api) {
  EXPECT_NE(api.ncclGetVersion, nullptr);
  EXPECT_NE(api.ncclGetUniqueId, nullptr);
  EXPECT_NE(api.ncclGetErrorString, nullptr);
  EXPECT_NE(api.ncclGetLastError, nullptr);
  EXPECT_NE(api.ncclCommInitRank, nullptr);
  EXPECT_NE(api.ncclCommInitAll, nullptr);
  EXPECT_NE(api.ncclCommSplit, nullptr);
  EXPECT_NE(api.ncclCommDestroy, nullptr);
  EXPECT_NE(api.ncclCommAbort, nullptr);
  EXPECT_NE(api.ncclCommGetAsyncError, nullptr);
  EXPECT_NE(api.ncclCommCount, nullptr);
  EXPECT_NE(api.ncclCommCuDevice, nullptr);
  EXPECT_NE(api.ncclCommUserRank, nullptr);
  EXPECT_NE(api.ncclAllReduce, nullptr);
  EXPECT_NE(api.ncclAllGather, nullptr);
  EXPECT_NE(api.ncclSend, nullptr);
  EXPECT_NE(api.ncclRecv, nullptr);
  EXPECT_NE(api.ncclGroupStart, nullptr);
  EXPECT_NE(api.ncclGroupEnd, nullptr);
}

template <typename Call>
std::string unsupported_error_of(Call call) {
  try {
    call();
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::unsupported) << error.what();
    return error.what();
  }
  ADD_FAILURE() << "no gradzip::Error was thrown";
  return {};
}

TEST(NcclLibrary, TheProcessWideLibraryIsNccl218OrNewerAndLoadedOnce) {
  const NcclApi& api = nccl_api();
  EXPECT_GE(api.version, 21800);
  EXPECT_NE(api.path.find("libnccl"), std::string::npos) << api.path;
  expect_every_function(api);
  int version = 0;
  ASSERT_EQ(api.ncclGetVersion(&version), ncclSuccess);
  EXPECT_EQ(version, api.version);
  EXPECT_STRNE(api.ncclGetErrorString(ncclInvalidArgument), "");
  EXPECT_EQ(&nccl_api(), &api);
}

TEST(NcclLibrary, TheConfiguredLibraryIsTheLastResort) {
  const NcclSearch search = only_configured();
  if (search.configured.empty()) GTEST_SKIP() << "this build recorded no NCCL path";
  const NcclApi api = load_nccl_library(search);
  EXPECT_EQ(api.found_by, "found at configure time");
  EXPECT_GE(api.version, 21800);
}

TEST(NcclLibrary, ALibraryAlreadyInTheProcessComesFirst) {
  NcclSearch search = only_configured();
  if (search.configured.empty()) GTEST_SKIP() << "this build recorded no NCCL path";
  const NcclApi first = load_nccl_library(search);  // now in the process
  search.already_loaded = true;
  search.environment = "/nonexistent/not-consulted/libnccl.so.2";
  const NcclApi again = load_nccl_library(search);
  EXPECT_EQ(again.found_by, "already loaded");
  EXPECT_EQ(again.path, first.path);
  EXPECT_EQ(again.ncclAllReduce, first.ncclAllReduce);
}

TEST(NcclLibrary, GradzipNcclLibraryIsTakenOrRefusedButNeverPassedOver) {
  NcclSearch search = only_configured();
  if (search.configured.empty()) GTEST_SKIP() << "this build recorded no NCCL path";
  search.environment = search.configured;
  search.configured.clear();
  EXPECT_EQ(load_nccl_library(search).found_by, "GRADZIP_NCCL_LIBRARY");

  search.environment = "/nonexistent/gradzip-test/libnccl.so.2";
  search.configured = default_nccl_search().configured;  // usable, yet not tried
  search.loader_search = true;
  const std::string message = unsupported_error_of([&] { load_nccl_library(search); });
  EXPECT_NE(message.find("GRADZIP_NCCL_LIBRARY"), std::string::npos) << message;
  EXPECT_NE(message.find("/nonexistent/gradzip-test/libnccl.so.2"), std::string::npos) << message;
  EXPECT_EQ(message.find("configure time"), std::string::npos) << message;
}

TEST(NcclLibrary, CandidatesAreTriedInOrderAndEachFailureIsNamed) {
  NcclSearch search = only_configured();
  if (search.configured.empty()) GTEST_SKIP() << "this build recorded no NCCL path";
  search.candidates = {"/nonexistent/first/libnccl.so.2", search.configured};
  search.configured.clear();
  const NcclApi api = load_nccl_library(search);
  EXPECT_EQ(api.found_by, "registered candidate");

  // A library that is not NCCL: refused for what it lacks; nothing usable left: every place
  // tried is in the message.
  search.candidates = {"/nonexistent/first/libnccl.so.2", "libm.so.6"};
  const std::string message = unsupported_error_of([&] { load_nccl_library(search); });
  EXPECT_NE(message.find("/nonexistent/first/libnccl.so.2"), std::string::npos) << message;
  EXPECT_NE(message.find("libm.so.6"), std::string::npos) << message;
  EXPECT_NE(message.find("lacks ncclGetVersion"), std::string::npos) << message;
  EXPECT_NE(message.find("GRADZIP_NCCL_LIBRARY"), std::string::npos) << message;  // the hint
}

}  // namespace
}  // namespace gradzip::collectives
