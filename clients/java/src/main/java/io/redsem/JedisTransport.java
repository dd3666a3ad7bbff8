package io.redsem;

import java.lang.reflect.Field;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import org.apache.commons.pool2.PooledObjectFactory;
import org.apache.commons.pool2.impl.DefaultPooledObject;
import org.apache.commons.pool2.impl.GenericObjectPool;
import redis.clients.jedis.CommandArguments;
import redis.clients.jedis.Connection;
import redis.clients.jedis.ConnectionPool;
import redis.clients.jedis.HostAndPort;
import redis.clients.jedis.UnifiedJedis;
import redis.clients.jedis.commands.ProtocolCommand;
import redis.clients.jedis.exceptions.JedisConnectionException;
import redis.clients.jedis.exceptions.JedisDataException;
import redis.clients.jedis.providers.ClusterConnectionProvider;
import redis.clients.jedis.providers.ConnectionProvider;
import redis.clients.jedis.providers.PooledConnectionProvider;

/**
 * Jedis: connections of a {@code UnifiedJedis}'s pool ({@code RedisClient}), or of the node
 * pools of a {@code JedisCluster} / {@code RedisClusterClient}, borrowed for one call; a call
 * that blocks or binds takes a connection of redsem's own instead, made by that pool's own
 * factory (the same address, credentials, TLS and protocol) and never counted in the pool.
 */
final class JedisTransport implements Transport {
  private final ConnectionProvider provider;
  private final ClusterConnectionProvider cluster; // null on one server
  /** Redsem's own connections, per pool of the client (a node's in Cluster). */
  private final Map<Object, Spares<Connection>> spares = new ConcurrentHashMap<>();

  private JedisTransport(ConnectionProvider provider) {
    this.provider = provider;
    this.cluster = provider instanceof ClusterConnectionProvider
        ? (ClusterConnectionProvider) provider : null;
  }

  static JedisTransport of(UnifiedJedis jedis) {
    if (jedis == null) {
      throw new IllegalArgumentException("the Jedis client must not be null");
    }
    // UnifiedJedis keeps its connections' provider to itself (a protected field).
    try {
      Field field = UnifiedJedis.class.getDeclaredField("provider");
      field.setAccessible(true);
      ConnectionProvider provider = (ConnectionProvider) field.get(jedis);
      if (provider == null) {
        throw new IllegalArgumentException(
            "this UnifiedJedis has no connection provider: use a RedisClient, JedisCluster or"
                + " RedisClusterClient");
      }
      return new JedisTransport(provider);
    } catch (ReflectiveOperationException | RuntimeException e) {
      if (e instanceof IllegalArgumentException) {
        throw (IllegalArgumentException) e;
      }
      throw new IllegalArgumentException(
          "cannot reach the connections of this UnifiedJedis (" + e + ")", e);
    }
  }

  @Override
  public boolean cluster() {
    return cluster != null;
  }

  @Override
  public Conn open(String node, boolean dedicated) {
    if (cluster == null) {
      GenericObjectPool<?> pool = dedicated ? plainPool() : null;
      if (pool == null) {
        return new JedisConn(provider.getConnection(), null);
      }
      return own(pool);
    }
    ConnectionPool pool = cluster.getNodes().get(node);
    if (pool == null) {
      cluster.renewSlotCache();
      pool = cluster.getNodes().get(node);
      if (pool == null) {
        throw new JedisConnectionException("no node " + node + " in the cluster's map yet");
      }
    }
    return dedicated ? own(pool) : new JedisConn(pool.getResource(), null);
  }

  /**
   * The pool of a client to one server: a RedisClient's, or a Sentinel client's pool of its
   * current primary; null for a provider without one (its connections are lent as they are).
   */
  private GenericObjectPool<?> plainPool() {
    if (provider instanceof PooledConnectionProvider) {
      return ((PooledConnectionProvider) provider).getPool();
    }
    Map<?, ?> pools = provider.getConnectionMap();
    if (pools != null && pools.size() == 1) {
      Object pool = pools.values().iterator().next();
      if (pool instanceof GenericObjectPool) {
        return (GenericObjectPool<?>) pool;
      }
    }
    return null;
  }

  private Conn own(GenericObjectPool<?> pool) {
    Spares<Connection> own = spares.get(pool);
    if (own == null) {
      // A pool the client closed (a Sentinel primary replaced): its spares go too.
      spares.entrySet().removeIf(e -> {
        boolean gone = ((GenericObjectPool<?>) e.getKey()).isClosed();
        if (gone) {
          e.getValue().close();
        }
        return gone;
      });
    }
    own = spares.computeIfAbsent(pool, key -> {
      @SuppressWarnings("unchecked")
      PooledObjectFactory<Connection> factory =
          (PooledObjectFactory<Connection>) pool.getFactory();
      return new Spares<>(new Spares.Maker<Connection>() {
        @Override
        public Connection connect() {
          try {
            return factory.makeObject().getObject();
          } catch (RuntimeException e) {
            throw e;
          } catch (Exception e) {
            throw new JedisConnectionException(e);
          }
        }

        @Override
        public boolean usable(Connection c) {
          return c.isConnected() && !c.isBroken();
        }

        @Override
        public void close(Connection c) {
          try {
            factory.destroyObject(new DefaultPooledObject<>(c));
          } catch (Exception e) {
            // closed already
          }
        }
      });
    });
    return new JedisConn(own.take(), own);
  }

  @Override
  public String ownerOf(int slot) {
    HostAndPort node = cluster.getNode(slot);
    if (node == null) {
      throw new JedisConnectionException("no node serves slot " + slot + " yet");
    }
    return node.toString();
  }

  @Override
  public void refreshTopology() {
    cluster.renewSlotCache();
  }

  @Override
  public RuntimeException serverError(String message) {
    return new JedisDataException(message);
  }

  @Override
  public Failure classify(RuntimeException error) {
    if (error instanceof JedisConnectionException) {
      return Failure.BROKEN;
    }
    if (error instanceof JedisDataException) {
      return Failure.ofServerError(error.getMessage());
    }
    return Failure.OTHER;
  }

  @Override
  public void close() {
    // The pools are the application's; the connections made beside them are redsem's.
    for (Spares<Connection> own : spares.values()) {
      own.close();
    }
    spares.clear();
  }

  private static final ProtocolCommand CLIENT = () -> Commands.bytes("CLIENT");

  private static final class JedisConn implements Conn {
    private final Connection connection;
    private final Spares<Connection> own; // null: the client's pool lent it

    JedisConn(Connection connection, Spares<Connection> own) {
      this.connection = connection;
      this.own = own;
    }

    @Override
    public Object call(long blockMillis, List<Object> args, Watch watch) {
      byte[] name = Commands.bytes(args.get(0));
      ProtocolCommand command = () -> name;
      CommandArguments arguments = new CommandArguments(command);
      for (int i = 1; i < args.size(); i++) {
        arguments.add(Commands.bytes(args.get(i)));
      }
      if (blockMillis == 0 && watch == null) {
        return connection.executeCommand(arguments);
      }
      int base = connection.getSoTimeout();
      long timeout = blockMillis < 0 || base == 0 ? 0 : blockMillis + base;
      connection.setSoTimeout((int) Math.min(timeout, Integer.MAX_VALUE));
      try {
        if (watch == null) {
          return connection.executeCommand(arguments);
        }
        connection.sendCommand(new CommandArguments(CLIENT).add(Commands.bytes("ID")));
        connection.sendCommand(arguments);
        long id;
        try {
          id = (Long) connection.getOne(); // flushes both
        } catch (JedisDataException refused) {
          id = -1;
        }
        watch.blocked(id);
        return connection.getOne();
      } finally {
        if (!connection.isBroken()) {
          connection.setSoTimeout(base);
        }
      }
    }

    @Override
    public void abort() {
      try {
        connection.setBroken();
        connection.forceDisconnect();
      } catch (java.io.IOException | RuntimeException e) {
        // closed already
      }
    }

    @Override
    public void close(boolean broken) {
      if (own != null) {
        own.giveBack(connection, broken || connection.isBroken());
        return;
      }
      try {
        if (broken) {
          connection.setBroken();
        }
        connection.close();
      } catch (RuntimeException e) {
        // The pool could not replace a broken connection (its node is down): nothing to give back.
      }
    }
  }
}
