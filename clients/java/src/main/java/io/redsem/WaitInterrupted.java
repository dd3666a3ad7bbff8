package io.redsem;

/**
 * The thread was interrupted while its acquire waited: the acquire gives up its place (and a
 * permit granted meanwhile), and the connection it blocked on is closed, not reused.
 */
final class WaitInterrupted extends RedsemException {
  private static final long serialVersionUID = 1L;

  WaitInterrupted(String message, Throwable cause) {
    super(message, cause);
  }
}
