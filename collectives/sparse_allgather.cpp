// Placeholder until the algorithm lands: refuses with a clear error.
#include "collectives/collective_job.h"
#include "gradzip/error.h"

namespace gradzip::collectives {

void sparse_allgather_allreduce(ReduceJob& job) {
  GZ_THROW(ErrorCode::unsupported, "sparse_allgather_allreduce of '", job.name, "': not built yet");
}

}  // namespace gradzip::collectives
