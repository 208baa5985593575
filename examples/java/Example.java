// The gradserve Java client's example: sends loss = sum(tanh(W x)^2) to a server and prints the
// loss and its gradients with respect to x and W.
//
//   client/java/build.sh build/java
//   javac -cp "$(cat build/java/classpath)" -d build/java/example examples/java/Example.java
//   java -cp "build/java/example:$(cat build/java/classpath)" Example 127.0.0.1:50051 \
//     [--tls_ca=ca.pem --token_file=trainer-1.token]
//
// Exits 1 with the gRPC status on a failed call, 2 on a bad argument.

import dev.gradserve.client.GradResult;
import dev.gradserve.client.GradserveClient;
import dev.gradserve.client.GraphBuilder;
import dev.gradserve.client.Tensors;
import io.grpc.StatusRuntimeException;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.concurrent.TimeUnit;

public final class Example {
  public static void main(String[] args) {
    String target = null;
    String tlsCa = null;
    String tlsCert = null;
    String tlsKey = null;
    String tokenFile = null;
    for (String arg : args) {
      if (arg.startsWith("--tls_ca=")) {
        tlsCa = arg.substring(9);
      } else if (arg.startsWith("--tls_cert=")) {
        tlsCert = arg.substring(11);
      } else if (arg.startsWith("--tls_key=")) {
        tlsKey = arg.substring(10);
      } else if (arg.startsWith("--token_file=")) {
        tokenFile = arg.substring(13);
      } else if (target == null && !arg.startsWith("-")) {
        target = arg;
      } else {
        System.err.println("usage: Example TARGET [--tls_ca=F] [--tls_cert=F --tls_key=F] [--token_file=F]");
        System.exit(2);
      }
    }
    if (target == null) {
      System.err.println("usage: Example TARGET [--tls_ca=F] [--tls_cert=F --tls_key=F] [--token_file=F]");
      System.exit(2);
    }

    GradserveClient.Builder options = GradserveClient.builder(target);
    if (tlsCa != null) {
      options.tlsCa(tlsCa);
    }
    if (tlsCert != null || tlsKey != null) {
      options.tlsCert(tlsCert, tlsKey);
    }
    if (tokenFile != null) {
      options.tokenFile(tokenFile);
    }

    GraphBuilder g = new GraphBuilder()
        .leaf("x", Tensors.float64(new double[] {0.5, -1.0, 2.0}), true)
        .leaf("W", Tensors.float64(new double[] {0.1, 0.2, -0.3, 0.4, -0.5, 0.6}, 2, 3), true)
        .op("matmul", List.of("W", "x"), "h")
        .op("tanh", List.of("h"), "t")
        .op("mul", List.of("t", "t"), "sq")
        .op("sum", List.of("sq"), "loss")
        .backward(List.of("loss"), "x", "W")
        .returnValues("loss");

    try (GradserveClient client = options.build()) {
      GradResult r = client.withDeadlineAfter(30, TimeUnit.SECONDS).grad(g.request("example-java"));
      System.out.println(String.format("loss %.10g", Tensors.toDoubles(r.values().get("loss"))[0]));
      System.out.println("dloss/dx " + format(r.call(0).doubles("x")));
      System.out.println("dloss/dW " + format(r.call(0).doubles("W")) + " (shape "
          + Arrays.toString(Tensors.shape(r.call(0).gradient("W"))) + ")");
    } catch (StatusRuntimeException e) {
      System.err.println("gradserve: " + e.getStatus().getCode() + ": " + e.getStatus().getDescription());
      System.exit(1);
    } catch (IllegalArgumentException e) {
      System.err.println("gradserve: " + e.getMessage());
      System.exit(2);
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
