// Placeholder until the algorithm lands: refuses with a clear error.
#include "collectives/collective_job.h"
#include "gradzip/error.h"

namespace gradzip::collectives {

void compressed_allgather(ReduceJob& job) {
  GZ_THROW(ErrorCode::unsupported, "compressed_allgather of '", job.name, "': not built yet");
}

}  // namespace gradzip::collectives
