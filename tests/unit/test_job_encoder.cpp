// collectives/job_encoder.h: the residual keys are the checkpointed ones, an encoder without
// error feedback is the codec, and one with it is the error-feedback decorator bound to its
// role's residual (registered, placed and updated there and nowhere else).
#include <gtest/gtest.h>

#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "collectives/collective_job.h"
#include "collectives/job_encoder.h"
#include "collectives/transport/self_transport.h"
#include "error_feedback/error_feedback_codec.h"
#include "error_feedback/residual_store.h"
#include "gradzip/codec.h"
#include "gradzip/communicator.h"

namespace gradzip::collectives {
namespace {

using error_feedback::ResidualStore;

std::vector<float> ramp(std::size_t n) {
  std::vector<float> values(n);
  for (std::size_t i = 0; i < n; ++i) values[i] = 0.37f * static_cast<float>(i) - 1.1f;
  return values;
}

TEST(ResidualKey, EveryRoleKeepsItsCheckpointedKey) {
  // Checkpoints hold these strings: a change would orphan saved residuals.
  EXPECT_EQ(residual_key(ResidualRole::worker, "layer.w"), "layer.w");
  EXPECT_EQ(residual_key(ResidualRole::sra_server, "layer.w"), "sra-server:layer.w");
  EXPECT_EQ(residual_key(ResidualRole::tree_root, "layer.w"), "tree-root:layer.w");
  EXPECT_EQ(residual_key(ResidualRole::halving_step, "layer.w", 3), "rhd-step3:layer.w");
  EXPECT_EQ(residual_key(ResidualRole::halving_owner, "layer.w"), "rhd-owner:layer.w");
  EXPECT_EQ(allgather_job_name("layer.w"), "allgather:layer.w");
  EXPECT_EQ(hierarchical_shard_job_name("layer.w"), "layer.w@hier");
}

TEST(JobEncoder, WithoutErrorFeedbackItIsTheCodec) {
  SelfTransport transport;
  const auto codec = make_codec("qsgd:bits=4,ef=off");
  std::vector<float> data = ramp(100);
  CollectiveStats stats;
  ReduceJob job{transport, *codec, data, "t", /*residuals=*/nullptr, EncodeContext{7, 2, 5, 0}, stats};
  JobEncoder encoder = job_encoder(job, ResidualRole::sra_server, data.size());
  EXPECT_FALSE(encoder.fills_decoded());
  encoder.register_residual();  // nothing to register: must not throw
  encoder.place_in_worker(0);

  const ConstTensorView view(data.data(), data.size(), DType::f32);
  std::vector<std::byte> expected(codec->max_encoded_bytes(data.size()));
  std::vector<std::byte> got(expected.size());
  const EncodeContext ctx{7, 2, 5, 0};
  expected.resize(codec->encode(view, expected, ctx));
  std::vector<float> decoded(data.size(), -9.0f);
  got.resize(encoder.encode(view, got, ctx, decoded));
  EXPECT_EQ(got, expected);
  EXPECT_EQ(decoded, std::vector<float>(data.size(), -9.0f)) << "decoded is left alone";
}

TEST(JobEncoder, WithErrorFeedbackItUpdatesItsRolesResidualOnly) {
  SelfTransport transport;
  const auto codec = make_codec("sign");
  const std::size_t n = 64, chunk_begin = 16, chunk_count = 24;
  std::vector<float> data = ramp(n);
  CollectiveStats stats;
  ResidualStore store(1, 0, ResizePolicy::error);
  ReduceJob job{transport, *codec, data, "t", &store, EncodeContext{7, 2, 5, 0}, stats};

  // The reference: the decorator itself, on a store of its own, with the role's key.
  ResidualStore reference_store(1, 0, ResizePolicy::error);
  error_feedback::ErrorFeedbackCodec reference(
      std::shared_ptr<const Codec>(std::shared_ptr<const Codec>(), codec.get()), reference_store);

  JobEncoder encoder = job_encoder(job, ResidualRole::sra_server, chunk_count);
  EXPECT_TRUE(encoder.fills_decoded());
  encoder.register_residual();
  ASSERT_TRUE(store.contains("sra-server:t"));
  EXPECT_EQ(store.residual("sra-server:t").size(), chunk_count);
  EXPECT_FALSE(store.contains("t")) << "only the role's residual is registered";

  const ConstTensorView chunk(data.data() + chunk_begin, chunk_count, DType::f32);
  const EncodeContext ctx{7, 2, 5, 0};
  for (int call = 0; call < 2; ++call) {  // the second call reads the first one's residual
    std::vector<std::byte> expected(codec->max_encoded_bytes(chunk_count));
    std::vector<std::byte> got(expected.size());
    std::vector<float> expected_decoded(chunk_count), decoded(chunk_count);
    expected.resize(reference.encode_chunk("sra-server:t", chunk_count, chunk, expected, ctx,
                                           expected_decoded));
    got.resize(encoder.encode(chunk, got, ctx, decoded));
    EXPECT_EQ(got, expected) << "call " << call;
    EXPECT_EQ(decoded, expected_decoded) << "call " << call;
    const std::span<const float> residual = store.residual("sra-server:t");
    const std::span<const float> reference_residual = reference_store.residual("sra-server:t");
    EXPECT_TRUE(std::equal(residual.begin(), residual.end(), reference_residual.begin()));
    bool any_nonzero = false;
    for (float e : residual) any_nonzero |= e != 0.0f;
    EXPECT_TRUE(any_nonzero) << "sign drops magnitudes: the residual must hold them";
  }

  // Placed at chunk_begin inside the worker residual: folding moves it there, element by element.
  encoder.place_in_worker(chunk_begin);
  const std::vector<float> server(store.residual("sra-server:t").begin(),
                                  store.residual("sra-server:t").end());
  EXPECT_EQ(store.fold_into("t", n), 1u);
  const std::span<const float> worker = store.residual("t");
  for (std::size_t i = 0; i < n; ++i) {
    const bool inside = i >= chunk_begin && i < chunk_begin + chunk_count;
    EXPECT_EQ(worker[i], inside ? server[i - chunk_begin] : 0.0f) << "element " << i;
  }
}

TEST(JobEncoder, TheWorkerRoleIsNeverPlacedInItself) {
  SelfTransport transport;
  const auto codec = make_codec("sign");
  std::vector<float> data = ramp(8);
  CollectiveStats stats;
  ResidualStore store(1, 0, ResizePolicy::error);
  ReduceJob job{transport, *codec, data, "t", &store, EncodeContext{}, stats};
  JobEncoder encoder = job_encoder(job, ResidualRole::worker, data.size());
  encoder.register_residual();
  encoder.place_in_worker(0);  // a self-placement would make fold_into loop or refuse
  EXPECT_EQ(store.fold_into("t", data.size()), 0u);
}

}  // namespace
}  // namespace gradzip::collectives
