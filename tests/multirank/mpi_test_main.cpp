// main() of the multi-rank test executables: MPI around GoogleTest. Every rank runs every test;
// the process exits non-zero if any test failed on this rank, and rank 0 alone prints the
// GoogleTest report so mpirun's output stays readable (other ranks print failures only).
#include <gtest/gtest.h>
#include <mpi.h>

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    // Failures still reach stderr through GoogleTest's assertion messages on every rank.
    struct FailurePrinter : ::testing::EmptyTestEventListener {
      int rank;
      explicit FailurePrinter(int r) : rank(r) {}
      void OnTestPartResult(const ::testing::TestPartResult& result) override {
        if (result.failed())
          std::fprintf(stderr, "[rank %d] %s:%d: %s\n", rank, result.file_name(),
                       result.line_number(), result.summary());
      }
    };
    listeners.Append(new FailurePrinter(rank));
  }
  const int failed = RUN_ALL_TESTS();
  // Every rank learns whether any rank failed, so the exit code is the same everywhere.
  int any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return any_failed != 0 ? 1 : 0;
}
