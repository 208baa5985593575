package dev.gradserve.client;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.google.protobuf.ByteString;
import dev.gradserve.v1.BackwardCall;
import dev.gradserve.v1.GradRequest;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.MessageDigest;
import java.security.SecureRandom;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** The Java client against real gradserve-server processes. */
class GradserveClientTest {
  static final double[] X = {0.5, -1.0, 2.0};
  static final double[] W = {0.1, 0.2, -0.3, 0.4, -0.5, 0.6}; // [2, 3]

  /** loss = sum(tanh(W x)^2), gradients with respect to x and W. */
  static GraphBuilder tanhGraph() {
    return new GraphBuilder()
        .leaf("x", Tensors.float64(X), true)
        .leaf("W", Tensors.float64(W, 2, 3), true)
        .op("matmul", List.of("W", "x"), "h")
        .op("tanh", List.of("h"), "t")
        .op("mul", List.of("t", "t"), "sq")
        .op("sum", List.of("sq"), "loss")
        .backward(List.of("loss"), "x", "W")
        .returnValues("loss");
  }

  /** By hand: dloss/dh = 2 t (1 - t^2); dx = W^T dh; dW = dh x^T. Returns {loss}, dx, dW. */
  static double[][] tanhGradients() {
    double loss = 0;
    double[] dx = new double[3];
    double[] dw = new double[6];
    for (int i = 0; i < 2; i++) {
      double h = 0;
      for (int j = 0; j < 3; j++) {
        h += W[3 * i + j] * X[j];
      }
      double t = Math.tanh(h);
      loss += t * t;
      double dh = 2 * t * (1 - t * t);
      for (int j = 0; j < 3; j++) {
        dx[j] += W[3 * i + j] * dh;
        dw[3 * i + j] = dh * X[j];
      }
    }
    return new double[][] {{loss}, dx, dw};
  }

  static void checkTanh(GradResult r) {
    checkTanhGradients(r.call(0));
    assertArrayEquals(tanhGradients()[0], Tensors.toDoubles(r.values().get("loss")), 1e-12);
  }

  /** A call's gradients of tanhGraph's loss with respect to x and W. */
  static void checkTanhGradients(GradResult.Call call) {
    double[][] want = tanhGradients();
    assertArrayEquals(want[1], call.doubles("x"), 1e-12);
    assertArrayEquals(want[2], call.doubles("W"), 1e-12);
    assertArrayEquals(new long[] {2, 3}, Tensors.shape(call.gradient("W")));
  }

  static GradserveClient connect(String address) {
    return GradserveClient.builder(address).token("").build();
  }

  @Test
  void gradientsMatchByHandUnaryAndStreamed() throws Exception {
    try (ServerProcess server = new ServerProcess();
        GradserveClient client = connect(server.address)) {
      GradRequest req = tanhGraph().request("java-test");
      for (boolean stream : new boolean[] {false, true}) {
        GradResult r = client.withDeadlineAfter(30, TimeUnit.SECONDS).grad(req, stream);
        checkTanh(r);
        assertEquals("java-test", r.response().getRequestId());
        assertTrue(r.numNodes() > 0);
      }
      assertEquals("SERVING", client.health(""));
      assertEquals(ByteString.copyFromUtf8("hi"), client.ping(ByteString.copyFromUtf8("hi")));
      assertFalse(client.info().getOpsList().isEmpty());
    }
  }

  /** float16 and bfloat16 leaves: gradients come back in their dtype, read exactly. */
  @Test
  void sixteenBitTensors() throws Exception {
    try (ServerProcess server = new ServerProcess();
        GradserveClient client = connect(server.address)) {
      float[] xs = {0.5f, -1.5f, 3f, 65504f};
      for (boolean half : new boolean[] {true, false}) {
        dev.gradserve.v1.Tensor x = half ? Tensors.float16(xs) : Tensors.bfloat16(xs);
        GraphBuilder g = new GraphBuilder()
            .leaf("x", x, true)
            .op("mul", List.of("x", "x"), "y")
            .op("sum", List.of("y"), "s")
            .backward(BackwardCall.newBuilder().addRoots("s").addInputs("x").build());
        GradResult r = client.withDeadlineAfter(30, TimeUnit.SECONDS).grad(g);
        assertEquals(x.getDtype(), r.call(0).gradient("x").getDtype());
        double[] sent = Tensors.toDoubles(x);
        double[] got = r.call(0).doubles("x");
        for (int i = 0; i < xs.length; i++) {
          // 2x is exact in 16 bits, but for 2 * 65504, past float16's range.
          double want = half && 2 * sent[i] > 65504 ? Double.POSITIVE_INFINITY : 2 * sent[i];
          assertEquals(want, got[i], 0.0, x.getDtype() + " element " + i);
        }
      }
    }
  }

  @Test
  void float32SeedsAndUnusedInputs() throws Exception {
    try (ServerProcess server = new ServerProcess();
        GradserveClient client = connect(server.address)) {
      GraphBuilder g = new GraphBuilder()
          .leaf("a", Tensors.float32(new float[] {1, 2, 3, 4}, 2, 2), true)
          .leaf("b", Tensors.float32(new float[] {5}, 1), true)
          .op("exp", List.of("a"), "e")
          .op("sum", List.of("e"), "s", Map.of("dim", List.of(1L)))
          .backward(BackwardCall.newBuilder().addRoots("s").addInputs("a").addInputs("b")
              .putSeeds("s", Tensors.float32(new float[] {1, 2})).setAllowUnused(true).build());
      GradResult r = client.withDeadlineAfter(30, TimeUnit.SECONDS).grad(g);
      float[] da = Tensors.toFloats(r.call(0).gradient("a"));
      double[] want = {Math.exp(1), Math.exp(2), 2 * Math.exp(3), 2 * Math.exp(4)};
      for (int i = 0; i < 4; i++) {
        assertEquals(want[i], da[i], 1e-5 * want[i]);
      }
      assertNull(r.call(0).gradients().get("b"));
      assertFalse(r.call(0).connected("b"));
      assertThrows(IllegalArgumentException.class, () -> r.call(0).doubles("b"));
    }
  }

  @Test
  void largeRequestIsStreamed() throws Exception {
    try (ServerProcess server = new ServerProcess("--max_message_bytes=5242880", "--chunk_bytes=1048576");
        GradserveClient client = connect(server.address)) {
      double[] values = new double[(6 << 20) / 8];
      for (int i = 0; i < values.length; i++) {
        values[i] = i % 7 - 3;
      }
      GradRequest req = new GraphBuilder()
          .leaf("x", Tensors.float64(values), true)
          .op("mul", List.of("x", "x"), "y")
          .op("sum", List.of("y"), "loss")
          .backward(List.of("loss"), "x")
          .request();
      StatusRuntimeException e = assertThrows(StatusRuntimeException.class,
          () -> client.withDeadlineAfter(60, TimeUnit.SECONDS).grad(req, false));
      assertEquals(Status.Code.RESOURCE_EXHAUSTED, e.getStatus().getCode());
      double[] dx = client.withDeadlineAfter(60, TimeUnit.SECONDS).grad(req).call(0).doubles("x");
      for (int i = 0; i < values.length; i++) {
        assertEquals(2 * values[i], dx[i]);
      }
    }
  }

  @Test
  void errorsAreStatusesWithTheServersMessage() throws Exception {
    try (ServerProcess server = new ServerProcess();
        GradserveClient client = connect(server.address)) {
      GraphBuilder unknown = new GraphBuilder()
          .leaf("x", Tensors.float64(X), true)
          .op("frobnicate", List.of("x"), "y")
          .backward(List.of("y"), "x");
      StatusRuntimeException e = assertThrows(StatusRuntimeException.class,
          () -> client.withDeadlineAfter(30, TimeUnit.SECONDS).grad(unknown));
      assertEquals(Status.Code.INVALID_ARGUMENT, e.getStatus().getCode());
      assertTrue(e.getStatus().getDescription().contains("frobnicate"), e.getStatus().getDescription());

      GraphBuilder chain = new GraphBuilder().leaf("v0", Tensors.float32(new float[] {0.5f}), true);
      for (int i = 1; i <= 20000; i++) {
        chain.op("tanh", List.of("v" + (i - 1)), "v" + i);
      }
      chain.op("sum", List.of("v20000"), "loss").backward(List.of("loss"), "v0");
      GradRequest req = chain.request();
      e = assertThrows(StatusRuntimeException.class,
          () -> client.withDeadlineAfter(1, TimeUnit.MILLISECONDS).grad(req));
      assertEquals(Status.Code.DEADLINE_EXCEEDED, e.getStatus().getCode());
      assertEquals(ByteString.copyFromUtf8("ok"),
          client.withDeadlineAfter(10, TimeUnit.SECONDS).ping(ByteString.copyFromUtf8("ok")));
    }
  }

  /** tanhGraph's loss call with retain_graph set or not. */
  static BackwardCall lossCall(boolean retainGraph) {
    return tanhGraph().request().getCalls(0).toBuilder().setRetainGraph(retainGraph).build();
  }

  static void assertSameGradients(GradResult.Call want, GradResult.Call got, String... names) {
    for (String name : names) {
      assertArrayEquals(want.doubles(name), got.doubles(name), 1e-12, name);
    }
  }

  static Status.Code code(org.junit.jupiter.api.function.Executable call) {
    return assertThrows(StatusRuntimeException.class, call).getStatus().getCode();
  }

  /** Forward now, seeds computed from its outputs later: as the one-shot request. */
  @Test
  void sessionBackwardMatchesOneShot() throws Exception {
    try (ServerProcess server = new ServerProcess();
        GradserveClient client = connect(server.address)) {
      GradResult oneShot = client.withDeadlineAfter(30, TimeUnit.SECONDS).grad(tanhGraph());
      checkTanh(oneShot);
      try (Session s = client.withDeadlineAfter(30, TimeUnit.SECONDS).forward(
          tanhGraph().returnValues("t"))) {
        assertEquals(32, s.id().length(), s.id());
        assertEquals(oneShot.numNodes(), s.numNodes());
        assertArrayEquals(Tensors.toDoubles(oneShot.values().get("loss")),
            Tensors.toDoubles(s.values().get("loss")), 0);
        // loss = sum(t^2): seeding t with 2 t, known only from the returned t, is the same.
        double[] t = Tensors.toDoubles(s.values().get("t"));
        double[] seed = {2 * t[0], 2 * t[1]};
        GradResult fromT = s.withDeadlineAfter(30, TimeUnit.SECONDS).backward(BackwardCall.newBuilder()
            .addRoots("t").putSeeds("t", Tensors.float64(seed)).addInputs("x").addInputs("W")
            .setRetainGraph(true).build());
        assertSameGradients(oneShot.call(0), fromT.call(0), "x", "W");
        GradResult fromLoss = s.backward(tanhGraph());
        assertSameGradients(oneShot.call(0), fromLoss.call(0), "x", "W");
        assertTrue(fromLoss.values().isEmpty());
      }
    }
  }

  @Test
  void sessionRetainGraphThenFreedSavedTensors() throws Exception {
    try (ServerProcess server = new ServerProcess();
        GradserveClient client = connect(server.address);
        Session s = client.forward(tanhGraph())) {
      checkTanhGradients(s.backward(lossCall(true)).call(0));
      checkTanhGradients(s.backward(lossCall(true)).call(0));
      checkTanhGradients(s.backward(lossCall(false)).call(0));
      StatusRuntimeException e = assertThrows(StatusRuntimeException.class,
          () -> s.backward(lossCall(false)));
      assertEquals(Status.Code.FAILED_PRECONDITION, e.getStatus().getCode());
      assertTrue(e.getStatus().getDescription().contains("second time"), e.getStatus().getDescription());
    }
  }

  /** A loss chosen after a look at the outputs: target = round(t), loss2 = sum((t - target)^2). */
  @Test
  void sessionExtendThenBackward() throws Exception {
    try (ServerProcess server = new ServerProcess();
        GradserveClient client = connect(server.address);
        Session s = client.forward(tanhGraph().returnValues("t"))) {
      double[] t = Tensors.toDoubles(s.values().get("t"));
      double[] target = {Math.round(t[0]), Math.round(t[1])};
      java.util.function.Function<GraphBuilder, GraphBuilder> loss2 = g -> g
          .leaf("target", Tensors.float64(target))
          .op("sub", List.of("t", "target"), "d")
          .op("mul", List.of("d", "d"), "d2")
          .op("sum", List.of("d2"), "loss2")
          .returnValues("loss2");
      long nodes = s.numNodes();
      Map<String, dev.gradserve.v1.Tensor> values = s.extend(loss2.apply(new GraphBuilder()));
      assertEquals(List.of("loss2"), new ArrayList<>(values.keySet()));
      assertTrue(s.numNodes() > nodes);
      assertTrue(s.values().containsKey("loss2"));
      BackwardCall fromLoss2 = BackwardCall.newBuilder().addRoots("loss2").addInputs("x")
          .addInputs("W").setRetainGraph(true).build();
      GradResult r = s.backward(fromLoss2);

      GradResult oneShot = client.grad(loss2.apply(tanhGraph()).request().toBuilder().clearCalls()
          .addCalls(fromLoss2).build());
      assertSameGradients(oneShot.call(0), r.call(0), "x", "W");
      assertArrayEquals(Tensors.toDoubles(oneShot.values().get("loss2")),
          Tensors.toDoubles(values.get("loss2")), 0);

      assertEquals(Status.Code.INVALID_ARGUMENT,
          code(() -> s.extend(new GraphBuilder().op("neg", List.of("nosuch"), "n"))));
      assertSameGradients(oneShot.call(0), s.backward(fromLoss2).call(0), "x", "W");
    }
  }

  @Test
  void sessionReleasedOrUnknownIsNotFound() throws Exception {
    try (ServerProcess server = new ServerProcess();
        GradserveClient client = connect(server.address)) {
      Session s = client.forward(tanhGraph());
      s.backward(lossCall(true));
      s.release();
      s.release(); // does nothing
      StatusRuntimeException e = assertThrows(StatusRuntimeException.class,
          () -> s.backward(lossCall(true)));
      assertEquals(Status.Code.NOT_FOUND, e.getStatus().getCode());
      assertEquals(Status.Code.NOT_FOUND, code(() -> s.extend(new GraphBuilder())));
      s.close(); // released already: no call, no error
      assertEquals(0, client.info().getCounters().getSessions());
      // try-with-resources releases; closing a session the server already ended is no error.
      try (Session t = client.forward(tanhGraph())) {
        assertEquals(1, client.info().getCounters().getSessions());
        t.withDeadlineAfter(10, TimeUnit.SECONDS).release();
      }
      assertEquals(0, client.info().getCounters().getSessions());
    }
  }

  /** round_robin would send half of the Backward calls to the server that lacks the session. */
  @Test
  void sessionCallsStayOnTheServerThatAnsweredTheForward() throws Exception {
    try (ServerProcess a = new ServerProcess(); ServerProcess b = new ServerProcess();
        GradserveClient client = connect(a.address + "," + b.address)) {
      List<Session> sessions = new ArrayList<>();
      try {
        for (int i = 0; i < 4; i++) {
          sessions.add(client.forward(tanhGraph()));
        }
        for (Session s : sessions) {
          for (int i = 0; i < 3; i++) {
            checkTanhGradients(s.backward(lossCall(true)).call(0));
          }
        }
      } finally {
        for (Session s : sessions) {
          s.close();
        }
      }
    }
  }

  @Test
  void mistakesFoundBeforeSending() {
    assertThrows(IllegalArgumentException.class, () -> Tensors.float64(new double[] {1, 2, 3}, 2, 2));
    IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
        () -> new GraphBuilder().leaf("x", Tensors.float64(X)).op("neg", List.of("x"), "x"));
    assertTrue(e.getMessage().contains("\"x\" is already defined"), e.getMessage());
    e = assertThrows(IllegalArgumentException.class, () -> new GraphBuilder()
        .leaf("x", Tensors.float64(X)).op("sum", List.of("x"), "s", Map.of("dim", new Object())));
    assertTrue(e.getMessage().contains("attribute \"dim\""), e.getMessage());
    e = assertThrows(IllegalArgumentException.class,
        () -> GradserveClient.builder("127.0.0.1:1").token("secret-token").build());
    assertTrue(e.getMessage().contains("needs TLS") && !e.getMessage().contains("secret-token"));
    e = assertThrows(IllegalArgumentException.class,
        () -> GradserveClient.builder("10.0.0.1:5,gradserve:5").token("").build());
    assertTrue(e.getMessage().contains("dns:///"), e.getMessage());
    e = assertThrows(IllegalArgumentException.class,
        () -> GradserveClient.builder("127.0.0.1:1").tlsCa("/nonexistent/ca.pem").build());
    assertTrue(e.getMessage().contains("tls_ca"), e.getMessage());
  }

  /** A small MLP with cross entropy versus Debian's PyTorch (/usr/bin/python3), one-shot and in a session. */
  @Test
  void mlpMatchesPyTorch() throws Exception {
    String python = System.getenv().getOrDefault("GRADSERVE_PYTHON", "/usr/bin/python3");
    String script = String.join("\n",
        "import torch",
        "torch.manual_seed(0)",
        "x = torch.randn(4, 5, dtype=torch.float64)",
        "w1 = torch.randn(5, 8, dtype=torch.float64, requires_grad=True)",
        "b1 = torch.randn(8, dtype=torch.float64, requires_grad=True)",
        "w2 = torch.randn(8, 3, dtype=torch.float64, requires_grad=True)",
        "target = torch.tensor([0, 2, 1, 2])",
        "h = torch.nn.functional.gelu(x @ w1 + b1)",
        "loss = torch.nn.functional.cross_entropy(h @ w2, target)",
        "for t in [x, w1, b1, w2, *torch.autograd.grad(loss, [w1, b1, w2])]:",
        "    print(' '.join(repr(v) for v in t.detach().flatten().tolist()))");
    Process p = new ProcessBuilder(python, "-c", script).redirectErrorStream(true).start();
    List<double[]> rows = new ArrayList<>();
    try (BufferedReader r = new BufferedReader(new InputStreamReader(p.getInputStream(), StandardCharsets.UTF_8))) {
      for (String line; (line = r.readLine()) != null; ) {
        try {
          rows.add(java.util.Arrays.stream(line.trim().split(" ")).mapToDouble(Double::parseDouble).toArray());
        } catch (NumberFormatException e) {
          org.junit.jupiter.api.Assumptions.assumeTrue(false, "no PyTorch reference: " + line);
        }
      }
    }
    org.junit.jupiter.api.Assumptions.assumeTrue(p.waitFor() == 0 && rows.size() == 7,
        "no PyTorch reference (" + python + " with python3-torch)");
    try (ServerProcess server = new ServerProcess();
        GradserveClient client = connect(server.address)) {
      GraphBuilder g = new GraphBuilder()
          .leaf("x", Tensors.float64(rows.get(0), 4, 5))
          .leaf("w1", Tensors.float64(rows.get(1), 5, 8), true)
          .leaf("b1", Tensors.float64(rows.get(2), 8), true)
          .leaf("w2", Tensors.float64(rows.get(3), 8, 3), true)
          .leaf("target", Tensors.int64(new long[] {0, 2, 1, 2}))
          .op("matmul", List.of("x", "w1"), "xw")
          .op("add", List.of("xw", "b1"), "pre")
          .op("gelu", List.of("pre"), "h")
          .op("matmul", List.of("h", "w2"), "logits")
          .op("cross_entropy", List.of("logits", "target"), "loss")
          .backward(List.of("loss"), "w1", "b1", "w2");
      GradResult r = client.withDeadlineAfter(30, TimeUnit.SECONDS).grad(g);
      GradResult fromSession;
      try (Session s = client.withDeadlineAfter(30, TimeUnit.SECONDS).forward(g)) {
        fromSession = s.withDeadlineAfter(30, TimeUnit.SECONDS).backward(g);
      }
      String[] names = {"w1", "b1", "w2"};
      for (GradResult result : List.of(r, fromSession)) {
        for (int i = 0; i < 3; i++) {
          assertArrayEquals(rows.get(4 + i), result.call(0).doubles(names[i]), 1e-10, names[i]);
        }
      }
    }
  }

  @Test
  void replicasShareCallsAndSurviveAKill() throws Exception {
    try (ServerProcess a = new ServerProcess(); ServerProcess b = new ServerProcess();
        ServerProcess c = new ServerProcess();
        GradserveClient client = connect(a.address + "," + b.address + "," + c.address)) {
      GradRequest req = tanhGraph().request();
      client.withDeadlineAfter(30, TimeUnit.SECONDS).grad(req);
      Thread.sleep(500);
      for (int i = 0; i < 90; i++) {
        checkTanh(client.withDeadlineAfter(30, TimeUnit.SECONDS).grad(req));
      }
      for (ServerProcess s : new ServerProcess[] {a, b, c}) {
        try (GradserveClient one = connect(s.address)) {
          long n = one.info().getCounters().getRequestsTotal();
          assertTrue(n >= 15, s.address + " got " + n + " of 91 calls");
        }
      }
      AtomicInteger done = new AtomicInteger();
      List<Throwable> failures = new ArrayList<>();
      List<Thread> threads = new ArrayList<>();
      long stopAt = System.nanoTime() + 1_000_000_000L;
      for (int t = 0; t < 4; t++) {
        Thread thread = new Thread(() -> {
          while (System.nanoTime() < stopAt) {
            try {
              client.withDeadlineAfter(30, TimeUnit.SECONDS).grad(req);
              done.incrementAndGet();
            } catch (Throwable e) {
              synchronized (failures) {
                failures.add(e);
              }
            }
          }
        });
        thread.start();
        threads.add(thread);
      }
      Thread.sleep(300);
      b.kill();
      for (Thread t : threads) {
        t.join();
      }
      assertTrue(failures.isEmpty(), "calls failed while a server was killed: " + failures);
      assertTrue(done.get() >= 20, done.get() + " calls");
    }
  }

  static String digest(String token) throws Exception {
    return HexFormat.of().formatHex(
        MessageDigest.getInstance("SHA-256").digest(token.getBytes(StandardCharsets.US_ASCII)));
  }

  static String randomToken() {
    byte[] b = new byte[32];
    new SecureRandom().nextBytes(b);
    return HexFormat.of().formatHex(b);
  }

  /** As tests/python/test_tls.py: CAs, server and client certificates made with openssl. */
  static void makePki(Path dir) throws Exception {
    String newKey = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
    Files.writeString(dir.resolve("server.ext"), "subjectAltName=DNS:localhost,IP:127.0.0.1\n");
    Files.writeString(dir.resolve("client.ext"), "extendedKeyUsage=clientAuth\n");
    List<String> commands = new ArrayList<>();
    for (String ca : new String[] {"ca", "other-ca"}) {
      commands.add("openssl req -x509 " + newKey + " -keyout " + ca + "-key.pem -out " + ca
          + ".pem -days 2 -subj /CN=" + ca);
    }
    String[][] certs = {{"ca", "server", "localhost", "server.ext"}, {"ca", "client", "alice", "client.ext"},
        {"other-ca", "other-client", "mallory", "client.ext"}};
    for (String[] c : certs) {
      commands.add("openssl req " + newKey + " -keyout " + c[1] + "-key.pem -out " + c[1]
          + ".csr -subj /CN=" + c[2]);
      commands.add("openssl x509 -req -in " + c[1] + ".csr -CA " + c[0] + ".pem -CAkey " + c[0]
          + "-key.pem -CAcreateserial -out " + c[1] + ".pem -days 2 -extfile " + c[3]);
    }
    for (String command : commands) {
      Process p = new ProcessBuilder("sh", "-c", command).directory(dir.toFile())
          .redirectErrorStream(true).redirectOutput(ProcessBuilder.Redirect.DISCARD).start();
      org.junit.jupiter.api.Assumptions.assumeTrue(p.waitFor() == 0, "openssl failed or missing: " + command);
    }
  }

  static Status.Code gradCode(GradserveClient client) {
    try (client) {
      checkTanh(client.withDeadlineAfter(10, TimeUnit.SECONDS).grad(tanhGraph()));
      return Status.Code.OK;
    } catch (StatusRuntimeException e) {
      return e.getStatus().getCode();
    }
  }

  @Test
  void tlsAndTokens(@TempDir Path dir) throws Exception {
    makePki(dir);
    String token = randomToken();
    String infoToken = randomToken();
    String unknown = randomToken();
    Files.writeString(dir.resolve("tokens.txt"), "trainer acme " + digest(token) + "\n"
        + "dashboard acme " + digest(infoToken) + " info\n");
    Files.writeString(dir.resolve("trainer.token"), token + "\n");
    String ca = dir.resolve("ca.pem").toString();
    try (ServerProcess server = new ServerProcess("--tls_cert=" + dir.resolve("server.pem"),
        "--tls_key=" + dir.resolve("server-key.pem"), "--auth_tokens_file=" + dir.resolve("tokens.txt"),
        "--log_requests=all")) {
      String at = server.address;
      assertEquals(Status.Code.OK, gradCode(GradserveClient.builder(at).tlsCa(ca).token(token).build()));
      assertEquals(Status.Code.OK, gradCode(GradserveClient.builder(at).tlsCa(ca)
          .tokenFile(dir.resolve("trainer.token").toString()).build()));
      assertEquals(Status.Code.UNAUTHENTICATED, gradCode(GradserveClient.builder(at).tlsCa(ca).token("").build()));
      assertEquals(Status.Code.UNAUTHENTICATED, gradCode(GradserveClient.builder(at).tlsCa(ca).token(unknown).build()));
      assertEquals(Status.Code.PERMISSION_DENIED,
          gradCode(GradserveClient.builder(at).tlsCa(ca).token(infoToken).build()));
      assertEquals(Status.Code.UNAVAILABLE, gradCode(GradserveClient.builder(at)
          .tlsCa(dir.resolve("other-ca.pem").toString()).token(token).build()));
      assertEquals(Status.Code.UNAVAILABLE, gradCode(connect(at)));
      server.close();
      for (String secret : new String[] {token, infoToken, unknown}) {
        assertFalse(server.log().contains(secret), "a token reached the server's log");
      }
    }
  }

  @Test
  void mutualTls(@TempDir Path dir) throws Exception {
    makePki(dir);
    String ca = dir.resolve("ca.pem").toString();
    try (ServerProcess server = new ServerProcess("--tls_cert=" + dir.resolve("server.pem"),
        "--tls_key=" + dir.resolve("server-key.pem"), "--tls_client_ca=" + ca)) {
      String at = server.address;
      assertEquals(Status.Code.OK, gradCode(GradserveClient.builder(at).tlsCa(ca).token("")
          .tlsCert(dir.resolve("client.pem").toString(), dir.resolve("client-key.pem").toString()).build()));
      assertEquals(Status.Code.UNAVAILABLE, gradCode(GradserveClient.builder(at).tlsCa(ca).token("").build()));
      assertEquals(Status.Code.UNAVAILABLE, gradCode(GradserveClient.builder(at).tlsCa(ca).token("")
          .tlsCert(dir.resolve("other-client.pem").toString(),
              dir.resolve("other-client-key.pem").toString()).build()));
    }
  }

  /** examples/java/Example.java, run as a program against a server. */
  @Test
  void example() throws Exception {
    String classpath = System.getProperty("gradserve.example.classpath");
    org.junit.jupiter.api.Assumptions.assumeTrue(classpath != null, "example class path not given");
    try (ServerProcess server = new ServerProcess()) {
      ProcessBuilder pb = new ProcessBuilder(Path.of(System.getProperty("java.home"), "bin", "java").toString(),
          "-cp", classpath, "Example", server.address).redirectErrorStream(true);
      pb.environment().remove("GRADSERVE_TOKEN");
      Process p = pb.start();
      String out = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
      assertEquals(0, p.waitFor(), out);
      double[][] want = tanhGradients();
      assertTrue(out.contains(String.format("loss %.10g", want[0][0])), out);
      assertTrue(out.contains("dloss/dx " + format(want[1])), out);
      assertTrue(out.contains("dloss/dW " + format(want[2]) + " (shape [2, 3])"), out);
    }
  }

  static String format(double[] values) {
    List<String> parts = new ArrayList<>();
    for (double v : values) {
      parts.add(String.format("%.10g", v));
    }
    return "[" + String.join(", ", parts) + "]";
  }
}
