package dev.gradserve.client;

import dev.gradserve.v1.AttrValue;
import dev.gradserve.v1.BackwardCall;
import dev.gradserve.v1.FloatList;
import dev.gradserve.v1.GradRequest;
import dev.gradserve.v1.Graph;
import dev.gradserve.v1.IntList;
import dev.gradserve.v1.Leaf;
import dev.gradserve.v1.Op;
import dev.gradserve.v1.StringList;
import dev.gradserve.v1.Tensor;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collection;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;

/**
 * Builds a gradserve graph in forward order (graph.proto) and the GradRequest around it.
 *
 * <pre>{@code
 * GradRequest req = new GraphBuilder()
 *     .leaf("x", Tensors.float64(new double[] {1, 2, 3}), true)
 *     .op("mul", List.of("x", "x"), "y")
 *     .op("sum", List.of("y"), "loss", Map.of("dim", List.of(0L)))
 *     .backward(List.of("loss"), "x")
 *     .request();
 * }</pre>
 *
 * <p>Attribute values map to AttrValue by type: Boolean to b, Integer/Long to i, Float/Double to
 * f, String to s, a collection of integers to ints, of floats to floats, of strings to strings;
 * an AttrValue is used as is. An empty or repeated value name, or an attribute of no known kind,
 * throws IllegalArgumentException at once; the server checks the rest. Not thread-safe: build in
 * one thread, then send from any.
 */
public final class GraphBuilder {
  private final Graph.Builder graph = Graph.newBuilder();
  private final Set<String> names = new HashSet<>();
  private final List<BackwardCall> calls = new ArrayList<>();
  private final List<String> returnValues = new ArrayList<>();

  /** A top-level graph. */
  public GraphBuilder() {}

  /** A checkpoint body whose formal inputs are bound in order to the checkpoint op's inputs. */
  public static GraphBuilder body(String... inputs) {
    GraphBuilder b = new GraphBuilder();
    for (String name : inputs) {
      b.define(name);
    }
    b.graph.addAllInputs(Arrays.asList(inputs));
    return b;
  }

  private void define(String name) {
    if (name == null || name.isEmpty()) {
      throw new IllegalArgumentException("value names must not be empty");
    }
    if (!names.add(name)) {
      throw new IllegalArgumentException("value \"" + name + "\" is already defined in this graph");
    }
  }

  /** Adds a leaf tensor; requiresGrad makes it one gradients can be taken for. */
  public GraphBuilder leaf(String name, Tensor value, boolean requiresGrad) {
    define(name);
    graph.addLeaves(Leaf.newBuilder().setName(name).setValue(value).setRequiresGrad(requiresGrad));
    return this;
  }

  /** Adds a leaf that does not require grad. */
  public GraphBuilder leaf(String name, Tensor value) {
    return leaf(name, value, false);
  }

  /** Adds an op with one output and no attributes. */
  public GraphBuilder op(String op, List<String> inputs, String out) {
    return op(op, inputs, List.of(out), Map.of(), false, null);
  }

  /** Adds an op with one output. */
  public GraphBuilder op(String op, List<String> inputs, String out, Map<String, ?> attrs) {
    return op(op, inputs, List.of(out), attrs, false, null);
  }

  /**
   * Adds an op: its name (PyTorch's, or grad, checkpoint, hook, detach), the values it reads in
   * argument order, its outputs (none for hook), attributes, whether it runs with grad mode off,
   * and a checkpoint's body (or null).
   */
  public GraphBuilder op(String op, List<String> inputs, List<String> outs, Map<String, ?> attrs,
      boolean noGrad, GraphBuilder body) {
    Op.Builder m = Op.newBuilder().setOp(op).addAllInputs(inputs).setNoGrad(noGrad);
    for (Map.Entry<String, ?> e : attrs.entrySet()) {
      try {
        m.putAttrs(e.getKey(), attrValue(e.getValue()));
      } catch (IllegalArgumentException ex) {
        throw new IllegalArgumentException(
            "op \"" + op + "\" attribute \"" + e.getKey() + "\": " + ex.getMessage());
      }
    }
    for (String name : outs) {
      define(name);
    }
    m.addAllOutputs(outs);
    if (body != null) {
      m.setBody(body.graph());
    }
    graph.addOps(m);
    return this;
  }

  /** The AttrValue for a Java value; see the class comment for the mapping. */
  public static AttrValue attrValue(Object value) {
    if (value instanceof AttrValue) {
      return (AttrValue) value;
    } else if (value instanceof Boolean) {
      return AttrValue.newBuilder().setB((Boolean) value).build();
    } else if (value instanceof Integer || value instanceof Long) {
      return AttrValue.newBuilder().setI(((Number) value).longValue()).build();
    } else if (value instanceof Float || value instanceof Double) {
      return AttrValue.newBuilder().setF(((Number) value).doubleValue()).build();
    } else if (value instanceof String) {
      return AttrValue.newBuilder().setS((String) value).build();
    } else if (value instanceof Collection) {
      Collection<?> items = (Collection<?>) value;
      if (items.stream().allMatch(v -> v instanceof Integer || v instanceof Long)) {
        IntList.Builder l = IntList.newBuilder();
        items.forEach(v -> l.addValues(((Number) v).longValue()));
        return AttrValue.newBuilder().setInts(l).build();
      }
      if (items.stream().allMatch(v -> v instanceof Number)) {
        FloatList.Builder l = FloatList.newBuilder();
        items.forEach(v -> l.addValues(((Number) v).doubleValue()));
        return AttrValue.newBuilder().setFloats(l).build();
      }
      if (items.stream().allMatch(v -> v instanceof String)) {
        StringList.Builder l = StringList.newBuilder();
        items.forEach(v -> l.addValues((String) v));
        return AttrValue.newBuilder().setStrings(l).build();
      }
    }
    throw new IllegalArgumentException("value " + value + " is not a Boolean, integer, float, "
        + "String or a collection of integers, floats or Strings");
  }

  /** Sets a checkpoint body's outputs, bound in order to the checkpoint op's outputs. */
  public GraphBuilder outputs(String... names) {
    graph.clearOutputs().addAllOutputs(Arrays.asList(names));
    return this;
  }

  /** Appends a grad()-semantics backward call from roots, returning gradients for inputs. */
  public GraphBuilder backward(List<String> roots, String... inputs) {
    return backward(BackwardCall.newBuilder().addAllRoots(roots)
        .addAllInputs(Arrays.asList(inputs)).build());
  }

  /**
   * Appends a backward call with any of its fields: seeds, accumulate_grad, retain_graph,
   * create_graph, allow_unused, materialize_grads, detect_anomaly.
   */
  public GraphBuilder backward(BackwardCall call) {
    calls.add(call);
    return this;
  }

  /** Asks for these forward values in the response. */
  public GraphBuilder returnValues(String... names) {
    returnValues.addAll(Arrays.asList(names));
    return this;
  }

  /** The Graph message built so far. */
  public Graph graph() {
    return graph.build();
  }

  /** The GradRequest with this graph, its backward calls and return values. */
  public GradRequest request(String requestId) {
    return GradRequest.newBuilder().setRequestId(requestId).setGraph(graph.build())
        .addAllCalls(calls).addAllReturnValues(returnValues).build();
  }

  /** The GradRequest, with no request id. */
  public GradRequest request() {
    return request("");
  }
}
