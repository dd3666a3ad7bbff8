package io.redsem;

/**
 * The server has no redsem module loaded, and what was asked needs it ({@code bound}, a set of
 * semaphores, {@code waitEmpty}): thrown before anything is sent. Everything else works
 * without the module, through the script.
 */
public class ModuleRequired extends RedsemException {
  private static final long serialVersionUID = 1L;
  private final String what;

  public ModuleRequired(String what) {
    super(what + " needs the redsem module loaded in the server");
    this.what = what;
  }

  /** What needed the module: {@code BOUND}, {@code SEM.ACQUIREALL} or {@code SEM.WAITEMPTY}. */
  public String what() {
    return what;
  }
}
