package dev.gradserve.client;

import dev.gradserve.v1.CallResult;
import dev.gradserve.v1.GradResponse;
import dev.gradserve.v1.Gradient;
import dev.gradserve.v1.NamedTensor;
import dev.gradserve.v1.Tensor;
import java.util.ArrayList;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/** A GradResponse by name: the gradients of each backward call and the returned values. */
public final class GradResult {
  /** The gradients of one backward call, by input name, in the order the server sent them. */
  public static final class Call {
    private final Map<String, Tensor> gradients = new LinkedHashMap<>();
    private final Map<String, Boolean> connected = new LinkedHashMap<>();

    Call(CallResult message) {
      for (Gradient g : message.getGradientsList()) {
        gradients.put(g.getName(), g.hasValue() ? g.getValue() : null);
        connected.put(g.getName(), g.getConnected());
      }
    }

    /** Input name to gradient; null where the input was not connected (materialize_grads off). */
    public Map<String, Tensor> gradients() {
      return Collections.unmodifiableMap(gradients);
    }

    /** Whether the roots reach each input. */
    public boolean connected(String name) {
      return connected.getOrDefault(name, false);
    }

    /** The gradient for name; IllegalArgumentException if there is none. */
    public Tensor gradient(String name) {
      Tensor t = gradients.get(name);
      if (t == null) {
        throw new IllegalArgumentException(gradients.containsKey(name)
            ? "\"" + name + "\" is not connected to the roots"
            : "no gradient for \"" + name + "\" in this call");
      }
      return t;
    }

    /** The gradient for name as doubles (row-major), whatever its float dtype. */
    public double[] doubles(String name) {
      return Tensors.toDoubles(gradient(name));
    }
  }

  private final GradResponse response;
  private final List<Call> calls = new ArrayList<>();
  private final Map<String, Tensor> values = new LinkedHashMap<>();

  GradResult(GradResponse response) {
    this.response = response;
    for (CallResult c : response.getCallsList()) {
      calls.add(new Call(c));
    }
    for (NamedTensor v : response.getValuesList()) {
      values.put(v.getName(), v.getValue());
    }
  }

  /** One per backward call, in order. */
  public List<Call> calls() {
    return Collections.unmodifiableList(calls);
  }

  /** The call at index i. */
  public Call call(int i) {
    return calls.get(i);
  }

  /** The requested forward values by name. */
  public Map<String, Tensor> values() {
    return Collections.unmodifiableMap(values);
  }

  /** Autograd nodes the forward pass recorded. */
  public long numNodes() {
    return response.getNumNodes();
  }

  /** The message itself (request id, timings). */
  public GradResponse response() {
    return response;
  }
}
