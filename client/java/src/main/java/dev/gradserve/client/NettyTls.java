package dev.gradserve.client;

import io.netty.handler.ssl.IdentityCipherSuiteFilter;
import io.netty.handler.ssl.JdkApplicationProtocolNegotiator;
import io.netty.handler.ssl.JdkSslClientContext;
import io.netty.handler.ssl.SslContext;
import java.io.File;
import java.lang.reflect.Constructor;
import java.util.List;
import java.util.Set;
import javax.net.ssl.SSLEngine;
import javax.net.ssl.SSLException;
import javax.net.ssl.SSLHandshakeException;

/**
 * TLS for grpc-netty with Debian's netty, whose JDK provider was built without ALPN support
 * ("JDK provider does not support ALPN protocol" from GrpcSslContexts and TlsChannelCredentials),
 * and without netty-tcnative. gRPC needs ALPN ("h2"), and Java 9 and later negotiate it
 * natively: this negotiator wraps each SSLEngine in netty's own Java9SslEngine (package-private
 * in this netty, so made by reflection), which asks the JDK for "h2" and reports the outcome to
 * netty's SslHandler as gRPC expects. Thread-safe.
 */
final class NettyTls {
  private static final List<String> PROTOCOLS = List.of("h2");

  private NettyTls() {}

  private static final class Negotiator implements JdkApplicationProtocolNegotiator {
    private final Constructor<?> java9Engine;

    Negotiator() throws ReflectiveOperationException {
      java9Engine = Class.forName("io.netty.handler.ssl.Java9SslEngine")
          .getDeclaredConstructor(SSLEngine.class, JdkApplicationProtocolNegotiator.class, boolean.class);
      java9Engine.setAccessible(true);
    }

    @Override
    public List<String> protocols() {
      return PROTOCOLS;
    }

    @Override
    public SslEngineWrapperFactory wrapperFactory() {
      return (engine, negotiator, isServer) -> {
        try {
          return (SSLEngine) java9Engine.newInstance(engine, negotiator, isServer);
        } catch (ReflectiveOperationException e) {
          throw new IllegalStateException("netty's Java9SslEngine cannot be made", e);
        }
      };
    }

    @Override
    public ProtocolSelectorFactory protocolSelectorFactory() {
      return (SSLEngine engine, Set<String> supported) -> {
        throw new UnsupportedOperationException("a client does not select a protocol");
      };
    }

    @Override
    public ProtocolSelectionListenerFactory protocolListenerFactory() {
      return (engine, protocols) -> new ProtocolSelectionListener() {
        @Override
        public void unsupported() {
          // gRPC's handshake handler fails the connection, naming ALPN.
        }

        @Override
        public void selected(String protocol) throws Exception {
          if (!PROTOCOLS.contains(protocol)) {
            throw new SSLHandshakeException("the server chose protocol " + protocol + ", not h2");
          }
        }
      };
    }
  }

  /**
   * A client SslContext: the server's certificate checked against caFile (null: the system's
   * roots); certFile and keyFile (PKCS#8 PEM, or null) for mutual TLS.
   */
  @SuppressWarnings("deprecation")
  static SslContext clientContext(File caFile, File certFile, File keyFile) throws SSLException {
    Negotiator negotiator;
    try {
      negotiator = new Negotiator();
    } catch (ReflectiveOperationException e) {
      throw new SSLException("this netty has no Java9SslEngine for ALPN", e);
    }
    return new JdkSslClientContext(caFile, null, certFile, keyFile, null, null, null,
        IdentityCipherSuiteFilter.INSTANCE, negotiator, 0, 0);
  }
}
