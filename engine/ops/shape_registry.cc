// The schemas of the shape ops (engine/ops/shape.h) and how a graph runs them.

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/ops/op_registry.h"
#include "engine/ops/shape.h"

namespace gradserve::ops {
namespace {

using RunFn = std::function<TensorList(const TensorList&, const Attrs&)>;

// A schema for an op with one output whose inputs take any dtype.
OpSchema Schema(std::string name, std::string doc, std::vector<std::string> input_names,
                std::vector<AttrSpec> attrs, RunFn run) {
  OpSchema s;
  s.name = std::move(name);
  s.doc = std::move(doc);
  s.input_names = std::move(input_names);
  s.attrs = std::move(attrs);
  s.dtypes = {DType::kFloat32, DType::kFloat64, DType::kInt64, DType::kBool};
  s.run = std::move(run);
  return s;
}

OpSchema Variadic(OpSchema schema) {
  schema.variadic = true;
  return schema;
}

AttrSpec Dim(const char* doc, bool required = true) {
  return {"dim", AttrType::kInt, required, doc};
}

}  // namespace

void RegisterShapeOps(OpRegistry& registry) {
  registry.Add(
      Schema("reshape", "The same elements in another shape (a view when the strides allow)",
             {"input"}, {{"shape", AttrType::kInts, true, "the new shape; one -1 is inferred"}},
             [](const TensorList& in, const Attrs& a) -> TensorList {
               return {reshape(in[0], a.GetInts("shape"))};
             }));
  registry.Add(Schema("transpose", "Swaps two dimensions (a view)", {"input"},
                      {{"dim0", AttrType::kInt, true, "the first dimension"},
                       {"dim1", AttrType::kInt, true, "the second dimension"}},
                      [](const TensorList& in, const Attrs& a) -> TensorList {
                        return {transpose(in[0], a.GetInt("dim0"), a.GetInt("dim1"))};
                      }));
  registry.Add(Schema("permute", "Reorders the dimensions (a view)", {"input"},
                      {{"dims", AttrType::kInts, true, "a permutation of the input's dimensions"}},
                      [](const TensorList& in, const Attrs& a) -> TensorList {
                        return {permute(in[0], a.GetInts("dims"))};
                      }));
  registry.Add(Schema(
      "expand", "Broadcasts size-1 dimensions to larger sizes without copying (a view)", {"input"},
      {{"size", AttrType::kInts, true, "the new sizes; -1 keeps a dimension's size"}},
      [](const TensorList& in, const Attrs& a) -> TensorList {
        return {expand(in[0], a.GetInts("size"))};
      }));
  registry.Add(Schema(
      "squeeze", "Removes size-1 dimensions (a view)", {"input"},
      {Dim("the dimension to remove if its size is 1; default: every size-1 dimension", false)},
      [](const TensorList& in, const Attrs& a) -> TensorList {
        std::optional<int64_t> dim;
        if (a.has("dim")) dim = a.GetInt("dim");
        return {squeeze(in[0], dim)};
      }));
  registry.Add(Schema("unsqueeze", "Inserts a size-1 dimension (a view)", {"input"},
                      {Dim("where the new dimension goes, in [-rank - 1, rank]")},
                      [](const TensorList& in, const Attrs& a) -> TensorList {
                        return {unsqueeze(in[0], a.GetInt("dim"))};
                      }));
  registry.Add(Variadic(Schema("cat", "Joins tensors along an existing dimension", {"tensors"},
                               {Dim("the dimension to join along; default 0", false)},
                               [](const TensorList& in, const Attrs& a) -> TensorList {
                                 return {cat(in, a.GetInt("dim", 0))};
                               })));
  registry.Add(Variadic(Schema("stack", "Joins tensors of one shape along a new dimension",
                               {"tensors"}, {Dim("where the new dimension goes; default 0", false)},
                               [](const TensorList& in, const Attrs& a) -> TensorList {
                                 return {stack(in, a.GetInt("dim", 0))};
                               })));
  registry.Add(
      Schema("narrow", "Elements [start, start + length) along a dimension (a view)", {"input"},
             {Dim("the dimension to narrow"),
              {"start", AttrType::kInt, true, "the first index; may be negative"},
              {"length", AttrType::kInt, true, "how many indices to keep"}},
             [](const TensorList& in, const Attrs& a) -> TensorList {
               return {narrow(in[0], a.GetInt("dim"), a.GetInt("start"), a.GetInt("length"))};
             }));
  registry.Add(Schema("select", "The slice at one index of a dimension, which is removed (a view)",
                      {"input"},
                      {Dim("the dimension to select from"),
                       {"index", AttrType::kInt, true, "the index; may be negative"}},
                      [](const TensorList& in, const Attrs& a) -> TensorList {
                        return {select(in[0], a.GetInt("dim"), a.GetInt("index"))};
                      }));
  registry.Add(Schema("index_select",
                      "The slices along a dimension named by an int64 index (0-d or 1-d)",
                      {"input", "index"}, {Dim("the dimension to index")},
                      [](const TensorList& in, const Attrs& a) -> TensorList {
                        return {index_select(in[0], a.GetInt("dim"), in[1])};
                      }));
  registry.Add(Schema("gather", "Values picked along a dimension by an int64 index of equal rank",
                      {"input", "index"}, {Dim("the dimension to index")},
                      [](const TensorList& in, const Attrs& a) -> TensorList {
                        return {gather(in[0], a.GetInt("dim"), in[1])};
                      }));
}

}  // namespace gradserve::ops
