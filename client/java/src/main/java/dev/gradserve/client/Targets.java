package dev.gradserve.client;

import io.grpc.Attributes;
import io.grpc.EquivalentAddressGroup;
import io.grpc.NameResolver;
import io.grpc.NameResolverProvider;
import io.grpc.NameResolverRegistry;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.net.URI;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * Where a client connects, and how it spreads calls over several servers (docs/deploy.md).
 *
 * <p>A target is "host:port", a gRPC target such as "dns:///NAME:PORT", or a comma-separated
 * list of IP:PORT or [IPV6]:PORT, which grpc-java cannot take as it is: it becomes
 * "gradserve-list:///LIST", resolved by a name resolver registered here. Every channel gets
 * {@link #serviceConfig}: round_robin, and calls that end UNAVAILABLE or CANCELLED retried up to
 * 4 attempts; a client's sessions channel gets {@link #sessionServiceConfig}. Thread-safe.
 */
final class Targets {
  static final String LIST_SCHEME = "gradserve-list";
  private static final Pattern IP_PORT =
      Pattern.compile("^(?:\\[([0-9A-Fa-f:.]+)\\]|([0-9.]+)):([0-9]{1,5})$");

  private Targets() {}

  static {
    NameResolverRegistry.getDefaultRegistry().register(new ListProvider());
  }

  /** The same JSON as the other clients' (client/python/gradserve/targets.py), as a Map. */
  static Map<String, Object> serviceConfig() {
    Map<String, Object> retry = Map.of(
        "maxAttempts", 4.0,
        "initialBackoff", "0.05s",
        "maxBackoff", "1s",
        "backoffMultiplier", 2.0,
        "retryableStatusCodes", List.of("UNAVAILABLE", "CANCELLED"));
    Map<String, Object> method = Map.of(
        "name", List.of(Map.of("service", "gradserve.v1.GradService"),
            Map.of("service", "grpc.health.v1.Health")),
        "retryPolicy", retry);
    return Map.of("loadBalancingConfig", List.of(Map.of("round_robin", Map.of())),
        "methodConfig", List.of(method));
  }

  /**
   * pick_first and no retry policy, as the other clients' session channels
   * (SESSION_CHANNEL_OPTIONS in client/python/gradserve/targets.py): every call of a session
   * goes over the one connection that answered its Forward (docs/sessions.md).
   */
  static Map<String, Object> sessionServiceConfig() {
    return Map.of("loadBalancingConfig", List.of(Map.of("pick_first", Map.of())));
  }

  static InetSocketAddress parseIpPort(String entry) {
    Matcher m = IP_PORT.matcher(entry);
    if (!m.matches()) {
      return null;
    }
    int port = Integer.parseInt(m.group(3));
    String host = m.group(1) != null ? m.group(1) : m.group(2);
    if (port > 65535) {
      return null;
    }
    try {
      return new InetSocketAddress(InetAddress.getByName(host), port); // a literal: no lookup
    } catch (Exception e) {
      return null;
    }
  }

  /** The gRPC target for target; IllegalArgumentException naming a list entry that is no IP. */
  static String grpcTarget(String target) {
    target = target.trim();
    if (target.isEmpty()) {
      throw new IllegalArgumentException("the target is empty");
    }
    if (!target.contains(",") || target.contains("://")) {
      return target;
    }
    for (String entry : target.split(",")) {
      if (parseIpPort(entry.trim()) == null) {
        throw new IllegalArgumentException("target list entry \"" + entry.trim()
            + "\" is not IP:PORT or [IPV6]:PORT; a list holds IP addresses (for a name whose "
            + "addresses are the servers, use dns:///NAME:PORT)");
      }
    }
    return LIST_SCHEME + ":///" + target.replace(" ", "");
  }

  /** Resolves gradserve-list:///A:P,B:Q to those addresses, once. */
  private static final class ListProvider extends NameResolverProvider {
    @Override
    protected boolean isAvailable() {
      return true;
    }

    @Override
    protected int priority() {
      return 5;
    }

    @Override
    public String getDefaultScheme() {
      return LIST_SCHEME;
    }

    @Override
    public NameResolver newNameResolver(URI uri, NameResolver.Args args) {
      if (!LIST_SCHEME.equals(uri.getScheme())) {
        return null;
      }
      String list = uri.getRawPath().substring(1);
      List<EquivalentAddressGroup> groups = new ArrayList<>();
      for (String entry : list.split(",")) {
        groups.add(new EquivalentAddressGroup(parseIpPort(entry)));
      }
      String authority = list.split(",")[0];
      return new NameResolver() {
        @Override
        public String getServiceAuthority() {
          return authority; // the first server's address, for TLS's name check
        }

        @Override
        public void start(Listener2 listener) {
          listener.onResult(ResolutionResult.newBuilder().setAddresses(groups)
              .setAttributes(Attributes.EMPTY).build());
        }

        @Override
        public void shutdown() {}
      };
    }
  }
}
