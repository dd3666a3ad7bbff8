package io.redsem;

/**
 * A wait (an acquire's, a set's, a waitEmpty's) ended from outside: its thread was interrupted
 * (the thread's interrupt status stays set), or its future was completed by someone else. The
 * wait was ended in the server: the acquire left its place in line, and a permit granted in
 * that instant was given back.
 */
public final class WaitInterrupted extends RedsemException {
  private static final long serialVersionUID = 1L;

  WaitInterrupted(String message, Throwable cause) {
    super(message, cause);
  }
}
