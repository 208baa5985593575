#include "tests/fuzz/request_mutator.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "client/load/scenarios.h"
#include "google/protobuf/util/json_util.h"
#include "gradserve/v1/gradserve.pb.h"

namespace gradserve::testing {
namespace {

// Every field of message and the messages below it, with the index of a repeated one's element
// (-1 for a singular field), and the repeated fields themselves (index -2).
struct FieldRef {
  google::protobuf::Message* message;
  const google::protobuf::FieldDescriptor* field;
  int index;
};
void CollectFields(google::protobuf::Message* message, std::vector<FieldRef>* out) {
  const google::protobuf::Reflection* r = message->GetReflection();
  std::vector<const google::protobuf::FieldDescriptor*> fields;
  r->ListFields(*message, &fields);
  for (const google::protobuf::FieldDescriptor* f : fields) {
    if (!f->is_repeated()) {
      out->push_back({message, f, -1});
      if (f->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE) {
        CollectFields(r->MutableMessage(message, f), out);
      }
      continue;
    }
    out->push_back({message, f, -2});
    for (int i = 0; i < r->FieldSize(*message, f); ++i) {
      out->push_back({message, f, i});
      if (f->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE) {
        CollectFields(r->MutableRepeatedMessage(message, f, i), out);
      }
    }
  }
}

// The *.json files of dir, sorted by name, so that a seed picks the same requests everywhere.
std::vector<std::filesystem::path> JsonFiles(const std::string& dir) {
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() == ".json") files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

absl::StatusOr<std::vector<SeedRequest>> SeedRequests(const std::string& examples_dir,
                                                      const std::string& test_data_dir) {
  std::vector<SeedRequest> seeds = {{"grad_tiny", load::GradTinyRequest().SerializeAsString()}};
  absl::StatusOr<v1::GradRequest> payload = load::PayloadRequest(20 << 10);
  if (!payload.ok()) return payload.status();
  seeds.push_back({"payload_20k", payload->SerializeAsString()});
  for (const auto& [dir, prefix] : {std::pair{test_data_dir, ""}, {examples_dir, "examples_"}}) {
    for (const std::filesystem::path& path : JsonFiles(dir)) {
      std::stringstream json;
      json << std::ifstream(path).rdbuf();
      v1::GradRequest request;
      if (!google::protobuf::util::JsonStringToMessage(json.str(), &request).ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat(path.string(), " is no gradserve.v1.GradRequest in JSON"));
      }
      seeds.push_back({absl::StrCat(prefix, path.stem().string()), request.SerializeAsString()});
    }
  }
  return seeds;
}

std::string MutateBytes(std::string bytes, std::mt19937_64& rng) {
  auto pick = [&rng](size_t n) { return n == 0 ? size_t{0} : size_t(rng() % n); };
  const int edits = 1 + static_cast<int>(rng() % 4);
  for (int e = 0; e < edits; ++e) {
    const size_t at = pick(bytes.size());
    switch (rng() % 6) {
      case 0:
        if (!bytes.empty()) bytes[at] ^= static_cast<char>(1 << (rng() % 8));
        break;
      case 1: {
        static constexpr char kEdges[] = {'\x00', '\x7f', '\x80', '\xff'};
        if (!bytes.empty()) bytes[at] = rng() % 2 ? kEdges[rng() % 4] : static_cast<char>(rng());
        break;
      }
      case 2:
        bytes.insert(at, std::string(1 + pick(8), static_cast<char>(rng())));
        break;
      case 3:
        bytes.erase(at, 1 + pick(16));
        break;
      case 4: {
        const size_t n = std::min<size_t>(1 + pick(64), bytes.size() - at);
        bytes.insert(at, bytes.substr(at, n));
        break;
      }
      default:
        bytes.resize(at);
    }
  }
  return bytes;
}

void CollectWords(const google::protobuf::Message& message, std::vector<std::string>* words) {
  std::vector<FieldRef> fields;
  std::unique_ptr<google::protobuf::Message> copy(message.New());
  copy->CopyFrom(message);
  CollectFields(copy.get(), &fields);
  for (const FieldRef& f : fields) {
    if (f.field->type() != google::protobuf::FieldDescriptor::TYPE_STRING || f.index == -2) {
      continue;
    }
    const google::protobuf::Reflection* r = f.message->GetReflection();
    words->push_back(f.index < 0 ? r->GetString(*f.message, f.field)
                                 : r->GetRepeatedString(*f.message, f.field, f.index));
  }
}

void MutateField(google::protobuf::Message* request, const std::vector<std::string>& words,
                 std::mt19937_64& rng) {
  using google::protobuf::FieldDescriptor;
  std::vector<FieldRef> fields;
  CollectFields(request, &fields);
  if (fields.empty()) return;
  const FieldRef f = fields[rng() % fields.size()];
  const google::protobuf::Reflection* r = f.message->GetReflection();
  if (f.index == -2) {
    const int n = r->FieldSize(*f.message, f.field);
    if (n == 0) return;
    if (rng() % 2) {
      r->SwapElements(f.message, f.field, static_cast<int>(rng() % n), n - 1);
      r->RemoveLast(f.message, f.field);
    } else if (f.field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      r->AddMessage(f.message, f.field)->CopyFrom(r->GetRepeatedMessage(*f.message, f.field, 0));
    }
    return;
  }
  const int64_t edges[] = {
      0, 1, -1, 2, INT32_MAX, INT32_MIN, INT64_MAX, INT64_MIN, static_cast<int64_t>(rng() % 64)};
  const int64_t v = edges[rng() % (sizeof(edges) / sizeof(edges[0]))];
  const bool repeated = f.index >= 0;
  switch (f.field->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT64:
      repeated ? r->SetRepeatedInt64(f.message, f.field, f.index, v)
               : r->SetInt64(f.message, f.field, v);
      break;
    case FieldDescriptor::CPPTYPE_INT32:
      repeated ? r->SetRepeatedInt32(f.message, f.field, f.index, static_cast<int32_t>(v))
               : r->SetInt32(f.message, f.field, static_cast<int32_t>(v));
      break;
    case FieldDescriptor::CPPTYPE_UINT64:
    case FieldDescriptor::CPPTYPE_UINT32:
      break;  // none in the contract
    case FieldDescriptor::CPPTYPE_DOUBLE: {
      const double d[] = {0, -1, 1e308, -1e308, NAN, INFINITY, static_cast<double>(v)};
      const double x = d[rng() % 7];
      repeated ? r->SetRepeatedDouble(f.message, f.field, f.index, x)
               : r->SetDouble(f.message, f.field, x);
      break;
    }
    case FieldDescriptor::CPPTYPE_FLOAT: {
      const float x = rng() % 2 ? NAN : static_cast<float>(v);
      repeated ? r->SetRepeatedFloat(f.message, f.field, f.index, x)
               : r->SetFloat(f.message, f.field, x);
      break;
    }
    case FieldDescriptor::CPPTYPE_BOOL:
      repeated ? r->SetRepeatedBool(f.message, f.field, f.index, rng() % 2)
               : r->SetBool(f.message, f.field, rng() % 2);
      break;
    case FieldDescriptor::CPPTYPE_ENUM:
      repeated ? r->SetRepeatedEnumValue(f.message, f.field, f.index, static_cast<int>(v % 8))
               : r->SetEnumValue(f.message, f.field, static_cast<int>(v % 8));
      break;
    case FieldDescriptor::CPPTYPE_STRING: {
      std::string x;
      if (f.field->type() == FieldDescriptor::TYPE_BYTES) {
        x = repeated ? r->GetRepeatedString(*f.message, f.field, f.index)
                     : r->GetString(*f.message, f.field);
        x.resize(rng() % 2 ? x.size() / 2 : x.size() + 1 + rng() % 8, '\x7f');
      } else if (!words.empty()) {
        x = words[rng() % words.size()];
      }
      repeated ? r->SetRepeatedString(f.message, f.field, f.index, x)
               : r->SetString(f.message, f.field, x);
      break;
    }
    case FieldDescriptor::CPPTYPE_MESSAGE:
      if (!repeated) r->ClearField(f.message, f.field);
      break;
  }
}

}  // namespace gradserve::testing
