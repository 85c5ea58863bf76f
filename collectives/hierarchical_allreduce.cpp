// Placeholder until the algorithm lands: refuses with a clear error.
#include "collectives/collective_job.h"
#include "gradzip/error.h"

namespace gradzip::collectives {

void hierarchical_allreduce(ReduceJob& job, Transport& /*intra*/, Transport& /*inter*/,
                            Algorithm /*inner*/) {
  GZ_THROW(ErrorCode::unsupported, "hierarchical_allreduce of '", job.name, "': not built yet");
}

}  // namespace gradzip::collectives
