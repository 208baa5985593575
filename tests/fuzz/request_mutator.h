// Requests to start from and ways to break them, shared by the bad-bytes test
// (tests/server/wire/bad_bytes_test.cc) and the fuzzer (request_fuzzer.cc, its custom mutator
// and its seed corpus).
//
// Note [Mutating requests]
// Bytes flipped at random mostly make a GradRequest that does not parse, which tests the
// parse but little behind it. So there are two kinds of edit. MutateBytes works on the bytes
// (bits flipped, varint and length edges, ranges cut or repeated, the end cut off), for the
// parsers. MutateField works on the parsed message through protobuf's reflection, anywhere in
// it: a number set to an edge, a string set to another word (the request's own names, the op
// set's names, strings at and past the limits), bytes cut or lengthened, an enum set to any
// number, a message cleared, an element of a repeated field removed or repeated. Its requests
// parse, so they reach validation, the limits and the ops. Both take their randomness from the
// caller's generator, so a seed reproduces a run.
//
// Thread safety: the functions share no state; each call uses only its arguments.

#ifndef GRADSERVE_TESTS_FUZZ_REQUEST_MUTATOR_H_
#define GRADSERVE_TESTS_FUZZ_REQUEST_MUTATOR_H_

#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "google/protobuf/message.h"

namespace gradserve::testing {

struct SeedRequest {
  std::string name;   // "grad_tiny", "every_op", "examples/mlp", ...
  std::string bytes;  // a serialized gradserve.v1.GradRequest
};

// The requests to mutate, always in the same order: the load tester's grad_tiny, a 20 KiB
// payload (big enough for a stream to leave its bytes in the chunks), every *.json of
// test_data_dir (tests/server/data: every op, a hook, detach, two backward calls) and of
// examples_dir (checkpoints, grad ops, conv2d, cross_entropy, ...), each sorted by name.
// INVALID_ARGUMENT if a file is no GradRequest in protobuf JSON.
absl::StatusOr<std::vector<SeedRequest>> SeedRequests(const std::string& examples_dir,
                                                      const std::string& test_data_dir);

// One to four random edits of bytes (Note [Mutating requests]).
std::string MutateBytes(std::string bytes, std::mt19937_64& rng);

// Appends every string field's value of message and the messages below it (value names, op
// names, attribute names and values) to words.
void CollectWords(const google::protobuf::Message& message, std::vector<std::string>* words);

// One edit through reflection of a field picked at random anywhere in message (Note [Mutating
// requests]); a string becomes one of words (left alone if words is empty).
void MutateField(google::protobuf::Message* message, const std::vector<std::string>& words,
                 std::mt19937_64& rng);

}  // namespace gradserve::testing

#endif  // GRADSERVE_TESTS_FUZZ_REQUEST_MUTATOR_H_
