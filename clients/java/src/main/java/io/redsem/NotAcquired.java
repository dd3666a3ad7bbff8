package io.redsem;

/** No permit was granted: the semaphore was full (for the whole wait, when waiting). */
public class NotAcquired extends RedsemException {
  private static final long serialVersionUID = 1L;

  public NotAcquired(String message) {
    super(message);
  }
}
