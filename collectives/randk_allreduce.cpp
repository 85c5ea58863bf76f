// Placeholder until the algorithm lands: refuses with a clear error.
#include "collectives/collective_job.h"
#include "gradzip/error.h"

namespace gradzip::collectives {

void randk_allreduce(ReduceJob& job) {
  GZ_THROW(ErrorCode::unsupported, "randk_allreduce of '", job.name, "': not built yet");
}

}  // namespace gradzip::collectives
