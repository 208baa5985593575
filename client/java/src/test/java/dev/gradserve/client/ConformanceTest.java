package dev.gradserve.client;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.google.gson.JsonElement;
import com.google.gson.JsonObject;
import com.google.gson.JsonParser;
import com.google.protobuf.util.JsonFormat;
import dev.gradserve.v1.GradRequest;
import dev.gradserve.v1.Tensor;
import io.grpc.StatusRuntimeException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import java.util.stream.Collectors;
import java.util.stream.Stream;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.DynamicTest;
import org.junit.jupiter.api.TestFactory;

/**
 * The shared conformance cases (tests/conformance/*.json, from the system property
 * gradserve.conformance.dir), as the Go and Python clients run them: each request from protobuf
 * JSON against a real server, its gradients and values, or its status and message.
 */
class ConformanceTest {
  static ServerProcess server;
  static GradserveClient client;

  @BeforeAll
  static void start() throws Exception {
    server = new ServerProcess();
    client = GradserveClient.builder(server.address).token("").build();
  }

  @AfterAll
  static void stop() throws Exception {
    client.close();
    server.close();
  }

  static void checkTensor(String what, Tensor got, JsonObject want, double tolerance) {
    assertNotNull(got, what);
    long[] shape = new long[want.getAsJsonArray("shape").size()];
    for (int i = 0; i < shape.length; i++) {
      shape[i] = want.getAsJsonArray("shape").get(i).getAsLong();
    }
    assertArrayEquals(shape, Tensors.shape(got), what);
    double[] values = Tensors.toDoubles(got);
    List<JsonElement> expected = List.of(want.getAsJsonArray("values").asList().toArray(new JsonElement[0]));
    assertEquals(expected.size(), values.length, what);
    for (int i = 0; i < values.length; i++) {
      double e = expected.get(i).getAsDouble();
      assertEquals(e, values[i], tolerance + tolerance * Math.abs(e), what + "[" + i + "]");
    }
  }

  @TestFactory
  Stream<DynamicTest> cases() throws Exception {
    Path dir = Path.of(System.getProperty("gradserve.conformance.dir", "tests/conformance"));
    List<Path> paths;
    try (Stream<Path> files = Files.list(dir)) {
      paths = files.filter(p -> p.toString().endsWith(".json")).sorted().collect(Collectors.toList());
    }
    assertTrue(paths.size() >= 9, paths.size() + " cases in " + dir);
    return paths.stream().map(path -> DynamicTest.dynamicTest(path.getFileName().toString(), () -> {
      JsonObject c = JsonParser.parseString(Files.readString(path)).getAsJsonObject();
      GradRequest.Builder req = GradRequest.newBuilder();
      JsonFormat.parser().merge(c.get("request").toString(), req);
      JsonObject expect = c.getAsJsonObject("expect");
      String code = expect.get("code").getAsString();
      GradserveClient timed = client.withDeadlineAfter(30, TimeUnit.SECONDS);
      if (!code.equals("OK")) {
        StatusRuntimeException e = assertThrows(StatusRuntimeException.class, () -> timed.grad(req.build()));
        assertEquals(code, e.getStatus().getCode().name(), String.valueOf(e.getStatus()));
        for (JsonElement part : expect.getAsJsonArray("message_contains")) {
          assertTrue(e.getStatus().getDescription().contains(part.getAsString()),
              e.getStatus().getDescription() + " lacks " + part);
        }
        return;
      }
      GradResult result = timed.grad(req.build());
      double tolerance = expect.get("tolerance").getAsDouble();
      assertEquals(expect.getAsJsonArray("calls").size(), result.calls().size());
      for (int i = 0; i < result.calls().size(); i++) {
        JsonObject call = expect.getAsJsonArray("calls").get(i).getAsJsonObject();
        Map<String, Tensor> got = result.call(i).gradients();
        assertEquals(call.keySet(), got.keySet(), "call " + i);
        for (Map.Entry<String, JsonElement> e : call.entrySet()) {
          if (e.getValue().isJsonNull()) {
            assertNull(got.get(e.getKey()), "call " + i + " " + e.getKey());
          } else {
            checkTensor("call " + i + " " + e.getKey(), got.get(e.getKey()),
                e.getValue().getAsJsonObject(), tolerance);
          }
        }
      }
      if (expect.has("values")) {
        for (Map.Entry<String, JsonElement> e : expect.getAsJsonObject("values").entrySet()) {
          checkTensor("value " + e.getKey(), result.values().get(e.getKey()),
              e.getValue().getAsJsonObject(), tolerance);
        }
      }
    }));
  }
}
