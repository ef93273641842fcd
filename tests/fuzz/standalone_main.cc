// Runs a fuzz target's entry point without libFuzzer (builds with any
// compiler): on each file named on the command line, or, with none, on a few
// fixed inputs, so that ctest checks that the target links and runs.
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int main(int argc, char** argv) {
  if (argc < 2) {
    const std::vector<std::vector<uint8_t>> inputs = {
        {}, {0}, {1}, {0, 0x10, 0, 0, 0, 1, 2, 3}, {1, 0x10, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8}};
    for (const auto& in : inputs) LLVMFuzzerTestOneInput(in.data(), in.size());
    return 0;
  }
  for (int i = 1; i < argc; ++i) {
    std::ifstream f(argv[i], std::ios::binary);
    if (!f) {
      std::fprintf(stderr, "cannot read %s\n", argv[i]);
      return 1;
    }
    const std::vector<uint8_t> in{std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
    LLVMFuzzerTestOneInput(in.data(), in.size());
  }
  return 0;
}
