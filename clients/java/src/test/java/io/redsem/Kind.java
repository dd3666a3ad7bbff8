package io.redsem;

import io.lettuce.core.RedisClient;
import io.lettuce.core.RedisURI;
import io.lettuce.core.api.StatefulRedisConnection;
import java.time.Duration;
import java.util.concurrent.atomic.AtomicReference;
import java.util.function.UnaryOperator;
import redis.clients.jedis.HostAndPort;

/** The client libraries every test runs through. */
enum Kind {
  JEDIS,
  LETTUCE;

  /**
   * A Redsem over a new client of this kind to 127.0.0.1:port, with that client's default
   * settings (Jedis: a pool of 8); closing it closes both.
   */
  Client connect(int port) {
    switch (this) {
      case JEDIS: {
        redis.clients.jedis.RedisClient jedis = redis.clients.jedis.RedisClient.builder()
            .hostAndPort(new HostAndPort("127.0.0.1", port))
            .build();
        Redsem redsem = Redsem.of(jedis);
        return new Client(redsem, () -> {
          redsem.close();
          jedis.close();
        }, jedis::get);
      }
      default: {
        RedisClient lettuce = RedisClient.create(RedisURI.builder()
            .withHost("127.0.0.1").withPort(port).withTimeout(Duration.ofSeconds(10)).build());
        Redsem redsem = Redsem.of(lettuce);
        // The application's own connection, beside redsem's (made at its first call: some
        // tests name a server that is not there).
        AtomicReference<StatefulRedisConnection<String, String>> app = new AtomicReference<>();
        return new Client(redsem, () -> {
          redsem.close();
          if (app.get() != null) {
            app.get().close();
          }
          lettuce.shutdown();
        }, key -> app.updateAndGet(a -> a != null ? a : lettuce.connect()).sync().get(key));
      }
    }
  }

  /** A Redsem, the application's own GET on the same client, and what closes them. */
  static final class Client implements AutoCloseable {
    final Redsem redsem;
    private final AutoCloseable closer;
    private final UnaryOperator<String> get;

    Client(Redsem redsem, AutoCloseable closer) {
      this(redsem, closer, null);
    }

    Client(Redsem redsem, AutoCloseable closer, UnaryOperator<String> get) {
      this.redsem = redsem;
      this.closer = closer;
      this.get = get;
    }

    /** The application's own GET through the client it gave redsem. */
    String get(String key) {
      return get.apply(key);
    }

    @Override
    public void close() throws Exception {
      closer.close();
    }
  }
}
