// Placeholder until the algorithm lands: refuses with a clear error.
#include "collectives/collective_job.h"
#include "gradzip/error.h"

namespace gradzip::collectives {

void ring_allreduce(ReduceJob& job) {
  GZ_THROW(ErrorCode::unsupported, "ring_allreduce of '", job.name, "': not built yet");
}

void ring_reduce_scatter(ReduceJob& job) {
  GZ_THROW(ErrorCode::unsupported, "ring_reduce_scatter of '", job.name, "': not built yet");
}

}  // namespace gradzip::collectives
