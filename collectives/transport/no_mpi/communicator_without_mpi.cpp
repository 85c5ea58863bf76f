// A build without MPI still links: the MPI entry points say clearly that they are missing.
#include "gradzip/communicator.h"
#include "gradzip/error.h"

namespace gradzip {

Communicator Communicator::world(CommunicatorOptions /*options*/) {
  GZ_THROW(ErrorCode::unsupported,
           "Communicator::world: this gradzip was built without MPI (GRADZIP_WITH_MPI)");
}

Communicator Communicator::from_mpi(int /*fortran_comm_handle*/, CommunicatorOptions /*options*/) {
  GZ_THROW(ErrorCode::unsupported,
           "Communicator::from_mpi: this gradzip was built without MPI (GRADZIP_WITH_MPI)");
}

}  // namespace gradzip
