// Shared-index random-k all-reduce. Every rank draws the same k indices (random-k keeps the
// shared seed: encode_context() does not mix the rank into it), so the k kept values of all
// ranks line up index by index and can be summed as a dense vector of k floats, without
// sending any index:
//   1. encode this rank's whole tensor once with the randk codec (the worker encoder,
//      job_encoder.h; element_offset 0);
//   2. read the k values out of the message payload as f32 (f16 values widen exactly);
//   3. sum the k-vectors of all ranks with ring_allreduce, codec `none`, no error feedback
//      (exact f32 sums in the ring's fixed chain order, the same bytes on every rank);
//   4. write the sums back into the message payload in the message's own value type: f32 as
//      they are; for values=fp16 messages rounded to f16, nearest even and saturating, as every
//      payload (kernels/cast_math.h: a sum beyond the f16 range becomes +-65504: choose
//      values=fp32 when sums can be that large), and decode the message into job.data: zeros
//      except at the k indices.
// Every rank decodes the same bytes (same header and key, the same summed values), so the
// result is identical on all ranks. At P == 1 the same steps give D(C(g + e)).
//
// On device memory (CUDA tensors over NCCL) the same steps stay on the device: the message is
// encoded into device memory, its k values are summed in place by the ring (f16 values widened
// into f32 scratch and rounded back, as above), and the message is decoded with the header and
// key this call's spec and random stream give (compressors/device_codec.h: device_decode_own,
// checked on the device in a stream-ordered call); no byte of it goes through host memory.
//
// Stats: the randk encode counts as this call's encode (its compression ratio is the codec's);
// the bytes sent and received are the inner ring's, and its whole time (its `none` encode and
// decode are copies that move the values) counts as communication.
#include <algorithm>
#include <cstring>
#include <span>
#include <memory>
#include <vector>

#include "collectives/collective_job.h"
#include "collectives/device_memory.h"
#include "collectives/job_encoder.h"
#include "compressors/device_codec.h"
#include "compressors/wire_format.h"
#include "gradzip/error.h"
#include "kernels/cast_math.h"

namespace gradzip::collectives {
namespace {

std::size_t value_bytes(DType values) { return values == DType::f16 ? 2 : 4; }

// Reads value j of the payload's value array as f32 (exact for f16).
float read_value(const std::byte* values, DType value_dtype, std::size_t j) {
  if (value_dtype == DType::f16) {
    std::uint16_t half;
    std::memcpy(&half, values + 2 * j, 2);
    return kernels::f16_bits_to_f32(half);
  }
  float value;
  std::memcpy(&value, values + 4 * j, 4);
  return value;
}

// Writes `value` as value j of the payload's value array (f16: round to nearest even).
void write_value(std::byte* values, DType value_dtype, std::size_t j, float value) {
  if (value_dtype == DType::f16) {
    const std::uint16_t half = kernels::f32_to_f16_bits(value);
    std::memcpy(values + 2 * j, &half, 2);
  } else {
    std::memcpy(values + 4 * j, &value, 4);
  }
}

// Step 3: the k-vectors of all ranks summed by the ring (codec `none`, no error feedback), its
// bytes and time added to the call's stats.
void sum_over_ranks(ReduceJob& job, std::span<float> sums) {
  CollectiveStats ring_stats;
  ReduceJob ring_job{job.transport, uncompressed_codec(), sums, job.name, nullptr, job.ctx,
                     ring_stats, job.device};
  ring_job.stream_ordered = job.stream_ordered;
  ring_job.sizes_known = job.stream_ordered;  // `none`: every message has its bound
  ring_allreduce(ring_job);
  job.stats.sent_header_bytes += ring_stats.sent_header_bytes;
  job.stats.sent_index_bytes += ring_stats.sent_index_bytes;
  job.stats.sent_payload_bytes += ring_stats.sent_payload_bytes;
  job.stats.received_bytes += ring_stats.received_bytes;
  job.stats.communicate_seconds +=
      ring_stats.encode_seconds + ring_stats.communicate_seconds + ring_stats.decode_seconds;
}

// The device path: the same four steps on device memory.
void randk_allreduce_on_device(ReduceJob& job) {
  const CompressionSpec& spec = job.codec.spec();
  const std::size_t count = job.data.size();
  const std::size_t capacity = job.codec.max_encoded_bytes(count);
  MessageBuffer message(job.device);
  message.resize(capacity);
  const EncodeContext ctx = encode_context(job, 0);
  {
    StageTimer timer(job.stats, Stage::encode);
    const ConstTensorView tensor(job.data.data(), count, DType::f32, job.device);
    const std::size_t bytes =
        job_encoder(job, ResidualRole::worker, count).encode(tensor, message.span(), ctx);
    GZ_REQUIRE(bytes == capacity, ErrorCode::internal, "randk_allreduce of '", job.name,
               "': a message of ", bytes, " bytes for ", count, " elements, expected ", capacity);
    count_encoded(job.stats, count, bytes);
  }
  const std::size_t k = spec.k_for(count);
  std::byte* const values = message.data() + compressors::kWireHeaderBytes + compressors::kRandkKeyBytes;
  if (spec.values == DType::f16) {
    const TensorView half_values{values, k, DType::f16, job.device};
    DeviceAllocation sums(std::max<std::size_t>(k, 1) * sizeof(float), job.device.index,
                          "randk_allreduce");
    auto* const d_sums = reinterpret_cast<float*>(sums.data());
    widen_on_device(half_values, 0, k, d_sums);
    sum_over_ranks(job, {d_sums, k});
    narrow_on_device(d_sums, 0, k, half_values, Narrowing::saturate);  // a payload, as on the host
  } else {
    sum_over_ranks(job, {reinterpret_cast<float*>(values), k});
  }
  StageTimer timer(job.stats, Stage::decode);
  compressors::device_decode_own(job.codec, message.span(),
                                   TensorView{job.data.data(), count, DType::f32, job.device}, ctx);
}

}  // namespace

void randk_allreduce(ReduceJob& job) {
  const CompressionSpec& spec = job.codec.spec();
  GZ_REQUIRE(spec.codec == CodecKind::randk, ErrorCode::invalid_argument, "randk_allreduce of '",
             job.name, "': the codec is '", job.codec.name(), "', not randk");
  if (job.device.kind == DeviceKind::cuda) return randk_allreduce_on_device(job);
  const std::size_t count = job.data.size();

  // 1. This rank's message.
  std::vector<std::byte> message(job.codec.max_encoded_bytes(count));
  std::size_t message_bytes = 0;
  {
    StageTimer timer(job.stats, Stage::encode);
    const ConstTensorView tensor(job.data.data(), count, DType::f32);
    const EncodeContext ctx = encode_context(job, 0);
    message_bytes = job_encoder(job, ResidualRole::worker, count).encode(tensor, message, ctx);
    count_encoded(job.stats, count, message_bytes);
  }
  message.resize(message_bytes);

  // 2. Its values, as f32. The codec wrote f16 values iff the spec says values=fp16.
  const compressors::WireHeader header = compressors::read_header_for(
      message, compressors::WireCodec::randk, count, "randk_allreduce");
  const std::size_t k = compressors::entry_count_of(header);
  const DType value_dtype = spec.values;
  GZ_REQUIRE(header.payload_bytes == compressors::kRandkKeyBytes + k * value_bytes(value_dtype),
             ErrorCode::internal, "randk_allreduce of '", job.name, "': the randk message of ",
             count, " elements holds ", header.payload_bytes, " payload bytes, expected ",
             compressors::kRandkKeyBytes, " + ", k, " x ", value_bytes(value_dtype));
  std::byte* const values =
      message.data() + compressors::kWireHeaderBytes + compressors::kRandkKeyBytes;
  std::vector<float> sums(k);
  for (std::size_t j = 0; j < k; ++j) sums[j] = read_value(values, value_dtype, j);

  // 3. Sum the k-vectors over all ranks.
  sum_over_ranks(job, sums);

  // 4. The sums back into the message, then the message into the tensor.
  for (std::size_t j = 0; j < k; ++j) write_value(values, value_dtype, j, sums[j]);
  StageTimer timer(job.stats, Stage::decode);
  job.codec.decode(message, TensorView{job.data.data(), count, DType::f32, Device{}});
}

}  // namespace gradzip::collectives
