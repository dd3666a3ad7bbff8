package io.redsem;

/**
 * The permit ran out before it was given back (its lease ended, or another client removed it):
 * from then on another holder may have held it, so the work it guarded may have overlapped
 * another holder's.
 */
public class PermitLost extends RedsemException {
  private static final long serialVersionUID = 1L;

  public PermitLost(String message) {
    super(message);
  }
}
