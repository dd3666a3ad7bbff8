package io.redsem;

/**
 * The base class of this package's errors. The server's errors and the connection's are the
 * client library's own (Jedis's {@code JedisDataException} and {@code JedisConnectionException},
 * Lettuce's {@code RedisCommandExecutionException} and {@code RedisConnectionException}).
 */
public class RedsemException extends RuntimeException {
  private static final long serialVersionUID = 1L;

  public RedsemException(String message) {
    super(message);
  }

  public RedsemException(String message, Throwable cause) {
    super(message, cause);
  }
}
