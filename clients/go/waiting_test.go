package redsem

import (
	"bytes"
	"context"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The waits of both backends, and the script's line (clients/scripts/redsem.lua, "The line").

func TestScriptTexts(t *testing.T) {
	require.True(t, strings.HasPrefix(scriptOOM, oomLine+"\n"), "the script's first line")
	require.True(t, strings.HasPrefix(scriptAcq, "#!lua\n"))
	assert.Equal(t, scriptOOM[len(oomLine):], scriptAcq[len("#!lua"):])
	assert.NotEqual(t, scriptOOMSHA, scriptAcqSHA)
}

// An "H<ms>" message gives the milliseconds to a lease's end; "H" alone (an older script's)
// and anything else, none: the waiter tries again.
func TestNudgeMillis(t *testing.T) {
	for msg, want := range map[string]int64{"H120": 120, "H": 0, "Hx": 0, "H-5": 0, "G17": 0, "": 0} {
		if got := nudgeMillis(msg); got != want {
			t.Errorf("nudgeMillis(%q) = %d, want %d", msg, got, want)
		}
	}
}

// Waiters are granted in the order they arrived, fair or plain.
func TestFirstComeFirstServed(t *testing.T) {
	_, c := testServer(t)
	for _, fair := range []bool{true, false} {
		name := "fcfs-" + strconv.FormatBool(fair)
		holder, err := Acquire(bg, c, name, Options{Limit: 1, Fair: fair})
		require.NoError(t, err)
		var mu sync.Mutex
		var order []int
		var wg sync.WaitGroup
		for i := 0; i < 6; i++ {
			wg.Add(1)
			go func(who int) {
				defer wg.Done()
				p, err := Acquire(bg, c, name, Options{Limit: 1, Fair: fair, Wait: 20 * time.Second})
				if !assert.NoError(t, err) {
					return
				}
				mu.Lock()
				order = append(order, who)
				mu.Unlock()
				assert.NoError(t, p.Release(bg))
			}(i)
			time.Sleep(30 * time.Millisecond)
		}
		require.NoError(t, holder.Release(bg))
		wg.Wait()
		assert.Equal(t, []int{0, 1, 2, 3, 4, 5}, order, "fair %v", fair)
	}
}

func configSet(t *testing.T, c *redis.Client, key, value string) {
	t.Helper()
	old, err := c.ConfigGet(bg, key).Result()
	require.NoError(t, err)
	require.NoError(t, c.ConfigSet(bg, key, value).Err())
	t.Cleanup(func() { _ = c.ConfigSet(bg, key, old[key]).Err() })
}

// median of three or more durations: one round slowed by a busy machine does not decide.
func median(ds []time.Duration) time.Duration {
	sorted := append([]time.Duration(nil), ds...)
	slices.Sort(sorted)
	return sorted[len(sorted)/2]
}

// A lease that runs out serves the first waiter at once, though the server's expiry cycle
// runs once a second (hz 1); a release serves it at once too. Three rounds of each: the
// median is within the bound, and none is as late as the expiry cycle or a re-attempt.
func TestWaiterServedAtLeaseEndAndRelease(t *testing.T) {
	_, c := testServer(t)
	configSet(t, c, "hz", "1")
	var late []time.Duration
	for round := 0; round < 3; round++ {
		name := "lease-end-" + strconv.Itoa(round)
		sent := time.Now()
		_, err := Acquire(bg, c, name, Options{Limit: 1, Lease: 300 * time.Millisecond,
			ManualRefresh: true}) // never refreshed nor released
		require.NoError(t, err)
		answered := time.Now()
		p, err := Acquire(bg, c, name, Options{Limit: 1, Wait: 5 * time.Second})
		require.NoError(t, err)
		granted := time.Now()
		assert.GreaterOrEqual(t, granted.Sub(sent), 300*time.Millisecond)
		late = append(late, granted.Sub(answered.Add(300*time.Millisecond)))
		require.NoError(t, p.Release(bg))
	}
	t.Logf("granted after the lease's end: %v", late)
	assert.Less(t, median(late), 150*time.Millisecond, "granted within 150 ms of the lease's end")
	assert.Less(t, slices.Max(late), time.Second)

	type result struct {
		p   *Permit
		err error
		at  time.Time
	}
	late = nil
	for round := 0; round < 3; round++ {
		name := "on-release-" + strconv.Itoa(round)
		holder, err := Acquire(bg, c, name, Options{Limit: 1})
		require.NoError(t, err)
		got := make(chan result, 1)
		go func() {
			p, err := Acquire(bg, c, name, Options{Limit: 1, Wait: 5 * time.Second})
			got <- result{p, err, time.Now()}
		}()
		time.Sleep(300 * time.Millisecond)
		require.NoError(t, holder.Release(bg))
		released := time.Now()
		r := <-got
		require.NoError(t, r.err)
		late = append(late, r.at.Sub(released))
		require.NoError(t, r.p.Release(bg))
	}
	t.Logf("granted after the release's reply: %v", late)
	assert.Less(t, median(late), 50*time.Millisecond, "granted at the release")
	assert.Less(t, slices.Max(late), time.Second)
}

// When memory is full, a refresh and a release work and serve a waiter already in line; a
// new acquire is refused with the server's OOM error and changes nothing.
func TestMemoryFull(t *testing.T) {
	_, c := testServer(t)
	const name = "full"
	p, err := Acquire(bg, c, name, Options{Limit: 1, Fair: true, ManualRefresh: true})
	require.NoError(t, err)
	waiter := make(chan *Permit, 1)
	go func() {
		w, err := Acquire(bg, c, name, Options{Limit: 1, Fair: true, Wait: 20 * time.Second})
		assert.NoError(t, err)
		waiter <- w
	}()
	time.Sleep(200 * time.Millisecond) // in line
	configSet(t, c, "maxmemory-policy", "noeviction")
	configSet(t, c, "maxmemory", "1")

	require.NoError(t, p.Refresh(bg))
	keys := []string{name, name + ":owner", name + ":counter", name + ":permits", name + ":limit",
		name + ":line"}
	dump := func() []string {
		out := make([]string, len(keys))
		for i, k := range keys {
			v, err := c.Dump(bg, k).Result()
			if err != redis.Nil {
				require.NoError(t, err)
			}
			out[i] = v
		}
		return out
	}
	before := dump()
	_, err = Acquire(bg, c, name, Options{Limit: 1, Fair: true})
	require.Error(t, err)
	assert.True(t, redis.HasErrorPrefix(err, "OOM"), "the server's OOM error, not %v", err)
	_, err = Acquire(bg, c, name, Options{Limit: 1, Fair: true, Wait: time.Second})
	assert.True(t, redis.HasErrorPrefix(err, "OOM"), "a new waiter too, not %v", err)
	assert.Equal(t, before, dump(), "the refused acquires changed nothing")

	require.NoError(t, p.Release(bg))
	select {
	case w := <-waiter:
		require.NotNil(t, w)
		assert.Greater(t, w.Ticket(), p.Ticket())
		require.NoError(t, w.Refresh(bg))
		require.NoError(t, w.Release(bg))
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter in line was not served by the release")
	}
	assert.Equal(t, int64(0), holders(t, c, name))
}

// Sequential waits reuse the same few connections: no new connection per wait.
func TestWaitsReuseConnections(t *testing.T) {
	s, info := testServer(t)
	const poolSize = 3
	c := redis.NewClient(&redis.Options{Addr: s.addr, PoolSize: poolSize})
	defer c.Close()
	received := func() int64 {
		text, err := info.Info(bg, "stats").Result()
		require.NoError(t, err)
		for _, line := range strings.Split(text, "\r\n") {
			if v, ok := strings.CutPrefix(line, "total_connections_received:"); ok {
				n, err := strconv.ParseInt(v, 10, 64)
				require.NoError(t, err)
				return n
			}
		}
		t.Fatal("no total_connections_received in INFO stats")
		return 0
	}
	wait := func() {
		holder, err := Acquire(bg, c, "reused", Options{Limit: 1})
		require.NoError(t, err)
		time.AfterFunc(20*time.Millisecond, func() { _ = holder.Release(bg) })
		started := time.Now()
		p, err := Acquire(bg, c, "reused", Options{Limit: 1, Wait: 5 * time.Second})
		require.NoError(t, err)
		require.GreaterOrEqual(t, time.Since(started), 10*time.Millisecond, "the wait blocked")
		require.NoError(t, p.Release(bg))
	}
	start := received()
	wait() // the client's pool and the companion's have their first connections
	before := received()
	for i := 0; i < 50; i++ {
		wait()
	}
	grew := received() - before
	t.Logf("the first wait: %d connections received; the next 50: %d", before-start, grew)
	assert.LessOrEqual(t, grew, int64(poolSize))
	assert.LessOrEqual(t, received()-start, int64(2*poolSize), "the client's pool and the "+
		"companion's, each of PoolSize")
}

// A waiter whose process died without leaving the line (its place no longer renewed) is
// dropped within 6 s of its last attempt: the next waiter is granted.
func TestDeadWaiterLeavesTheLine(t *testing.T) {
	if !scriptsBackend() {
		t.Skip("the script's line (the module drops a waiter with its connection)")
	}
	_, c := testServer(t)
	const name = "ghosted"
	_, err := Acquire(bg, c, name, Options{Limit: 1, Lease: 6500 * time.Millisecond,
		ManualRefresh: true}) // never refreshed nor released: the lease ends at 6.5 s
	require.NoError(t, err)
	v, err := c.Do(bg, scriptForm([]any{"SEM.ACQUIRE", name, 1, "30", "ID", "ghost", "LINE"},
		true, true)...).Result()
	require.NoError(t, err)
	died := time.Now()
	assert.Equal(t, []any{nil, v.([]any)[1], int64(0)}, v, "the ghost is first in line")
	p, err := Acquire(bg, c, name, Options{Limit: 1, Wait: 20 * time.Second})
	require.NoError(t, err)
	assert.Less(t, time.Since(died), 6*time.Second+2500*time.Millisecond+500*time.Millisecond)
	_, err = c.ZScore(bg, name, "ghost").Result()
	assert.ErrorIs(t, err, redis.Nil, "the ghost was not granted")
	require.NoError(t, p.Release(bg))
}

// A server without the module, then MODULE LOAD: a client made after it waits with the
// module and a release sent through the script by an older client serves it at once; the
// older client's script waiter is told (M) and goes on waiting with the module, and that
// client is on the module at once.
func TestModulePickedUpLive(t *testing.T) {
	if !scriptsBackend() {
		t.Skip("the backend is the module")
	}
	s := startServer(t, false)
	a := s.client(t)
	made := time.Now()
	holder, err := Acquire(bg, a, "live", Options{Limit: 1})
	require.NoError(t, err)
	type result struct {
		p   *Permit
		err error
		at  time.Time
	}
	fromA := make(chan result, 1)
	go func() {
		p, err := Acquire(bg, a, "live", Options{Limit: 1, Wait: 20 * time.Second})
		fromA <- result{p, err, time.Now()}
	}()
	time.Sleep(200 * time.Millisecond)
	n, err := a.Exists(bg, "live:line").Result()
	require.NoError(t, err)
	require.Equal(t, int64(1), n, "A's waiter is in the script's line")
	require.NoError(t, a.Do(bg, "MODULE", "LOAD", modulePath(t)).Err())

	b := s.client(t)
	fromB := make(chan result, 1)
	go func() {
		p, err := Acquire(bg, b, "live", Options{Limit: 1, Wait: 20 * time.Second})
		fromB <- result{p, err, time.Now()}
	}()
	time.Sleep(200 * time.Millisecond) // B waits in the module
	require.NoError(t, holder.Release(bg), "A's release, through the script")
	released := time.Now()
	var rb result
	select {
	case rb = <-fromB:
	case <-time.After(5 * time.Second):
		t.Fatal("B's waiter was not served by A's release")
	}
	require.NoError(t, rb.err)
	assert.Less(t, rb.at.Sub(released), 100*time.Millisecond, "served at once")
	require.NoError(t, rb.p.Release(bg))
	var ra result
	select {
	case ra = <-fromA:
	case <-time.After(5 * time.Second):
		t.Fatal("A's waiter was not served")
	}
	require.NoError(t, ra.err)
	require.NoError(t, ra.p.Release(bg))

	// A is on the module: BOUND (the module's only) works, before A's 10 s recheck.
	bound, err := Acquire(bg, a, "live-bound", Options{Limit: 1, Bound: true})
	require.NoError(t, err)
	require.NoError(t, bound.Release(bg))
	assert.Less(t, time.Since(made), moduleRecheck)
}

// swallowing wraps the connections of a client: once on, the replies to a blocking command
// (BLPOP, a WAIT) are never delivered, as if the connection hung.
type swallowing struct {
	net.Conn
	on       *atomic.Bool
	blocking atomic.Bool
}

func (c *swallowing) Write(b []byte) (int, error) {
	c.blocking.Store(bytes.Contains(b, []byte("BLPOP")) || bytes.Contains(b, []byte("\r\nWAIT\r\n")))
	return c.Conn.Write(b)
}

func (c *swallowing) Read(b []byte) (int, error) {
	for {
		n, err := c.Conn.Read(b)
		if err != nil || !c.blocking.Load() || !c.on.Load() {
			return n, err
		}
	}
}

// A cancelled wait whose connection gives no reply to CLIENT UNBLOCK is ended with CLIENT
// KILL: the waiter is gone from the server, and the permit goes to the next caller.
func TestCancelledWaitKilledWithoutReply(t *testing.T) {
	s, c := testServer(t)
	var on atomic.Bool
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
	holder, err := Acquire(bg, c, "hung", Options{Limit: 1})
	require.NoError(t, err)
	on.Store(true)
	ctx, cancel := context.WithTimeout(bg, 300*time.Millisecond)
	defer cancel()
	started := time.Now()
	_, err = Acquire(ctx, hung, "hung", Options{Limit: 1, Wait: 30 * time.Second})
	require.ErrorIs(t, err, context.DeadlineExceeded)
	took := time.Since(started)
	assert.Greater(t, took, time.Second, "CLIENT UNBLOCK had its second")
	assert.Less(t, took, 5*time.Second)
	on.Store(false)
	require.Eventually(t, func() bool {
		text, err := c.Info(bg, "clients").Result()
		return err == nil && strings.Contains(text, "blocked_clients:0\r\n")
	}, 2*time.Second, 20*time.Millisecond, "the waiting connection was killed")
	n, err := c.Exists(bg, "hung:line").Result()
	require.NoError(t, err)
	assert.Equal(t, int64(0), n, "the waiter left the line")
	require.NoError(t, holder.Release(bg))
	p, err := Acquire(bg, c, "hung", Options{Limit: 1})
	require.NoError(t, err, "nobody else holds it")
	require.NoError(t, p.Release(bg))
}

// A grant that fails in the server (here the fair counter was overwritten by another client)
// is the waiter's error, raised as the server's errors are.
func TestFailedGrantIsTheWaitersError(t *testing.T) {
	_, c := testServer(t)
	const name = "broken"
	holder, err := Acquire(bg, c, name, Options{Limit: 1, Fair: true})
	require.NoError(t, err)
	got := make(chan error, 1)
	go func() {
		p, err := Acquire(bg, c, name, Options{Limit: 1, Fair: true, Wait: 10 * time.Second})
		if err == nil {
			_ = p.Release(bg)
		}
		got <- err
	}()
	time.Sleep(200 * time.Millisecond) // in line
	require.NoError(t, c.Set(bg, name+":counter", "not a ticket", 0).Err())
	require.NoError(t, holder.Release(bg))
	select {
	case err = <-got:
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter got no answer")
	}
	var server redis.Error
	require.ErrorAs(t, err, &server)
	assert.Contains(t, err.Error(), "counter key does not hold")
	assert.Equal(t, int64(0), holders(t, c, name))
}
