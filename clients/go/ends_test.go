package redsem

import (
	"context"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// How calls end: a release whose context is over, a wait cut short by the context or by the
// server (UNBLOCKED), and the durability WAIT cut by a failover.

// `defer permit.Release(ctx)` in a handler whose request was cancelled still gives the permit
// back, and a release that failed may be sent again.
func TestReleaseWithAContextAlreadyOver(t *testing.T) {
	_, c := testServer(t)
	over, cancel := context.WithCancel(bg)
	cancel()
	p, err := Acquire(bg, c, "handler", Options{Limit: 1})
	require.NoError(t, err)
	require.NoError(t, p.Release(over))
	assert.Equal(t, int64(0), holders(t, c, "handler"), "given back")
	require.NoError(t, p.Release(bg), "a second release repeats the answer")

	// A release whose context ends during the call (the server is paused) gets no answer: the
	// permit stays releasable, and a second release gives it back.
	p, err = Acquire(bg, c, "handler", Options{Limit: 1})
	require.NoError(t, err)
	require.NoError(t, c.Do(bg, "CLIENT", "PAUSE", 10000, "WRITE").Err())
	short, cancel := context.WithTimeout(bg, 200*time.Millisecond)
	defer cancel()
	err = p.Release(short)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.NoError(t, c.Do(bg, "CLIENT", "UNPAUSE").Err())
	assert.Equal(t, int64(1), holders(t, c, "handler"), "the first release was not done")
	require.NoError(t, p.Release(bg))
	assert.Equal(t, int64(0), holders(t, c, "handler"))
	assert.False(t, p.Lost())

	if scriptsBackend() {
		return
	}
	s, err := AcquireAll(bg, c, []Member{{Name: "a", Limit: 1}, {Name: "b", Limit: 1}},
		SetOptions{})
	require.NoError(t, err)
	require.NoError(t, s.Release(over))
	assert.Equal(t, int64(0), holders(t, c, "a")+holders(t, c, "b"), "the set was given back")
}

// A wait whose grant comes as the context ends, on a connection that never delivers it: the
// grant is given back rather than held by nobody until its lease ends.
func TestGrantAtCancelGivenBack(t *testing.T) {
	s, c := testServer(t)
	var on atomic.Bool
	on.Store(true)
	hung := redis.NewClient(&redis.Options{Addr: s.addr, Dialer: func(ctx context.Context,
		network, addr string,
	) (net.Conn, error) {
		conn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &swallowing{Conn: conn, on: &on}, nil
	}})
	defer hung.Close()
	holder, err := Acquire(bg, c, "late", Options{Limit: 1, Lease: 30 * time.Second})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(bg, 800*time.Millisecond)
	defer cancel()
	got := make(chan error, 1)
	go func() {
		_, err := Acquire(ctx, hung, "late", Options{Limit: 1, Lease: 30 * time.Second,
			Wait: 30 * time.Second})
		got <- err
	}()
	require.Eventually(t, func() bool { return blockedClient(t, c) != 0 }, 3*time.Second,
		10*time.Millisecond, "the waiter blocks")
	require.NoError(t, holder.Release(bg)) // granted to the waiter, which never reads it
	select {
	case err = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("the acquire did not end")
	}
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Equal(t, int64(0), holders(t, c, "late"), "the grant was given back")
	p, err := Acquire(bg, c, "late", Options{Limit: 1})
	require.NoError(t, err, "nobody else holds it")
	require.NoError(t, p.Release(bg))
}

// blockedClient is the id of a client blocked in the server (0: none).
func blockedClient(t *testing.T, c *redis.Client) int64 {
	list, err := c.ClientList(bg).Result()
	require.NoError(t, err)
	for _, line := range strings.Split(list, "\n") {
		fields := map[string]string{}
		for _, f := range strings.Fields(line) {
			if k, v, ok := strings.Cut(f, "="); ok {
				fields[k] = v
			}
		}
		if strings.Contains(fields["flags"], "b") {
			id, _ := strconv.ParseInt(fields["id"], 10, 64)
			return id
		}
	}
	return 0
}

// A wait the server ends with an error (UNBLOCKED: what a primary turned replica answers its
// blocked clients, here CLIENT UNBLOCK ... ERROR) waits again for what is left of it.
func TestUnblockedWaitWaitsAgain(t *testing.T) {
	_, c := testServer(t)
	holder, err := Acquire(bg, c, "cut", Options{Limit: 1})
	require.NoError(t, err)
	type result struct {
		p   *Permit
		err error
	}
	got := make(chan result, 1)
	started := time.Now()
	go func() {
		p, err := Acquire(bg, c, "cut", Options{Limit: 1, Wait: 10 * time.Second})
		got <- result{p, err}
	}()
	var id int64
	require.Eventually(t, func() bool { id = blockedClient(t, c); return id != 0 }, 3*time.Second,
		10*time.Millisecond, "the waiter blocks")
	unblocked, err := c.Do(bg, "CLIENT", "UNBLOCK", id, "ERROR").Int()
	require.NoError(t, err)
	require.Equal(t, 1, unblocked)
	require.Eventually(t, func() bool {
		next := blockedClient(t, c)
		return next != 0
	}, 5*time.Second, 10*time.Millisecond, "the waiter blocks again")
	select {
	case r := <-got:
		t.Fatalf("the acquire ended while the semaphore was full: %v", r.err)
	case <-time.After(300 * time.Millisecond):
	}
	require.NoError(t, holder.Release(bg))
	var r result
	select {
	case r = <-got:
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter was not served")
	}
	require.NoError(t, r.err)
	assert.Less(t, time.Since(started), 10*time.Second)
	assert.Equal(t, int64(1), holders(t, c, "cut"))
	require.NoError(t, r.p.Release(bg))
	assert.Equal(t, int64(0), holders(t, c, "cut"))

	// Its budget holds: unblocked again and again, it ends when its wait does.
	holder, err = Acquire(bg, c, "cut", Options{Limit: 1})
	require.NoError(t, err)
	started = time.Now()
	ended := make(chan error, 1)
	go func() {
		_, err := Acquire(bg, c, "cut", Options{Limit: 1, Wait: 1500 * time.Millisecond})
		ended <- err
	}()
	var last error
	for done := false; !done; {
		select {
		case last = <-ended:
			done = true
		case <-time.After(100 * time.Millisecond):
			if id := blockedClient(t, c); id != 0 {
				_ = c.Do(bg, "CLIENT", "UNBLOCK", id, "ERROR").Err()
			}
		}
	}
	require.ErrorIs(t, last, ErrNotAcquired)
	took := time.Since(started)
	assert.Greater(t, took, 1400*time.Millisecond)
	assert.Less(t, took, 4*time.Second)
	require.NoError(t, holder.Release(bg))
	assert.Equal(t, int64(0), holders(t, c, "cut"))
}

// The durability WAIT cut by a failover: the grant never reached the replica (stopped), the
// primary dies during the WAIT and the replica is promoted. A WAIT sent again on a new
// connection would answer at once (that connection wrote nothing); the acquire must instead
// find that the new primary has no such holder.
func TestDurableWaitCutByFailover(t *testing.T) {
	primary := startServer(t, !scriptsBackend())
	replica := startServer(t, !scriptsBackend(), "--replicaof", "127.0.0.1",
		strconv.Itoa(primary.port))
	// The replica's own replica: the promoted one has a replica to count, as after a real
	// failover, so that a WAIT on a fresh connection answers 1 at once.
	below := startServer(t, !scriptsBackend(), "--replicaof", "127.0.0.1",
		strconv.Itoa(replica.port))
	p, r := primary.client(t), replica.client(t)
	for _, s := range []*redis.Client{p, r} {
		require.Eventually(t, func() bool {
			info, err := s.Info(bg, "replication").Result()
			return err == nil && strings.Contains(info, "state=online")
		}, 10*time.Second, 50*time.Millisecond, "the replicas are online")
	}
	_ = below

	// The client follows the primary as a FailoverClient does: new connections wait while the
	// failover is under way, then go to the new primary.
	var failing sync.RWMutex
	addr := primary.addr
	c := redis.NewClient(&redis.Options{Addr: primary.addr, MaxRetries: -1,
		Dialer: func(ctx context.Context, network, _ string) (net.Conn, error) {
			failing.RLock()
			to := addr
			failing.RUnlock()
			return (&net.Dialer{}).DialContext(ctx, network, to)
		}})
	defer c.Close()
	// Asked before the replica stops: the package knows the backend.
	warm, err := Acquire(bg, c, "{durable}", Options{Limit: 2})
	require.NoError(t, err)
	require.NoError(t, warm.Release(bg))

	pid := serverPid(t, r)
	require.NoError(t, syscall.Kill(pid, syscall.SIGSTOP))
	stopped := true
	defer func() {
		if stopped {
			_ = syscall.Kill(pid, syscall.SIGCONT)
		}
	}()
	// Its link closed too: what the primary writes next never reaches it (a stopped process's
	// socket would still take it in).
	require.NoError(t, p.Do(bg, "CLIENT", "KILL", "TYPE", "replica").Err())
	got := make(chan error, 1)
	var held atomic.Pointer[Permit]
	go func() {
		permit, err := Acquire(bg, c, "{durable}", Options{Limit: 2, DurableReplicas: 1,
			DurableTimeout: 20 * time.Second})
		held.Store(permit)
		got <- err
	}()
	require.Eventually(t, func() bool {
		info, err := p.Info(bg, "clients").Result()
		return err == nil && !strings.Contains(info, "blocked_clients:0\r\n")
	}, 5*time.Second, 10*time.Millisecond, "the grant waits for the replica")
	require.Equal(t, int64(1), holders(t, p, "{durable}"))
	primaryPid := serverPid(t, p)
	failing.Lock()
	require.NoError(t, syscall.Kill(primaryPid, syscall.SIGKILL))
	require.NoError(t, syscall.Kill(pid, syscall.SIGCONT))
	stopped = false
	require.NoError(t, r.Do(bg, "REPLICAOF", "NO", "ONE").Err())
	addr = replica.addr
	failing.Unlock()

	var err2 error
	select {
	case err2 = <-got:
	case <-time.After(15 * time.Second):
		t.Fatal("the acquire did not end")
	}
	assert.Equal(t, int64(0), holders(t, r, "{durable}"), "the grant did not survive")
	var nd *NotDurableError
	require.ErrorAs(t, err2, &nd, "a permit no replica has is not durable")
	assert.Nil(t, held.Load())

	// The new primary's replica acknowledges a new grant.
	ok, err := Acquire(bg, c, "{durable}", Options{Limit: 2, DurableReplicas: 1,
		DurableTimeout: 5 * time.Second})
	require.NoError(t, err)
	require.NoError(t, ok.Release(bg))
}

// serverPid is the process id of the server behind c.
func serverPid(t *testing.T, c *redis.Client) int {
	info, err := c.Info(bg, "server").Result()
	require.NoError(t, err)
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "process_id:"); ok {
			pid, err := strconv.Atoi(v)
			require.NoError(t, err)
			return pid
		}
	}
	t.Fatal("no process_id in INFO server")
	return 0
}

// A durable grant's WAIT on a node that became a replica since the grant gets the server's
// refusal; it is handled as a cut WAIT (sent again on the slot's owner after a refresh there).
func TestWaitRefusedByADemotedNodeIsACutWait(t *testing.T) {
	_, c := testServer(t)
	ctx := context.Background()
	require.NoError(t, c.Do(ctx, "REPLICAOF", "127.0.0.1", freePort(t)).Err())
	t.Cleanup(func() { c.Do(context.Background(), "REPLICAOF", "NO", "ONE") })
	err := c.Do(ctx, "WAIT", 1, 100).Err()
	require.Error(t, err)
	assert.True(t, demoted(err), "%v", err)
	assert.True(t, transient(err), "%v", err)
	assert.False(t, demoted(redis.Nil))
}
