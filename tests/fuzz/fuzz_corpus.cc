// fuzz_corpus DIR: writes the fuzzer's seed corpus into DIR, one file per seed request (Note
// [Mutating requests]): the same requests the bad-bytes test starts from, serialized, so that
// no binary is committed. scripts/fuzz runs it before each run.

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tests/fuzz/request_mutator.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_corpus DIR\n");
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) {
    std::fprintf(stderr, "fuzz_corpus: %s: %s\n", dir.c_str(), error.message().c_str());
    return 1;
  }
  const absl::StatusOr<std::vector<gradserve::testing::SeedRequest>> seeds =
      gradserve::testing::SeedRequests(GRADSERVE_EXAMPLES_DIR, GRADSERVE_TEST_DATA_DIR);
  if (!seeds.ok()) {
    std::fprintf(stderr, "fuzz_corpus: %s\n", seeds.status().ToString().c_str());
    return 1;
  }
  for (const gradserve::testing::SeedRequest& seed : *seeds) {
    std::ofstream out(dir / ("seed_" + seed.name), std::ios::binary | std::ios::trunc);
    out.write(seed.bytes.data(), static_cast<std::streamsize>(seed.bytes.size()));
    if (!out) {
      std::fprintf(stderr, "fuzz_corpus: could not write %s\n", (dir / seed.name).c_str());
      return 1;
    }
  }
  std::printf("fuzz_corpus: %zu seed requests in %s\n", seeds->size(), dir.c_str());
  return 0;
}
