package dev.gradserve.client;

import java.io.BufferedReader;
import java.io.File;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * A real gradserve-server on 127.0.0.1 port 0 (the kernel picks a free port, which the server
 * logs), from GRADSERVE_SERVER or the release build. A thread keeps its log.
 */
final class ServerProcess implements AutoCloseable {
  private static final Pattern LISTENING = Pattern.compile("listening on 127\\.0\\.0\\.1:(\\d+)");
  private final Process process;
  private final List<String> log = new ArrayList<>();
  final String address;

  ServerProcess(String... flags) throws Exception {
    String binary = System.getenv("GRADSERVE_SERVER");
    if (binary == null || binary.isEmpty()) {
      binary = "build/release/server/gradserve-server";
    }
    if (!new File(binary).canExecute()) {
      throw new IllegalStateException("gradserve-server not found at " + binary + "; set GRADSERVE_SERVER");
    }
    List<String> command = new ArrayList<>(List.of(binary, "--listen=127.0.0.1:0", "--grace_period=1s"));
    command.addAll(List.of(flags));
    process = new ProcessBuilder(command).redirectOutput(ProcessBuilder.Redirect.DISCARD).start();
    CompletableFuture<String> port = new CompletableFuture<>();
    Thread drain = new Thread(() -> {
      try (BufferedReader r = new BufferedReader(
          new InputStreamReader(process.getErrorStream(), StandardCharsets.UTF_8))) {
        for (String line; (line = r.readLine()) != null; ) {
          synchronized (log) {
            log.add(line);
          }
          Matcher m = LISTENING.matcher(line);
          if (m.find()) {
            port.complete(m.group(1));
          }
        }
      } catch (Exception e) {
        // the process ended
      }
      port.completeExceptionally(new IllegalStateException("gradserve-server exited:\n" + log()));
    });
    drain.setDaemon(true);
    drain.start();
    try {
      address = "127.0.0.1:" + port.get(30, TimeUnit.SECONDS);
    } catch (Exception e) {
      process.destroyForcibly();
      throw new IllegalStateException("gradserve-server did not start:\n" + log(), e);
    }
  }

  String log() {
    synchronized (log) {
      return String.join("\n", log);
    }
  }

  void kill() throws InterruptedException {
    process.destroyForcibly().waitFor();
  }

  @Override
  public void close() throws InterruptedException {
    process.destroy(); // SIGTERM
    if (!process.waitFor(10, TimeUnit.SECONDS)) {
      process.destroyForcibly().waitFor();
    }
  }
}
