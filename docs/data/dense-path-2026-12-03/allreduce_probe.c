// MPI_Allreduce against MPI_Iallreduce + MPI_Wait on n floats (argv[1]): best of 6 rounds of 4 calls each,
// the two interleaved; rank 0 prints both in ms.
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank; MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  int n = atoi(argv[1]);
  float* x = malloc(sizeof(float) * n);
  for (int i = 0; i < n; ++i) x[i] = 1.0f;
  double best_a = 1e9, best_i = 1e9;
  for (int round = 0; round < 6; ++round) {
    MPI_Barrier(MPI_COMM_WORLD);
    double t = MPI_Wtime();
    for (int r = 0; r < 4; ++r) MPI_Allreduce(MPI_IN_PLACE, x, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    t = (MPI_Wtime() - t) / 4; if (t < best_a) best_a = t;
    MPI_Barrier(MPI_COMM_WORLD);
    t = MPI_Wtime();
    for (int r = 0; r < 4; ++r) { MPI_Request q; MPI_Iallreduce(MPI_IN_PLACE, x, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &q); MPI_Wait(&q, MPI_STATUS_IGNORE); }
    t = (MPI_Wtime() - t) / 4; if (t < best_i) best_i = t;
  }
  if (rank == 0) printf("n=%d allreduce %.3f ms iallreduce %.3f ms\n", n, best_a * 1e3, best_i * 1e3);
  MPI_Finalize();
}
