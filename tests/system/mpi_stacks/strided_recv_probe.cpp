// Does this MPI stack deliver large messages sent from contiguous memory into
// a strided receive type intact? Open MPI 4.1.4's TCP BTL does not
// (docs/design.md, "Transfers land in contiguous blocks"); the library never
// receives that way. Rank 0 sends ROUNDS messages of two BLOCK-byte blocks
// from contiguous memory; rank 1 receives each into an hvector whose blocks
// lie 2 x BLOCK apart, and counts the floats that arrive wrong. Run it across
// nodes (tools/vcluster/vcluster run -np 2 ...): on one machine the path under
// test is not taken. Prints "wrong V of N values" on rank 1; exit 0 either way.
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const int block_bytes = argc > 1 ? std::atoi(argv[1]) : 1 << 20;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 20;
  const int n = block_bytes / static_cast<int>(sizeof(float));
  MPI_Datatype strided = MPI_DATATYPE_NULL;
  MPI_Type_create_hvector(2, n, 2 * static_cast<MPI_Aint>(block_bytes), MPI_FLOAT, &strided);
  MPI_Type_commit(&strided);
  long long wrong = 0, total = 0;
  for (int r = 0; r < rounds; ++r) {
    if (rank == 0) {
      std::vector<float> send(2 * static_cast<size_t>(n));
      for (size_t i = 0; i < send.size(); ++i) send[i] = static_cast<float>(r * 7 + static_cast<int>(i % 100003));
      MPI_Send(send.data(), 2 * n, MPI_FLOAT, 1, r, MPI_COMM_WORLD);
    } else if (rank == 1) {
      std::vector<float> recv(4 * static_cast<size_t>(n), -1.0f);
      MPI_Recv(recv.data(), 1, strided, 0, r, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      for (int b = 0; b < 2; ++b)
        for (int i = 0; i < n; ++i) {
          const size_t at = static_cast<size_t>(b) * 2 * n + i;
          const size_t sent = static_cast<size_t>(b) * n + i;
          wrong += recv[at] != static_cast<float>(r * 7 + static_cast<int>(sent % 100003));
          ++total;
        }
    }
  }
  if (rank == 1)
    std::printf("strided receive of %d x 2 blocks of %d bytes: wrong %lld of %lld values\n", rounds, block_bytes, wrong,
                total);
  MPI_Type_free(&strided);
  MPI_Finalize();
  return 0;
}
