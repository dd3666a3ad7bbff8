package io.redsem;

import io.lettuce.core.RedisCommandExecutionException;
import io.lettuce.core.RedisCommandTimeoutException;
import io.lettuce.core.RedisException;
import io.lettuce.core.RedisFuture;
import io.lettuce.core.api.StatefulRedisConnection;
import io.lettuce.core.codec.ByteArrayCodec;
import io.lettuce.core.output.CommandOutput;
import io.lettuce.core.protocol.CommandArgs;
import io.lettuce.core.protocol.ProtocolKeyword;
import java.nio.ByteBuffer;
import java.time.Duration;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Deque;
import java.util.List;
import java.util.concurrent.CancellationException;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.function.Supplier;

/** A Lettuce connection as redsem sends on it: raw commands, read into plain Java values. */
class LettuceConn implements Transport.Conn {
  /** How long the reply of a command blocked without limit is read for: a year. */
  private static final Duration NO_LIMIT = Duration.ofDays(366);

  private final StatefulRedisConnection<byte[], byte[]> connection;
  private final boolean owned; // closed with this Conn (a dedicated connection)

  LettuceConn(StatefulRedisConnection<byte[], byte[]> connection, boolean owned) {
    this.connection = connection;
    this.owned = owned;
  }

  @Override
  public Object call(long blockMillis, List<Object> args, Transport.Watch watch) {
    Duration base = connection.getTimeout();
    Duration timeout = base;
    if (blockMillis != 0) {
      // A dedicated connection: its command timeout covers the wait in the server too.
      timeout = blockMillis < 0 ? NO_LIMIT : base.plusMillis(blockMillis);
      connection.setTimeout(timeout);
    }
    try {
      RedisFuture<Object> id = watch == null ? null : dispatch(List.of("CLIENT", "ID"));
      RedisFuture<Object> future = dispatch(args);
      if (id != null) {
        long clientId;
        try {
          clientId = Commands.integer(await(id, base, "CLIENT ID", null));
        } catch (RedisCommandExecutionException refused) {
          clientId = -1;
        }
        watch.blocked(clientId);
      }
      return await(future, timeout, Commands.text(args.get(0)), watch);
    } finally {
      if (blockMillis != 0) {
        connection.setTimeout(base);
      }
    }
  }

  private RedisFuture<Object> dispatch(List<Object> args) {
    byte[] name = Commands.bytes(args.get(0));
    String shown = Commands.text(name);
    ProtocolKeyword keyword = new ProtocolKeyword() {
      @Override
      public byte[] getBytes() {
        return name;
      }

      @Override
      public String toString() {
        return shown;
      }
    };
    CommandArgs<byte[], byte[]> arguments = new CommandArgs<>(ByteArrayCodec.INSTANCE);
    for (int i = 1; i < args.size(); i++) {
      arguments.add(Commands.bytes(args.get(i)));
    }
    return connection.async().dispatch(keyword, new ReplyOutput(), arguments);
  }

  /**
   * The reply, read even when the thread is interrupted meanwhile (a call's answer may be a
   * grant): the interrupt is told to {@code watch}, which may end the call in the server, and
   * the thread's interrupt status is set again after.
   */
  private static Object await(RedisFuture<Object> future, Duration timeout, String command,
      Transport.Watch watch) {
    long until = System.nanoTime() + timeout.toNanos();
    boolean interrupted = false;
    try {
      while (true) {
        try {
          return future.toCompletableFuture().get(
              Math.max(0, until - System.nanoTime()), TimeUnit.NANOSECONDS);
        } catch (InterruptedException e) {
          interrupted = true;
          if (watch != null) {
            watch.interrupted();
          }
        }
      }
    } catch (ExecutionException e) {
      Throwable cause = e.getCause();
      if (cause instanceof RuntimeException) {
        throw (RuntimeException) cause;
      }
      throw new RedisException(cause);
    } catch (TimeoutException e) {
      future.cancel(true);
      throw new RedisCommandTimeoutException("no reply to " + command + " within " + timeout);
    } catch (CancellationException e) {
      throw new RedisException("the connection closed under " + command, e);
    } finally {
      if (interrupted) {
        Thread.currentThread().interrupt();
      }
    }
  }

  @Override
  public void abort() {
    connection.closeAsync();
  }

  @Override
  public void close(boolean broken) {
    // A shared connection stays open for the other calls on it; one that failed is replaced at
    // the next open (LettuceTransport, LettuceClusterTransport).
    if (owned) {
      connection.closeAsync();
    }
  }

  /** Lettuce connections of redsem's own, made by {@code connect}. */
  static Spares<StatefulRedisConnection<byte[], byte[]>> spares(
      Supplier<StatefulRedisConnection<byte[], byte[]>> connect) {
    return new Spares<>(new Spares.Maker<StatefulRedisConnection<byte[], byte[]>>() {
      @Override
      public StatefulRedisConnection<byte[], byte[]> connect() {
        return connect.get();
      }

      @Override
      public boolean usable(StatefulRedisConnection<byte[], byte[]> c) {
        return c.isOpen();
      }

      @Override
      public void close(StatefulRedisConnection<byte[], byte[]> c) {
        c.closeAsync();
      }
    });
  }

  /** A connection of {@code own}, given back to it when closed. */
  static Transport.Conn take(Spares<StatefulRedisConnection<byte[], byte[]>> own) {
    StatefulRedisConnection<byte[], byte[]> c = own.take();
    return new LettuceConn(c, true) {
      @Override
      public void close(boolean broken) {
        own.giveBack(c, broken);
      }
    };
  }

  /** What a Lettuce error means for a call in Cluster. */
  static Transport.Failure classify(RuntimeException error) {
    if (error instanceof RedisCommandExecutionException) {
      return Transport.Failure.ofServerError(error.getMessage());
    }
    if (error instanceof RedisException) {
      return Transport.Failure.BROKEN; // the connection's: timed out, closed, refused
    }
    return Transport.Failure.OTHER;
  }

  /**
   * Any reply, as plain values: byte[] for strings, Long for integers, List for arrays (and
   * maps, flattened), null for nil; RESP2 and RESP3 alike.
   */
  static final class ReplyOutput extends CommandOutput<byte[], byte[], Object> {
    private final Deque<List<Object>> open = new ArrayDeque<>();

    ReplyOutput() {
      super(ByteArrayCodec.INSTANCE, null);
    }

    private void add(Object value) {
      if (open.isEmpty()) {
        output = value;
      } else {
        open.peek().add(value);
      }
    }

    private static byte[] copy(ByteBuffer bytes) {
      if (bytes == null) {
        return null;
      }
      byte[] out = new byte[bytes.remaining()];
      bytes.duplicate().get(out);
      return out;
    }

    @Override
    public void set(ByteBuffer bytes) {
      add(copy(bytes));
    }

    @Override
    public void setSingle(ByteBuffer bytes) {
      add(copy(bytes));
    }

    @Override
    public void setBigNumber(ByteBuffer bytes) {
      add(copy(bytes));
    }

    @Override
    public void set(long integer) {
      add(integer);
    }

    @Override
    public void set(double number) {
      add(number);
    }

    @Override
    public void set(boolean value) {
      add(value ? 1L : 0L);
    }

    @Override
    public void multi(int count) {
      if (count < 0) {
        add(null); // a nil array
        return;
      }
      List<Object> list = new ArrayList<>(count);
      add(list);
      open.push(list);
    }

    @Override
    public void multiArray(int count) {
      multi(count);
    }

    @Override
    public void multiSet(int count) {
      multi(count);
    }

    @Override
    public void multiMap(int count) {
      multi(count < 0 ? count : count * 2);
    }

    @Override
    public void complete(int depth) {
      while (open.size() > depth) {
        open.pop();
      }
    }
  }
}
