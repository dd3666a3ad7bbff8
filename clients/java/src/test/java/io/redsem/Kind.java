package io.redsem;

import io.lettuce.core.RedisClient;
import io.lettuce.core.RedisURI;
import java.time.Duration;
import redis.clients.jedis.HostAndPort;

/** The client libraries every test runs through. */
enum Kind {
  JEDIS,
  LETTUCE;

  /** A Redsem over a new client of this kind to 127.0.0.1:port; closing it closes both. */
  Client connect(int port) {
    switch (this) {
      case JEDIS: {
        redis.clients.jedis.RedisClient jedis = redis.clients.jedis.RedisClient.builder()
            .hostAndPort(new HostAndPort("127.0.0.1", port))
            .build();
        return new Client(Redsem.of(jedis), jedis);
      }
      default: {
        RedisClient lettuce = RedisClient.create(RedisURI.builder()
            .withHost("127.0.0.1").withPort(port).withTimeout(Duration.ofSeconds(10)).build());
        Redsem redsem = Redsem.of(lettuce);
        return new Client(redsem, () -> {
          redsem.close();
          lettuce.shutdown();
        });
      }
    }
  }

  /** A Redsem and what closes it and its client. */
  static final class Client implements AutoCloseable {
    final Redsem redsem;
    private final AutoCloseable closer;

    Client(Redsem redsem, AutoCloseable closer) {
      this.redsem = redsem;
      this.closer = closer;
    }

    @Override
    public void close() throws Exception {
      closer.close();
    }
  }
}
