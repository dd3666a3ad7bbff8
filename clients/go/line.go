package redsem

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"weak"

	"github.com/redis/go-redis/v9"
)

// --- Connections of their own, and the wait connections ---------------------------------
//
// go-redis reads every reply of Do within the client's ReadTimeout (5 s by default), and only
// its own blocking commands (BLPOP, WAIT, ...) may take longer. A wait in the server, a BOUND
// permit and a wait for replicas therefore use connections of companion clients: the same
// options (address, credentials, TLS, dialer), but reads bounded by each call's own deadline:
// the wait plus blockMargin, or the client's ReadTimeout for the rest. There are two per
// client (per node in Redis Cluster), made at their first use: one lends a connection to each
// permit that keeps one (BOUND, DurableReplicas) until its release; the other, the waits',
// lends one to each waiting call for as long as it waits, up to the client's PoolSize at once,
// the rest queued here in arrival order for as long as their own waits last (waitPool). Neither
// takes a connection of the client's own pool, which the application's calls, the refreshes
// and the releases use.

// blockMargin is how long a blocking call's reply may take beyond the time it blocks in the
// server (go-redis gives its own blocking commands 10 s).
const blockMargin = 10 * time.Second

type companion struct {
	client *redis.Client
	margin time.Duration // the client's ReadTimeout (0: none)
}

type companionKey struct {
	client weak.Pointer[redis.Client]
	waits  bool // the waits' companion
}

// retire closes the companion of c; the next call makes a new one.
func (comp *companion) retire(c *redis.Client) {
	if companions.CompareAndDelete(companionKey{weak.Make(c), false}, comp) {
		_ = comp.client.Close()
	}
}

// companions, by a weak pointer to their client: a companion is closed once its client is
// garbage.
var companions sync.Map // companionKey -> *companion

func companionOf(c *redis.Client) *companion {
	return companionFor(c, false)
}

func companionFor(c *redis.Client, waits bool) *companion {
	key := companionKey{weak.Make(c), waits}
	if v, ok := companions.Load(key); ok {
		return v.(*companion)
	}
	opt := *c.Options()
	margin := opt.ReadTimeout
	if margin < 0 {
		margin = 0
	}
	opt.ReadTimeout = -1 // no deadline of its own: each call sets one
	opt.ContextTimeoutEnabled = true
	opt.MinIdleConns = 0
	opt.MaxRetries = -1 // a resent wait would join the end of the line
	made := &companion{client: redis.NewClient(&opt), margin: margin}
	v, loaded := companions.LoadOrStore(key, made)
	if loaded {
		_ = made.client.Close()
	} else {
		runtime.AddCleanup(c, func(key companionKey) {
			if v, ok := companions.LoadAndDelete(key); ok {
				_ = v.(*companion).client.Close()
			}
		}, key)
	}
	return v.(*companion)
}

// waitPool lends the waits of one client (one node's in Redis Cluster) the connections of its
// waits' companion: one to each waiting call while it waits, at most size at once (the
// client's PoolSize, the companion's pool), the others queued in arrival order. A queued
// wait waits as long as its own wait lasts: it never fails on the companion's PoolTimeout,
// since it asks the companion only once a connection is free there. A connection given back
// after a clean reply is kept for the next wait with its CLIENT ID, which a cancellation
// needs: a wait then sends nothing before its command.
type waitPool struct {
	comp     *companion
	mu       sync.Mutex
	free     int         // turns not taken
	queue    list.List   // of *waitTicket, in arrival order
	entering bool        // a wait handed its turn from the queue has not sent its wait yet
	idle     []*waitConn // connections kept between waits
}

// waitTicket is a queued wait: handed is closed once a turn is handed to it.
type waitTicket struct {
	handed chan struct{}
	given  bool
}

// waitConn is a connection of the waits' companion (a Conn keeps its one connection until an
// error), with its CLIENT ID once asked.
type waitConn struct {
	conn     *redis.Conn
	clientID int64
	since    time.Time // kept since
}

// keptFor: a connection kept longer between waits is given back to the companion, whose pool
// checks an idle connection before it lends it again (the server may have closed it).
const keptFor = time.Minute

var waitPools sync.Map // weak.Pointer[redis.Client] -> *waitPool

func waitPoolOf(c *redis.Client) *waitPool {
	key := weak.Make(c)
	if v, ok := waitPools.Load(key); ok {
		return v.(*waitPool)
	}
	made := &waitPool{free: max(c.Options().PoolSize, 1), comp: companionFor(c, true)}
	v, loaded := waitPools.LoadOrStore(key, made)
	if !loaded {
		runtime.AddCleanup(c, func(key weak.Pointer[redis.Client]) { waitPools.Delete(key) }, key)
	}
	return v.(*waitPool)
}

// tryTake takes a turn if one is free and no wait is queued.
func (wp *waitPool) tryTake() bool {
	wp.mu.Lock()
	defer wp.mu.Unlock()
	if wp.free > 0 && wp.queue.Len() == 0 {
		wp.free--
		return true
	}
	return false
}

// take waits in line for a turn until deadline (zero: none) or the context's end: ok false
// when the deadline passed first, err the context's end. The turn's wait must say when it
// has sent its wait (turn.entered): the next in line is handed a turn only then, so that
// waits queued here reach the server in the order they came, however close the turns free.
func (wp *waitPool) take(ctx context.Context, deadline time.Time) (ok bool, err error) {
	wp.mu.Lock()
	t := &waitTicket{handed: make(chan struct{})}
	el := wp.queue.PushBack(t)
	wp.handLocked() // a turn freed since tryTake
	wp.mu.Unlock()
	var timeout <-chan time.Time
	if !deadline.IsZero() {
		timer := time.NewTimer(time.Until(deadline))
		defer timer.Stop()
		timeout = timer.C
	}
	select {
	case <-t.handed:
		return true, nil
	case <-ctx.Done():
		err = ctx.Err()
	case <-timeout:
	}
	wp.mu.Lock()
	defer wp.mu.Unlock()
	if t.given { // handed at that moment: pass it on
		wp.entering = false
		wp.giveLocked()
	} else {
		wp.queue.Remove(el)
	}
	return false, err
}

// giveLocked frees a turn, and hands it to the first in the queue unless the one handed a
// turn before it has not sent its wait yet.
func (wp *waitPool) giveLocked() {
	wp.free++
	wp.handLocked()
}

func (wp *waitPool) handLocked() {
	if wp.entering || wp.free == 0 {
		return
	}
	if el := wp.queue.Front(); el != nil {
		t := wp.queue.Remove(el).(*waitTicket)
		t.given = true
		wp.free--
		wp.entering = true
		close(t.handed)
	}
}

// queued is the number of waits queued for a turn.
func (wp *waitPool) queued() int {
	wp.mu.Lock()
	defer wp.mu.Unlock()
	return wp.queue.Len()
}

// turn is a wait's connection, from the waits' companion, for as long as it waits.
type turn struct {
	pool     *waitPool
	conn     *waitConn
	dirty    bool // a call failed or was cancelled: the connection is not kept
	closed   bool // its connection was found closed: so may be the ones kept
	entering bool // handed from the queue: the next is handed one once this wait is sent
}

// turn lends a taken turn its connection: a kept one, or a new one.
func (wp *waitPool) turn() *turn {
	wp.mu.Lock()
	defer wp.mu.Unlock()
	for n := len(wp.idle); n > 0; n = len(wp.idle) {
		wc := wp.idle[n-1]
		wp.idle = wp.idle[:n-1]
		if time.Since(wc.since) < keptFor {
			return &turn{pool: wp, conn: wc}
		}
		_ = wc.conn.Close()
	}
	return &turn{pool: wp, conn: &waitConn{conn: wp.comp.client.Conn()}}
}

// entered: the wait is about to be sent (through the script: it has its place in the line):
// the next in the queue may have a turn.
func (t *turn) entered() {
	if !t.entering {
		return
	}
	t.entering = false
	wp := t.pool
	wp.mu.Lock()
	defer wp.mu.Unlock()
	wp.entering = false
	wp.handLocked()
}

// end keeps the connection for the next wait (or gives it back to the companion, which
// closes one that failed or was killed) and hands the turn on.
func (t *turn) end() {
	t.entered()
	wp := t.pool
	if t.dirty {
		_ = t.conn.conn.Close()
	}
	wp.mu.Lock()
	defer wp.mu.Unlock()
	if !t.dirty {
		t.conn.since = time.Now()
		wp.idle = append(wp.idle, t.conn)
	}
	if t.closed { // the server closed connections (a restart, CLIENT KILL, its timeout)
		for _, wc := range wp.idle {
			_ = wc.conn.Close()
		}
		wp.idle = wp.idle[:0]
	}
	wp.giveLocked()
}

// --- The backend of a server: the module, or the script ----------------------------------

type backendKey struct {
	client any    // a weak pointer to the *redis.Client, or to the *redis.ClusterClient
	addr   string // in Redis Cluster, the node's address
}

// backendState is what a server answered: the module, or not, at a time.
type backendState struct {
	module bool
	at     time.Time
}

// moduleRecheck: a server without the module is asked again once its answer is this old, so
// that a MODULE LOAD is picked up by live clients (the script also says so at once, to a
// waiter or an acquire it serves).
const moduleRecheck = 10 * time.Second

// backends are kept as long as their client lives.
var backends sync.Map // backendKey -> backendState

func askModule(ctx context.Context, c *redis.Client) (bool, error) {
	reply, err := c.Do(ctx, "COMMAND", "INFO", "SEM.ACQUIRE").Result()
	if err != nil {
		return false, err
	}
	list, _ := reply.([]any)
	return len(list) > 0 && list[0] != nil, nil
}

// hasModule asks the server of c (per client, or per node of a cluster client, owner)
// whether it has the module: COMMAND INFO SEM.ACQUIRE answers [nil] without it. The answer
// is kept: for good once the module is found, else for moduleRecheck.
func hasModule[T any](ctx context.Context, owner *T, addr string, c *redis.Client) (
	bool, backendKey, error,
) {
	key := backendKey{client: weak.Make(owner), addr: addr}
	if v, ok := backends.Load(key); ok {
		module, err := recheck(ctx, key, c, v.(backendState))
		return module, key, err
	}
	module, err := askModule(ctx, c)
	if err != nil {
		return false, key, err
	}
	if _, loaded := backends.Swap(key, backendState{module, time.Now()}); !loaded {
		runtime.AddCleanup(owner, func(key backendKey) { backends.Delete(key) }, key)
	}
	return module, key, nil
}

// recheck is the kept answer, asked again when it says "no module" and is moduleRecheck old.
func recheck(ctx context.Context, key backendKey, c *redis.Client, st backendState) (
	bool, error,
) {
	if st.module || time.Since(st.at) < moduleRecheck {
		return st.module, nil
	}
	module, err := askModule(ctx, c)
	if err != nil {
		return false, err
	}
	backends.CompareAndSwap(key, st, backendState{module, time.Now()})
	return module, nil
}

// moduleFound notes that the script said the module is loaded (ahead -1, or M).
func moduleFound(key backendKey) {
	if v, ok := backends.Load(key); ok {
		backends.CompareAndSwap(key, v, backendState{true, time.Now()})
	}
}

// --- An endpoint: where one call goes ------------------------------------------------------

type endpoint struct {
	pool     *redis.Client // the server's client (in Redis Cluster, the node's)
	conn     *redis.Conn   // a connection of the companion's, or nil: the pool
	comp     *companion    // that companion
	turn     *turn         // a wait's connection while it waits (startWait), or nil
	margin   time.Duration // the companion's margin for calls that do not block
	clientID int64         // CLIENT ID of conn, once asked
	asking   bool          // send ASKING first (an ASK redirection)
	broken   bool          // conn failed or was killed: not to be used again
	scripts  bool          // the server runs the script (it has no module)
	key      backendKey    // where the server's backend is kept
	names    []string      // in Redis Cluster: the long form's names
}

// reply is a command's reply, nil for a nil reply.
func reply(cmd *redis.Cmd) (any, error) {
	v, err := cmd.Result()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	return v, err
}

// raw sends one command as it is and reads its reply, which the server sends at once.
func (e *endpoint) raw(ctx context.Context, args ...any) (any, error) {
	if e.conn == nil {
		return reply(e.pool.Do(ctx, args...))
	}
	if e.margin > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, e.margin)
		defer cancel()
	}
	if e.asking {
		if err := e.conn.Do(ctx, "ASKING").Err(); err != nil {
			e.noteErr(err)
			return nil, err
		}
	}
	v, err := reply(e.conn.Do(ctx, args...))
	e.noteErr(err)
	return v, err
}

func (e *endpoint) noteErr(err error) {
	if err != nil && transient(err) {
		e.broken = true
		if redis.IsReadOnlyError(err) && e.comp != nil {
			// The server at this address is a replica now (a failover): the companion's
			// pooled connections to it are of no use; new ones find the primary (a
			// FailoverClient's dialer asks the sentinels).
			e.comp.retire(e.pool)
		}
	}
}

// send sends a SEM.* command in this server's form: short, long (Redis Cluster) or script.
func (e *endpoint) send(ctx context.Context, args ...any) (any, error) {
	if !e.scripts {
		if e.names != nil {
			args = longForm(args, e.names)
		}
		return e.raw(ctx, args...)
	}
	return e.script(ctx, false, args...)
}

// script sends a SEM.* command as the script (acq: the text a new acquire sends).
func (e *endpoint) script(ctx context.Context, acq bool, args ...any) (any, error) {
	v, err := e.raw(ctx, scriptForm(args, false, acq)...)
	if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		return e.raw(ctx, scriptForm(args, true, acq)...)
	}
	return v, err
}

// poolScript sends a SEM.* command as the script through the pool, not the endpoint's own
// connection (a TICK while that connection blocks, a LEAVE after it was killed).
func (e *endpoint) poolScript(ctx context.Context, args ...any) (any, error) {
	v, err := reply(e.pool.Do(ctx, scriptForm(args, false, false)...))
	if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		return reply(e.pool.Do(ctx, scriptForm(args, true, false)...))
	}
	return v, err
}

// poolSend sends a SEM.* command in this server's form through the pool, not the endpoint's
// own connection (a release after that connection's wait was ended).
func (e *endpoint) poolSend(ctx context.Context, args ...any) (any, error) {
	if e.scripts {
		return e.poolScript(ctx, args...)
	}
	return reply(e.pool.Do(ctx, e.form(args...)...))
}

// checkBackend moves an endpoint on the script to the module once its server has it.
func (e *endpoint) checkBackend(ctx context.Context) {
	if !e.scripts {
		return
	}
	if v, ok := backends.Load(e.key); ok {
		if module, err := recheck(ctx, e.key, e.pool, v.(backendState)); err == nil && module {
			e.scripts = false
		}
	}
}

// useModule: the script said the module is loaded.
func (e *endpoint) useModule() {
	e.scripts = false
	moduleFound(e.key)
}

// form is a SEM.* command in this server's form, for the module.
func (e *endpoint) form(args ...any) []any {
	if e.names != nil {
		return longForm(args, e.names)
	}
	return args
}

// forever marks a call that blocks without limit.
const forever = time.Duration(-1)

// blockResult is the outcome of a blocking call.
type blockResult struct {
	reply any
	err   error
}

// startWait gives the endpoint a connection for a wait that ends at plan's end (endWait gives
// it back): its own, or a turn of the waits' connections (waitPool). When every one is taken,
// it first sends try (the call without waiting, through the client's pool), so that what is
// free now is had now, then queues in arrival order for as long as the wait lasts; if the
// wait's time ends there it sends try once more. wait false: no wait is to be sent (try
// answered, or the time ended in the queue); errCancelled: the context ended in the queue.
func (e *endpoint) startWait(ctx context.Context, plan waitPlan, try func() (bool, error)) (
	wait bool, err error,
) {
	if e.conn != nil {
		return true, nil
	}
	wp := waitPoolOf(e.pool)
	queued := !wp.tryTake()
	if queued {
		if done, err := try(); done || err != nil {
			return false, err
		}
		var deadline time.Time
		if !plan.forever {
			deadline = plan.deadline
		}
		ok, err := wp.take(ctx, deadline)
		if err != nil {
			return false, errCancelled
		}
		if !ok {
			_, err := try()
			return false, err
		}
	}
	e.turn = wp.turn()
	e.turn.entering = queued
	return true, nil
}

// endWait gives back the wait's connection taken by startWait.
func (e *endpoint) endWait() {
	if e.turn != nil {
		e.turn.end()
		e.turn = nil
	}
}

// block sends a command that may block `block` in the server (forever: without limit) on the
// endpoint's own connection or on its wait's (startWait). When ctx ends first, the call is
// ended in the server (CLIENT UNBLOCK, then CLIENT KILL if no reply comes within a second):
// cancelled is true, and the reply is what the server answered (a grant that came at that
// moment included). A connection killed or timed out has a reply left unread: go-redis
// closes it rather than give it back.
func (e *endpoint) block(ctx context.Context, block time.Duration, args ...any) (
	v any, err error, cancelled bool,
) {
	if err := ctx.Err(); err != nil {
		return nil, nil, true
	}
	conn, clientID, margin := e.conn, e.clientID, e.margin
	t := e.turn
	if conn == nil {
		if t == nil {
			return nil, errors.New("redsem: a blocking call without a connection of its own " +
				"(startWait)"), false
		}
		conn, clientID, margin = t.conn.conn, t.conn.clientID, t.pool.comp.margin
		defer func() {
			if err != nil || cancelled {
				t.dirty = true // its connection may be another, or gone
				t.closed = t.closed || transient(err)
			}
		}()
	}
	bctx := context.Background()
	if block != forever {
		var cancel context.CancelFunc
		bctx, cancel = context.WithTimeout(bctx, block+blockMargin)
		defer cancel()
	}
	if ctx.Done() != nil && clientID == 0 {
		cctx := ctx
		if margin > 0 {
			var cancel context.CancelFunc
			cctx, cancel = context.WithTimeout(ctx, margin)
			defer cancel()
		}
		id, err := reply(conn.Do(cctx, "CLIENT", "ID"))
		if err != nil {
			e.noteErr(err)
			return nil, err, false
		}
		clientID, _ = id.(int64)
		if conn == e.conn {
			e.clientID = clientID
		} else {
			t.conn.clientID = clientID
		}
	}
	if e.asking { // ASKING holds for the next command only
		if err := conn.Do(bctx, "ASKING").Err(); err != nil {
			e.noteErr(err)
			return nil, err, false
		}
	}
	if t != nil {
		t.entered()
	}
	if ctx.Done() == nil {
		v, err := reply(conn.Do(bctx, args...))
		e.noteErr(err)
		return v, err, false
	}
	done := make(chan blockResult, 1)
	go func() {
		v, err := reply(conn.Do(bctx, args...))
		done <- blockResult{v, err}
	}()
	select {
	case r := <-done:
		e.noteErr(r.err)
		return r.reply, r.err, false
	case <-ctx.Done():
	}
	// End the call in the server: its reply (nil, or a grant of that moment) follows.
	for i := 0; i < 10; i++ {
		uctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = e.pool.Do(uctx, "CLIENT", "UNBLOCK", clientID).Err()
		cancel()
		select {
		case r := <-done:
			e.noteErr(r.err)
			return r.reply, r.err, true
		case <-time.After(100 * time.Millisecond):
		}
	}
	// No reply: close the connection in the server (a grant not delivered is given back).
	kctx, cancel := context.WithTimeout(context.Background(), time.Second)
	_ = e.pool.Do(kctx, "CLIENT", "KILL", "ID", clientID).Err()
	cancel()
	r := <-done
	if conn == e.conn {
		e.broken = true
	}
	return r.reply, r.err, true
}

func (e *endpoint) close() {
	e.endWait()
	if e.conn != nil {
		_ = e.conn.Close()
		e.conn = nil
	}
}

// unblocked reports a blocking call the server ended with an error: what a primary answers
// its blocked clients as it turns replica (CLUSTER FAILOVER, REPLICAOF), or CLIENT UNBLOCK
// ... ERROR. The wait is sent again for what is left of it.
func unblocked(err error) bool {
	return redis.HasErrorPrefix(err, "UNBLOCKED")
}

// demoted reports a WAIT refused by a node that became a replica since the grant (a failover
// between the two): handled as a cut WAIT, the holder refreshed on the slot's owner first.
func demoted(err error) bool {
	return err != nil && strings.Contains(err.Error(), "WAIT cannot be used with replica instances")
}

// transient reports the errors after which a call in Redis Cluster is sent again to the
// slot's owner, found anew: a slot on the move, a cluster without agreement, a node loading,
// down or gone, a replica; and, everywhere, a connection that cannot be used again.
func transient(err error) bool {
	if err == nil {
		return false
	}
	if redis.IsTryAgainError(err) || redis.IsClusterDownError(err) || redis.IsLoadingError(err) ||
		redis.IsMasterDownError(err) || redis.IsReadOnlyError(err) || unblocked(err) || demoted(err) {
		return true
	}
	var netErr net.Error
	if errors.As(err, &netErr) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, redis.ErrClosed) || errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) {
		return true
	}
	msg := err.Error()
	return strings.Contains(msg, "connection refused") || strings.Contains(msg, "broken pipe") ||
		strings.Contains(msg, "connection reset") || strings.Contains(msg, "use of closed network")
}

// --- A line: where the calls of one semaphore (or set) go ----------------------------------

// DefaultRetryFor is how long a call in Redis Cluster is resent through a move of its slot or
// a failover of its primary before it gives up.
const DefaultRetryFor = 30 * time.Second

const (
	firstPause   = 50 * time.Millisecond
	longestPause = time.Second
)

// redirected counts the calls in Redis Cluster sent again after a redirection or a failure.
var redirected atomic.Int64

type line struct {
	client   *redis.Client        // a plain client, or nil
	cluster  *redis.ClusterClient // a cluster client, or nil
	names    []string
	slot     int
	own      bool // a connection of its own
	retryFor time.Duration

	mu   sync.Mutex // one call at a time (a permit's refresh and its owner's calls)
	ep   *endpoint
	hint string // the node a MOVED named
}

func newLine(client redis.UniversalClient, names []string, retryFor time.Duration, own bool) (
	*line, error,
) {
	if retryFor == 0 {
		retryFor = DefaultRetryFor
	}
	switch c := client.(type) {
	case *redis.Client:
		return &line{client: c, names: names, own: own, retryFor: retryFor}, nil
	case *redis.ClusterClient:
		slot, err := clusterSlot(names)
		if err != nil {
			return nil, err
		}
		return &line{cluster: c, names: names, slot: slot, own: own, retryFor: retryFor}, nil
	case nil:
		return nil, badInput("the client is nil")
	default:
		return nil, badInput("the client must be a *redis.Client (redis.NewClient, "+
			"redis.NewFailoverClient) or a *redis.ClusterClient (redis.NewClusterClient), not %T",
			client)
	}
}

// connectTo makes an endpoint on c, finding out its backend.
func (l *line) connectTo(ctx context.Context, c *redis.Client, own bool) (*endpoint, error) {
	var module bool
	var key backendKey
	var err error
	if l.cluster != nil {
		module, key, err = hasModule(ctx, l.cluster, c.Options().Addr, c)
	} else {
		module, key, err = hasModule(ctx, c, "", c)
	}
	if err != nil {
		return nil, err
	}
	e := &endpoint{pool: c, scripts: !module, key: key}
	if l.cluster != nil {
		e.names = l.names
	}
	if own {
		comp := companionOf(c)
		e.conn = comp.client.Conn()
		e.margin = comp.margin
		e.comp = comp
	}
	return e, nil
}

// node is the client of the node serving the slot: the one a MOVED named, else the
// cluster client's view.
func (l *line) node(ctx context.Context, addr string) (*redis.Client, error) {
	if addr != "" {
		var found *redis.Client
		var mu sync.Mutex
		_ = l.cluster.ForEachShard(ctx, func(_ context.Context, c *redis.Client) error {
			if c.Options().Addr == addr {
				mu.Lock()
				found = c
				mu.Unlock()
			}
			return nil
		})
		if found != nil {
			return found, nil
		}
	}
	return l.cluster.MasterForKey(ctx, l.names[0])
}

// open finds out the backend before anything else is sent: ErrModuleRequired for needs.
func (l *line) open(ctx context.Context, needs string) (scripts bool, err error) {
	_, err = l.run(ctx, time.Time{}, func(e *endpoint) (any, error) {
		scripts = e.scripts
		return nil, nil
	})
	if err == nil && needs != "" && scripts {
		err = moduleRequired(needs)
	}
	return scripts, err
}

// run runs op on the line's endpoint. In Redis Cluster it follows MOVED and ASK and, after
// the errors of transient, pauses (50 ms doubling to 1 s) and sends op again to the slot's
// owner, until it has an answer or retryFor (or until, when given) has passed.
func (l *line) run(ctx context.Context, until time.Time, op func(*endpoint) (any, error)) (
	any, error,
) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cluster == nil {
		if l.ep == nil {
			ep, err := l.connectTo(ctx, l.client, l.own)
			if err != nil {
				return nil, err
			}
			l.ep = ep
		}
		l.ep.checkBackend(ctx)
		again := false
		for {
			v, err := op(l.ep)
			if !l.ep.broken {
				return v, err
			}
			l.drop() // a fresh connection for the next call
			if !transient(err) || ctx.Err() != nil {
				return v, err
			}
			// Once more on a fresh connection: the same arguments, the same identifier; a wait
			// the server ended (UNBLOCKED) as often as it is ended, for what is left of it.
			if !unblocked(err) {
				if again {
					return v, err
				}
				again = true
			}
			if l.ep, err = l.connectTo(ctx, l.client, l.own); err != nil {
				return nil, err
			}
		}
	}
	giveUp := time.Now().Add(l.retryFor)
	if !until.IsZero() && until.Before(giveUp) {
		giveUp = until
	}
	pause := firstPause
	asked := ""
	for {
		var v any
		var err error
		if asked != "" {
			var c *redis.Client
			if c, err = l.node(ctx, asked); err == nil {
				var e *endpoint
				if e, err = l.connectTo(ctx, c, true); err == nil {
					e.asking = true
					v, err = op(e)
					e.close()
				}
			}
			asked = ""
		} else {
			if l.ep == nil {
				var c *redis.Client
				if c, err = l.node(ctx, l.hint); err == nil {
					l.ep, err = l.connectTo(ctx, c, l.own)
				}
			}
			if err == nil {
				l.ep.checkBackend(ctx)
				v, err = op(l.ep)
				if l.ep.broken {
					l.drop()
				}
			}
		}
		if err == nil {
			return v, nil
		}
		movedTo, moved := redis.IsMovedError(err)
		askedBy, ask := redis.IsAskError(err)
		if !moved && !ask && !transient(err) {
			return v, err
		}
		if ctx.Err() != nil {
			return nil, err
		}
		redirected.Add(1)
		left := time.Until(giveUp)
		if left <= 0 {
			return nil, &described{
				msg: fmt.Sprintf("redsem: no answer from the primary of slot %d within %s of "+
					"retries through moves and failovers: %v", l.slot, l.retryFor, err),
				kind: ErrUnavailable,
				err:  err,
			}
		}
		switch {
		case moved:
			l.drop()
			l.hint = movedTo
			l.cluster.ReloadState(ctx)
		case ask:
			asked = askedBy
		default:
			l.drop()
			l.hint = ""
			wait := min(pause, left)
			pause = min(pause*2, longestPause)
			select {
			case <-ctx.Done():
				return nil, err
			case <-time.After(wait):
			}
			l.cluster.ReloadState(ctx)
		}
	}
}

func (l *line) drop() {
	if l.ep != nil {
		l.ep.close()
		l.ep = nil
	}
}

// close gives the line's connection back.
func (l *line) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.drop()
}
