package dev.gradserve.client;

import com.google.protobuf.ByteString;
import com.google.protobuf.InvalidProtocolBufferException;
import dev.gradserve.v1.Chunk;
import dev.gradserve.v1.ForwardRequest;
import dev.gradserve.v1.GradRequest;
import dev.gradserve.v1.GradResponse;
import dev.gradserve.v1.GradServiceGrpc;
import dev.gradserve.v1.Limits;
import dev.gradserve.v1.PingRequest;
import dev.gradserve.v1.ServerInfo;
import dev.gradserve.v1.ServerInfoRequest;
import grpc.health.v1.HealthGrpc;
import grpc.health.v1.HealthOuterClass.HealthCheckRequest;
import io.grpc.CallCredentials;
import io.grpc.Channel;
import io.grpc.Deadline;
import io.grpc.ManagedChannel;
import io.grpc.Metadata;
import io.grpc.SecurityLevel;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import io.grpc.netty.NettyChannelBuilder;
import io.grpc.stub.StreamObserver;
import io.netty.handler.ssl.SslContext;
import java.io.ByteArrayOutputStream;
import java.io.File;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Executor;
import java.util.concurrent.TimeUnit;
import javax.net.ssl.SSLException;

/**
 * A client of one gradserve server or several.
 *
 * <pre>{@code
 * try (GradserveClient client = GradserveClient.builder("127.0.0.1:50051").build()) {
 *   GradResult r = client.withDeadlineAfter(10, TimeUnit.SECONDS).grad(graph.request());
 *   double[] dx = r.call(0).doubles("x");
 * }
 * }</pre>
 *
 * <p>Targets: "host:port", a comma-separated list of IP:PORT or [IPV6]:PORT, or
 * "dns:///NAME:PORT"; calls are dealt to the servers in turn (round_robin) and a call that ends
 * UNAVAILABLE or CANCELLED by a draining server is retried on another, up to 4 attempts.
 * {@link #forward} holds a graph on one server as a {@link Session}, whose calls all go over a
 * second channel with pick_first and no retries, so that they reach that server
 * (docs/sessions.md).
 *
 * <p>Errors: a failed call throws grpc's {@link StatusRuntimeException}, whose status has the
 * code (INVALID_ARGUMENT, RESOURCE_EXHAUSTED, DEADLINE_EXCEEDED, ...) and the server's message,
 * naming the node, op and value involved. Misuse found before sending (a token without TLS, an
 * unreadable file) throws IllegalArgumentException naming the option. Thread-safe; close it when
 * done (views made by withDeadlineAfter share the channel and need no closing).
 */
public final class GradserveClient implements AutoCloseable {
  /** Every gRPC implementation accepts messages this large by default. */
  static final int DEFAULT_MESSAGE_LIMIT = 4 << 20;
  /** Room left in a chunk for the Chunk message's own fields. */
  static final int CHUNK_OVERHEAD = 1 << 10;
  /** Request bytes kept per call to replay it (docs/deploy.md). */
  static final long RETRY_BUFFER_BYTES = 32 << 20;
  /** The environment variable a token is read from when none is given. */
  public static final String TOKEN_ENV = "GRADSERVE_TOKEN";

  private final ManagedChannel channel;
  /** Sessions' calls: pick_first, no retries (docs/sessions.md, "Several replicas"). */
  private final ManagedChannel sessionChannel;
  private final boolean owner;
  private final Deadline deadline;
  private final Limits[] limits;

  private GradserveClient(ManagedChannel channel, ManagedChannel sessionChannel, boolean owner,
      Deadline deadline, Limits[] limits) {
    this.channel = channel;
    this.sessionChannel = sessionChannel;
    this.owner = owner;
    this.deadline = deadline;
    this.limits = limits;
  }

  /** A builder of a client of target. */
  public static Builder builder(String target) {
    return new Builder(target);
  }

  /** Options of a client, as the gradserve tool's flags of the same names (docs/security.md). */
  public static final class Builder {
    private final String target;
    private boolean tls;
    private String tlsCa;
    private String tlsCert;
    private String tlsKey;
    private String token;
    private String tokenFile;

    private Builder(String target) {
      this.target = target;
    }

    /** TLS with the system's root CAs. */
    public Builder tls() {
      tls = true;
      return this;
    }

    /** TLS, the server's certificate checked against the CAs in this PEM file (--tls_ca). */
    public Builder tlsCa(String caFile) {
      tls = true;
      tlsCa = caFile;
      return this;
    }

    /** This client's certificate chain and key (PEM files), for mutual TLS. */
    public Builder tlsCert(String certFile, String keyFile) {
      tls = true;
      tlsCert = certFile;
      tlsKey = keyFile;
      return this;
    }

    /**
     * The bearer token, sent as "authorization: Bearer TOKEN" with every call; needs TLS. ""
     * sends none and keeps GRADSERVE_TOKEN from being read.
     */
    public Builder token(String token) {
      this.token = token;
      this.tokenFile = null;
      return this;
    }

    /** A file whose first line is the token (--token_file). */
    public Builder tokenFile(String path) {
      this.tokenFile = path;
      this.token = null;
      return this;
    }

    private String resolveToken() {
      String t = token;
      String what = "the token";
      if (t == null && tokenFile != null) {
        String text;
        try {
          text = Files.readString(Path.of(tokenFile), StandardCharsets.UTF_8);
        } catch (IOException | RuntimeException e) {
          throw new IllegalArgumentException("token_file " + tokenFile + ": cannot be read");
        }
        t = text.split("\n", 2)[0].strip();
        what = "token_file " + tokenFile + ": its first line";
        if (t.isEmpty()) {
          throw new IllegalArgumentException(what + " must be the token");
        }
      } else if (t == null) {
        t = System.getenv(TOKEN_ENV);
        what = TOKEN_ENV;
      }
      if (t == null || t.isEmpty()) {
        return null;
      }
      for (char c : t.toCharArray()) {
        if (c <= ' ' || c >= 0x7f) {
          throw new IllegalArgumentException(what + " must be printable ASCII without spaces");
        }
      }
      return t;
    }

    private static File readable(String path, String option) {
      File f = new File(path);
      if (!f.canRead()) {
        throw new IllegalArgumentException(option + " " + path + ": cannot be read");
      }
      return f;
    }

    /** The TLS context, or null for plaintext. */
    private SslContext sslContext() {
      if (!tls) {
        return null;
      }
      if ((tlsCert == null) != (tlsKey == null)) {
        throw new IllegalArgumentException("give both tls_cert and tls_key (mutual TLS), or neither");
      }
      File ca = tlsCa == null ? null : readable(tlsCa, "tls_ca");
      File cert = tlsCert == null ? null : readable(tlsCert, "tls_cert");
      File key = tlsKey == null ? null : readable(tlsKey, "tls_key");
      try {
        return NettyTls.clientContext(ca, cert, key);
      } catch (SSLException e) {
        throw new IllegalArgumentException("tls_ca, tls_cert or tls_key (" + String.join(", ",
            tlsCa == null ? "-" : tlsCa, tlsCert == null ? "-" : tlsCert) + "): cannot be used: "
            + e.getMessage());
      }
    }

    /** The client; IllegalArgumentException naming the option for a misuse. */
    public GradserveClient build() {
      String bearer = resolveToken();
      if (bearer != null && !tls) {
        throw new IllegalArgumentException(
            "a token needs TLS (tlsCa or tls): sent in plaintext it is anyone's who sees it");
      }
      SslContext ssl = sslContext();
      ManagedChannel channel = channelBuilder(ssl)
          .defaultServiceConfig(Targets.serviceConfig())
          .enableRetry()
          .maxRetryAttempts(4)
          .perRpcBufferLimit(RETRY_BUFFER_BYTES)
          .retryBufferSize(4 * RETRY_BUFFER_BYTES)
          .build();
      // Connects only when a session is first used, as any grpc-java channel.
      ManagedChannel sessions = channelBuilder(ssl)
          .defaultServiceConfig(Targets.sessionServiceConfig())
          .disableRetry()
          .build();
      GradserveClient client = new GradserveClient(channel, sessions, true, null, new Limits[1]);
      client.bearer = bearer == null ? null : new Bearer(bearer);
      return client;
    }

    /** A channel to the target with TLS as configured; its service config is the caller's. */
    private NettyChannelBuilder channelBuilder(SslContext ssl) {
      NettyChannelBuilder b = NettyChannelBuilder.forTarget(Targets.grpcTarget(target));
      if (ssl == null) {
        b.usePlaintext();
      } else {
        b.sslContext(ssl);
      }
      b.disableServiceConfigLookUp().maxInboundMessageSize(Integer.MAX_VALUE);
      return b;
    }
  }

  private Bearer bearer;

  /** Sends the token over TLS only. */
  private static final class Bearer extends CallCredentials {
    private static final Metadata.Key<String> AUTHORIZATION =
        Metadata.Key.of("authorization", Metadata.ASCII_STRING_MARSHALLER);
    private final String token;

    Bearer(String token) {
      this.token = token;
    }

    @Override
    public void applyRequestMetadata(RequestInfo info, Executor executor, MetadataApplier applier) {
      if (info.getSecurityLevel() != SecurityLevel.PRIVACY_AND_INTEGRITY) {
        applier.fail(Status.UNAUTHENTICATED.withDescription("a token is sent over TLS only"));
        return;
      }
      Metadata headers = new Metadata();
      headers.put(AUTHORIZATION, "Bearer " + token);
      applier.apply(headers);
    }

    @Override
    public void thisUsesUnstableApi() {}
  }

  /** A view of this client whose calls have this deadline (from now); shares the channel. */
  public GradserveClient withDeadlineAfter(long duration, TimeUnit unit) {
    GradserveClient view = new GradserveClient(channel, sessionChannel, false,
        Deadline.after(duration, unit), limits);
    view.bearer = bearer;
    return view;
  }

  private GradServiceGrpc.GradServiceBlockingStub blocking() {
    return blocking(channel, deadline);
  }

  /** A stub of the sessions' channel with this deadline (null: none). */
  GradServiceGrpc.GradServiceBlockingStub sessionStub(Deadline deadline) {
    return blocking(sessionChannel, deadline);
  }

  private GradServiceGrpc.GradServiceBlockingStub blocking(Channel channel, Deadline deadline) {
    GradServiceGrpc.GradServiceBlockingStub s = GradServiceGrpc.newBlockingStub(channel);
    if (deadline != null) {
      s = s.withDeadline(deadline);
    }
    return bearer == null ? s : s.withCallCredentials(bearer);
  }

  /**
   * Sends req: the server records the graph, runs its backward calls and answers with the
   * gradients. A request over 4 MiB and over the server's message limit goes over
   * ComputeGradientsStream by itself. Throws StatusRuntimeException.
   */
  public GradResult grad(GradRequest req) {
    int size = req.getSerializedSize();
    boolean stream = size > DEFAULT_MESSAGE_LIMIT && size > limits().getMaxMessageBytes();
    return grad(req, stream);
  }

  /** Sends the builder's request. */
  public GradResult grad(GraphBuilder graph) {
    return grad(graph.request());
  }

  /** Sends req, streamed (ComputeGradientsStream) or not. */
  public GradResult grad(GradRequest req, boolean stream) {
    return new GradResult(stream ? gradStreamed(req) : retryClosed(() -> blocking().computeGradients(req)));
  }

  /**
   * Runs req's graph forward on one server and holds it there (Forward): a {@link Session} with
   * the values req returns, on which to run backward calls, extend the graph and release it.
   * req's backward calls are ignored. This client's deadline bounds this call only; the
   * session's calls have none unless {@link Session#withDeadlineAfter} gives one. Not retried:
   * a retry could leave a session held that nobody releases. Throws StatusRuntimeException.
   */
  public Session forward(GradRequest req) {
    ForwardRequest forward = ForwardRequest.newBuilder().setRequestId(req.getRequestId())
        .setGraph(req.getGraph()).addAllReturnValues(req.getReturnValuesList()).build();
    return new Session(this, sessionStub(deadline).forward(forward));
  }

  /** Runs the builder's graph forward, returning its return values; see forward(GradRequest). */
  public Session forward(GraphBuilder graph) {
    return forward(graph.request());
  }

  /**
   * Whether a call that failed with e may be sent again: grpc-java 1.41 ends a call whose
   * connection is cut under it (a server killed) with UNKNOWN "channel closed" rather than
   * UNAVAILABLE, which its retry policy would have retried. Safe: every call is a pure function
   * of its request.
   */
  static boolean closedUnderIt(StatusRuntimeException e) {
    Status s = e.getStatus();
    return s.getCode() == Status.Code.UNKNOWN
        && (s.getCause() instanceof java.nio.channels.ClosedChannelException
            || "channel closed".equals(s.getDescription()));
  }

  /** call, sent again (up to 4 attempts in all) while it ends as closedUnderIt says. */
  private <T> T retryClosed(java.util.function.Supplier<T> call) {
    for (int attempt = 1; ; attempt++) {
      try {
        return call.get();
      } catch (StatusRuntimeException e) {
        if (!closedUnderIt(e) || attempt == 4 || (deadline != null && deadline.isExpired())) {
          throw e;
        }
      }
    }
  }

  /** The server's limits (GetServerInfo), asked once; zeros if the token may not ask. */
  public Limits limits() {
    synchronized (limits) {
      if (limits[0] == null) {
        try {
          limits[0] = info().getLimits();
        } catch (StatusRuntimeException e) {
          if (e.getStatus().getCode() != Status.Code.PERMISSION_DENIED) {
            throw e;
          }
          limits[0] = Limits.getDefaultInstance();
        }
      }
      return limits[0];
    }
  }

  private GradResponse gradStreamed(GradRequest req) {
    Limits l = limits();
    long size = l.getChunkBytes() > 0 ? l.getChunkBytes() : DEFAULT_MESSAGE_LIMIT;
    long max = l.getMaxMessageBytes() > 0 ? l.getMaxMessageBytes() : DEFAULT_MESSAGE_LIMIT;
    int chunk = (int) Math.max(1, Math.min(size, max - CHUNK_OVERHEAD));
    ByteString payload = req.toByteString();
    // Retried as the unary call is: the whole stream again, on another server.
    for (int attempt = 1; ; attempt++) {
      try {
        return streamOnce(payload, chunk);
      } catch (StatusRuntimeException e) {
        Status.Code code = e.getStatus().getCode();
        boolean retryable = code == Status.Code.UNAVAILABLE || code == Status.Code.CANCELLED
            || closedUnderIt(e);
        if (!retryable || attempt == 4 || (deadline != null && deadline.isExpired())) {
          throw e;
        }
        try {
          Thread.sleep((long) (Math.random() * 50 * (1L << (attempt - 1))) + 1);
        } catch (InterruptedException ie) {
          Thread.currentThread().interrupt();
          throw e;
        }
      }
    }
  }

  private GradResponse streamOnce(ByteString payload, int chunk) {
    GradServiceGrpc.GradServiceStub s = GradServiceGrpc.newStub(channel);
    if (deadline != null) {
      s = s.withDeadline(deadline);
    }
    if (bearer != null) {
      s = s.withCallCredentials(bearer);
    }
    CompletableFuture<byte[]> done = new CompletableFuture<>();
    ByteArrayOutputStream received = new ByteArrayOutputStream();
    StreamObserver<Chunk> requests = s.computeGradientsStream(new StreamObserver<Chunk>() {
      @Override
      public void onNext(Chunk c) {
        try {
          c.getData().writeTo(received);
        } catch (IOException e) {
          done.completeExceptionally(e);
        }
      }

      @Override
      public void onError(Throwable t) {
        done.completeExceptionally(t);
      }

      @Override
      public void onCompleted() {
        done.complete(received.toByteArray());
      }
    });
    int total = payload.size();
    for (int start = 0; start < total || start == 0; start += chunk) {
      int end = Math.min(total, start + chunk);
      Chunk.Builder c = Chunk.newBuilder().setData(payload.substring(start, end));
      if (start == 0) {
        c.setTotalBytes(total);
      }
      requests.onNext(c.build());
      if (end == total) {
        break;
      }
    }
    requests.onCompleted();
    try {
      return GradResponse.parseFrom(done.get());
    } catch (ExecutionException e) {
      if (e.getCause() instanceof StatusRuntimeException) {
        throw (StatusRuntimeException) e.getCause();
      }
      throw Status.fromThrowable(e.getCause()).asRuntimeException();
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw Status.CANCELLED.withDescription("interrupted").asRuntimeException();
    } catch (InvalidProtocolBufferException e) {
      throw Status.INTERNAL.withDescription("the server's streamed response is malformed: "
          + e.getMessage()).asRuntimeException();
    }
  }

  /** The server's ServerInfo: version, limits, devices, ops, counters. */
  public ServerInfo info() {
    return retryClosed(() -> blocking().getServerInfo(ServerInfoRequest.getDefaultInstance()));
  }

  /** Echoes payload through the server. */
  public ByteString ping(ByteString payload) {
    return retryClosed(() -> blocking().ping(PingRequest.newBuilder().setPayload(payload).build()))
        .getPayload();
  }

  /** The grpc.health.v1 status of service ("" for the whole server): "SERVING", ... */
  public String health(String service) {
    HealthGrpc.HealthBlockingStub s = HealthGrpc.newBlockingStub(channel);
    if (deadline != null) {
      s = s.withDeadline(deadline);
    }
    return s.check(HealthCheckRequest.newBuilder().setService(service).build()).getStatus().name();
  }

  /**
   * Closes the channels (a view made by withDeadlineAfter leaves them open); sessions not yet
   * released stay held on their servers until --session_idle_ttl ends them.
   */
  @Override
  public void close() {
    if (owner) {
      channel.shutdownNow();
      sessionChannel.shutdownNow();
      try {
        channel.awaitTermination(5, TimeUnit.SECONDS);
        sessionChannel.awaitTermination(5, TimeUnit.SECONDS);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
      }
    }
  }
}
