package dev.gradserve.client;

import dev.gradserve.v1.BackwardCall;
import dev.gradserve.v1.BackwardRequest;
import dev.gradserve.v1.BackwardResponse;
import dev.gradserve.v1.ExtendRequest;
import dev.gradserve.v1.ExtendResponse;
import dev.gradserve.v1.ForwardResponse;
import dev.gradserve.v1.GradRequest;
import dev.gradserve.v1.GradResponse;
import dev.gradserve.v1.Graph;
import dev.gradserve.v1.NamedTensor;
import dev.gradserve.v1.ReleaseRequest;
import dev.gradserve.v1.Tensor;
import io.grpc.Deadline;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import java.util.Arrays;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;

/**
 * A graph held on one server between its forward pass and its backward calls
 * (docs/sessions.md), made by {@link GradserveClient#forward}.
 *
 * <pre>{@code
 * try (Session s = client.forward(graph.returnValues("y"))) {
 *   Tensor seed = lossGradient(s.values().get("y"));          // known only now
 *   GradResult r = s.backward(BackwardCall.newBuilder().addRoots("y").putSeeds("y", seed)
 *       .addInputs("W").setRetainGraph(true).build());
 *   s.extend(new GraphBuilder().leaf("target", target).op("mse_loss", List.of("y", "target"), "loss"));
 *   double[] dW = s.backward(new GraphBuilder().backward(List.of("loss"), "W")).call(0).doubles("W");
 * }                                                            // released
 * }</pre>
 *
 * <p>Its calls go over the client's sessions channel (pick_first, no retries), so they reach
 * the server that answered the Forward; they are not retried, since a Backward with
 * accumulate_grad must not run twice. A backward call without retain_graph frees the saved
 * tensors it went through, and a later call through them fails with FAILED_PRECONDITION, as in
 * PyTorch. A session the server no longer holds (released, expired after --session_idle_ttl,
 * or another replica's) answers NOT_FOUND, and one ended by a draining server UNAVAILABLE: run
 * the forward pass again. Errors are grpc's StatusRuntimeException, as for the client's other
 * calls. Thread-safe; the server runs one session's calls one at a time, in arrival order.
 */
public final class Session implements AutoCloseable {
  /** What the views made by withDeadlineAfter share. */
  private static final class State {
    final Map<String, Tensor> values = new LinkedHashMap<>();
    long numNodes;
    boolean released;
  }

  private final GradserveClient client;
  private final ForwardResponse response;
  private final State state;
  private final Deadline deadline;

  private Session(GradserveClient client, ForwardResponse response, State state, Deadline deadline) {
    this.client = client;
    this.response = response;
    this.state = state;
    this.deadline = deadline;
  }

  Session(GradserveClient client, ForwardResponse response) {
    this(client, response, new State(), null);
    state.numNodes = response.getNumNodes();
    addValues(response.getValuesList());
  }

  /** A view of this session whose calls have this deadline (from now); releasing either ends both. */
  public Session withDeadlineAfter(long duration, TimeUnit unit) {
    return new Session(client, response, state, Deadline.after(duration, unit));
  }

  /** The session's id: 32 hex digits. */
  public String id() {
    return response.getSessionId();
  }

  /** The values the Forward and later Extend calls returned, by name. */
  public Map<String, Tensor> values() {
    synchronized (state) {
      return Collections.unmodifiableMap(new LinkedHashMap<>(state.values));
    }
  }

  /** Autograd nodes the Forward and the Extend calls recorded. */
  public long numNodes() {
    synchronized (state) {
      return state.numNodes;
    }
  }

  /** The Forward's answer (request id, timings). */
  public ForwardResponse response() {
    return response;
  }

  private Map<String, Tensor> addValues(List<NamedTensor> named) {
    Map<String, Tensor> values = new LinkedHashMap<>();
    for (NamedTensor v : named) {
      values.put(v.getName(), v.getValue());
    }
    synchronized (state) {
      state.values.putAll(values);
    }
    return Collections.unmodifiableMap(values);
  }

  /**
   * Runs calls in order over the held graph (Backward): seeds, retain_graph, create_graph,
   * accumulate_grad and the other fields of each BackwardCall. Returns their gradients as a
   * GradResult with no values, whose response() carries the request id and timings.
   */
  public GradResult backward(List<BackwardCall> calls) {
    BackwardRequest req = BackwardRequest.newBuilder().setSessionId(id()).addAllCalls(calls).build();
    BackwardResponse r = client.sessionStub(deadline).backward(req);
    return new GradResult(GradResponse.newBuilder().setRequestId(r.getRequestId())
        .addAllCalls(r.getCallsList()).setTimings(r.getTimings()).build());
  }

  /** Runs these backward calls; see backward(List). */
  public GradResult backward(BackwardCall... calls) {
    return backward(Arrays.asList(calls));
  }

  /** Runs the builder's backward calls (its graph is ignored); see backward(List). */
  public GradResult backward(GraphBuilder calls) {
    return backward(calls.request().getCallsList());
  }

  /**
   * Adds graph's leaves and ops to the held graph, as if they had ended the Forward graph
   * (Extend; docs/sessions.md, "Extending a session"): its ops may read any value of the
   * session by name, its names must be new, and later backward calls may start from its values.
   * Returns returnValues (the session's, new or old) by name, also added to values(). An
   * unknown or repeated name is INVALID_ARGUMENT, and the session is left as it was.
   */
  public Map<String, Tensor> extend(Graph graph, List<String> returnValues) {
    ExtendRequest req = ExtendRequest.newBuilder().setSessionId(id()).setGraph(graph)
        .addAllReturnValues(returnValues).build();
    ExtendResponse r = client.sessionStub(deadline).extend(req);
    synchronized (state) {
      state.numNodes += r.getNumNodes();
    }
    return addValues(r.getValuesList());
  }

  /** Extends with the builder's graph, returning its return values; its backward calls are ignored. */
  public Map<String, Tensor> extend(GraphBuilder graph) {
    GradRequest req = graph.request();
    return extend(req.getGraph(), req.getReturnValuesList());
  }

  /**
   * Ends the session on its server, freeing what it holds (Release); a second release does
   * nothing. NOT_FOUND if the server had already ended it.
   */
  public void release() {
    synchronized (state) {
      if (state.released) {
        return;
      }
      state.released = true;
    }
    client.sessionStub(deadline).release(ReleaseRequest.newBuilder().setSessionId(id()).build());
  }

  /** Releases the session; one the server already ended (NOT_FOUND, UNAVAILABLE) is no error. */
  @Override
  public void close() {
    try {
      release();
    } catch (StatusRuntimeException e) {
      Status.Code code = e.getStatus().getCode();
      if (code != Status.Code.NOT_FOUND && code != Status.Code.UNAVAILABLE) {
        throw e;
      }
    }
  }
}
