// Placeholder until the algorithm lands: refuses with a clear error.
#include "collectives/collective_job.h"
#include "gradzip/error.h"

namespace gradzip::collectives {

void sra_allreduce(ReduceJob& job) {
  GZ_THROW(ErrorCode::unsupported, "sra_allreduce of '", job.name, "': not built yet");
}

void sra_reduce_scatter(ReduceJob& job) {
  GZ_THROW(ErrorCode::unsupported, "sra_reduce_scatter of '", job.name, "': not built yet");
}

}  // namespace gradzip::collectives
