// The MPI entry points of the public Communicator: a communicator over MPI_COMM_WORLD or over an
// application communicator, each on gradzip's own duplicate (MpiTransport dups it).
#include "collectives/communicator_state.h"
#include "collectives/transport/mpi/mpi_transport.h"
#include "gradzip/communicator.h"
#include "gradzip/error.h"

namespace gradzip {

Communicator Communicator::world(CommunicatorOptions options) {
  collectives::ensure_mpi_initialized();
  return collectives::make_communicator(std::make_unique<collectives::MpiTransport>(MPI_COMM_WORLD),
                                        std::move(options));
}

Communicator Communicator::from_mpi(int fortran_comm_handle, CommunicatorOptions options) {
  collectives::ensure_mpi_initialized();
  const MPI_Comm comm = MPI_Comm_f2c(static_cast<MPI_Fint>(fortran_comm_handle));
  GZ_REQUIRE(comm != MPI_COMM_NULL, ErrorCode::invalid_argument, "Communicator::from_mpi: handle ",
             fortran_comm_handle, " is MPI_COMM_NULL");
  return collectives::make_communicator(std::make_unique<collectives::MpiTransport>(comm),
                                        std::move(options));
}

}  // namespace gradzip
