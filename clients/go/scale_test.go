package redsem

import (
	"context"
	"runtime"
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

// The package at an application's scale, with the client's default settings.

// infoField is a number of INFO's section.
func infoField(t testing.TB, c *redis.Client, section, field string) int64 {
	t.Helper()
	text, err := c.Info(bg, section).Result()
	require.NoError(t, err)
	for _, line := range strings.Split(text, "\r\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			require.NoError(t, err)
			return n
		}
	}
	t.Fatalf("no %s in INFO %s", field, section)
	return 0
}

// appCalls runs the application's own SET and GET on c every 10 ms until stop: the slowest
// answer and the errors.
func appCalls(c *redis.Client, stop <-chan struct{}) func() (time.Duration, int, []error) {
	var mu sync.Mutex
	var slowest time.Duration
	var calls int
	var errs []error
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
			started := time.Now()
			err := c.Set(bg, "app:key", i, 0).Err()
			if err == nil {
				err = c.Get(bg, "app:key").Err()
			}
			took := time.Since(started)
			mu.Lock()
			calls++
			slowest = max(slowest, took)
			if err != nil {
				errs = append(errs, err)
			}
			mu.Unlock()
		}
	}()
	return func() (time.Duration, int, []error) {
		<-done
		return slowest, calls, errs
	}
}

// 200 waiting acquires (Wait 10 s) of one name of limit 1, far more than the client's
// PoolSize (the waits' connections at once): all are served, in the order they came, with a
// hand-off every 40 ms (8 s in all, twice go-redis's PoolTimeout), none failing on a pool
// timeout; the holders' releases and the application's own calls on the same client answer
// meanwhile at once.
func TestTwoHundredWaitersServedInOrder(t *testing.T) {
	s, c := testServer(t) // the client's default settings
	info := s.client(t)
	const name, n, every = "crowd", 200, 40 * time.Millisecond
	holder, err := Acquire(bg, c, name, Options{Limit: 1})
	require.NoError(t, err)
	waiting := func() int {
		return int(infoField(t, info, "clients", "blocked_clients")) + waitPoolOf(c).queued()
	}
	var (
		t0       time.Time // the first hand-off
		served   atomic.Int64
		mu       sync.Mutex
		order    []int
		errs     []error
		slowest  time.Duration
		releases sync.WaitGroup
	)
	for i := 0; i < n; i++ {
		releases.Add(1)
		go func(who int) {
			defer releases.Done()
			p, err := Acquire(bg, c, name, Options{Limit: 1, Wait: 10 * time.Second})
			if err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
				return
			}
			k := served.Add(1)
			mu.Lock()
			order = append(order, who)
			mu.Unlock()
			time.Sleep(time.Until(t0.Add(time.Duration(k) * every)))
			started := time.Now()
			err = p.Release(bg)
			took := time.Since(started)
			mu.Lock()
			slowest = max(slowest, took)
			if err != nil {
				errs = append(errs, err)
			}
			mu.Unlock()
		}(i)
		// In line (in the server, or queued here) before the next one comes.
		require.Eventually(t, func() bool { return waiting() >= i+1 }, 5*time.Second,
			2*time.Millisecond, "waiter %d is not waiting", i)
	}
	t.Logf("%d waits blocked in the server, %d queued in the package (PoolSize %d)",
		infoField(t, info, "clients", "blocked_clients"), waitPoolOf(c).queued(),
		c.Options().PoolSize)
	stop := make(chan struct{})
	app := appCalls(c, stop)
	t0 = time.Now()
	require.NoError(t, holder.Release(bg))
	releases.Wait()
	close(stop)
	appSlowest, calls, appErrs := app()
	t.Logf("served %d in %s; the slowest release took %s; the app's %d calls, the slowest %s",
		len(order), time.Since(t0), slowest, calls, appSlowest)
	require.Empty(t, errs)
	want := make([]int, n)
	for i := range want {
		want[i] = i
	}
	assert.Equal(t, want, order, "served in the order they came")
	assert.Empty(t, appErrs)
	assert.Less(t, appSlowest, time.Second, "the application's calls answer meanwhile")
	assert.Less(t, slowest, time.Second, "the holders' releases answer at once")
	assert.Equal(t, int64(0), holders(t, c, name))
}

// holdMany acquires n permits of n names ("<prefix><i>") through c, 16 at a time.
func holdMany(t *testing.T, c *redis.Client, prefix string, n int, o Options) []*Permit {
	t.Helper()
	permits := make([]*Permit, n)
	var next atomic.Int64
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
				p, err := Acquire(bg, c, prefix+strconv.Itoa(i), o)
				if err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
					return
				}
				permits[i] = p
			}
		}()
	}
	wg.Wait()
	require.Empty(t, errs)
	return permits
}

// releaseMany gives back every permit, 16 at a time: none was lost.
func releaseMany(t *testing.T, permits []*Permit) {
	t.Helper()
	var next atomic.Int64
	var wg sync.WaitGroup
	var failed atomic.Int64
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1) - 1); i < len(permits); i = int(next.Add(1) - 1) {
				if err := permits[i].Release(bg); err != nil {
					failed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	require.Equal(t, int64(0), failed.Load(), "releases that failed, or found the permit lost")
}

// heldInServer counts the permits whose holders the server has.
func heldInServer(t *testing.T, c *redis.Client, permits []*Permit) int {
	t.Helper()
	cmds, err := c.Pipelined(bg, func(p redis.Pipeliner) error {
		for _, permit := range permits {
			p.ZScore(bg, permit.Name(), permit.ID())
		}
		return nil
	})
	require.NoError(t, err)
	held := 0
	for _, cmd := range cmds {
		if cmd.Err() == nil {
			held++
		}
	}
	return held
}

// 10,000 permits of 10,000 names held at once through one client with its default settings:
// no connection and no goroutine per permit (the connections the server counts stay within
// the client's PoolSize, the goroutines a handful), at most 4 KB of memory each, and the
// application's own calls on the same client answer meanwhile.
func TestTenThousandPermitsHeld(t *testing.T) {
	s, c := testServer(t)
	info := s.client(t)
	const n = 10000
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	goroutines := runtime.NumGoroutine()
	stop := make(chan struct{})
	app := appCalls(c, stop)
	started := time.Now()
	permits := holdMany(t, c, "many-", n, Options{}) // the zero Options: limit 1
	t.Logf("%d permits acquired in %s", n, time.Since(started))
	runtime.GC()
	runtime.ReadMemStats(&after)
	perPermit := (int64(after.HeapAlloc) - int64(before.HeapAlloc)) / n
	more := runtime.NumGoroutine() - goroutines
	conns := infoField(t, info, "clients", "connected_clients") - 1 // less info's own
	t.Logf("held: %d bytes of heap per permit, %d goroutines more, %d connections (PoolSize %d)",
		perPermit, more, conns, c.Options().PoolSize)
	assert.LessOrEqual(t, perPermit, int64(4096))
	assert.LessOrEqual(t, more, 4, "the app's calls, the scheduler, at most a refresh or two")
	assert.LessOrEqual(t, conns, int64(c.Options().PoolSize))
	require.Equal(t, n, heldInServer(t, c, permits))
	close(stop)
	slowest, calls, errs := app()
	t.Logf("the app's %d calls meanwhile, the slowest %s", calls, slowest)
	assert.Empty(t, errs)
	assert.Less(t, slowest, time.Second)
	releaseMany(t, permits)
	keys, err := c.DBSize(bg).Result()
	require.NoError(t, err)
	assert.Equal(t, int64(1), keys, "the app's key only")
}

// Permits of a short lease refreshed round after round by the client's scheduler: none is
// lost, the server has them all, and the goroutines stay a handful during the rounds.
func TestRefreshRoundsKeepEveryPermit(t *testing.T) {
	s, c := testServer(t)
	info := s.client(t)
	const n, lease = 10000, 3 * time.Second
	permits := holdMany(t, c, "round-", n, Options{Limit: 1, Lease: lease})
	goroutines := runtime.NumGoroutine()
	stop := make(chan struct{})
	app := appCalls(c, stop)
	most := 0
	// Past the first lease's end: only the refreshes keep them.
	for end := time.Now().Add(lease + lease/2); time.Now().Before(end); {
		most = max(most, runtime.NumGoroutine()-goroutines)
		time.Sleep(5 * time.Millisecond)
	}
	conns := infoField(t, info, "clients", "connected_clients") - 1
	close(stop)
	slowest, calls, errs := app()
	t.Logf("%d permits of lease %s over 1.5 leases: at most %d goroutines more, %d "+
		"connections; the app's %d calls meanwhile, the slowest %s", n, lease, most, conns,
		calls, slowest)
	assert.Empty(t, errs)
	assert.Less(t, slowest, time.Second)
	for _, p := range permits {
		require.NoError(t, p.Check())
	}
	require.Equal(t, n, heldInServer(t, c, permits))
	assert.LessOrEqual(t, most, c.Options().PoolSize/2+2,
		"the app's calls, the scheduler and its refreshes (half the pool at once)")
	assert.LessOrEqual(t, conns, int64(c.Options().PoolSize))
	releaseMany(t, permits)
}

// With every wait connection taken (PoolSize 2), a further wait queues in the package: one
// on a name with a free permit is granted at once (tried before it queues); one whose context
// is cancelled, or whose wait ends, in the queue returns then, having left it; the queued
// wait after them is served as a turn frees.
func TestWaitsQueuedBeyondThePool(t *testing.T) {
	s, info := testServer(t)
	c := redis.NewClient(&redis.Options{Addr: s.addr, PoolSize: 2})
	defer c.Close()
	holder, err := Acquire(bg, c, "busy", Options{Limit: 1})
	require.NoError(t, err)
	type result struct {
		p   *Permit
		err error
	}
	results := make(chan result, 2)
	for i := 0; i < 2; i++ {
		go func() {
			p, err := Acquire(bg, c, "busy", Options{Limit: 1, Wait: 20 * time.Second})
			results <- result{p, err}
		}()
	}
	require.Eventually(t, func() bool {
		return infoField(t, info, "clients", "blocked_clients") == 2
	}, 5*time.Second, 5*time.Millisecond, "two waits hold the two wait connections")

	started := time.Now()
	free, err := Acquire(bg, c, "free", Options{Limit: 1, Wait: 20 * time.Second})
	require.NoError(t, err, "a free permit is had without a wait connection")
	assert.Less(t, time.Since(started), time.Second)
	require.NoError(t, free.Release(bg))

	ctx, cancel := context.WithCancel(bg)
	cancelled := make(chan error, 1)
	go func() {
		_, err := Acquire(ctx, c, "busy", Options{Limit: 1, Wait: 20 * time.Second})
		cancelled <- err
	}()
	require.Eventually(t, func() bool { return waitPoolOf(c).queued() == 1 }, 5*time.Second,
		time.Millisecond)
	cancel()
	select {
	case err := <-cancelled:
		require.ErrorIs(t, err, context.Canceled)
	case <-time.After(2 * time.Second):
		t.Fatal("a cancelled wait stayed in the queue")
	}
	assert.Equal(t, 0, waitPoolOf(c).queued())

	started = time.Now()
	_, err = Acquire(bg, c, "busy", Options{Limit: 1, Wait: 300 * time.Millisecond})
	require.ErrorIs(t, err, ErrNotAcquired)
	assert.GreaterOrEqual(t, time.Since(started), 300*time.Millisecond)
	assert.Less(t, time.Since(started), 2*time.Second)
	assert.Equal(t, 0, waitPoolOf(c).queued())

	third := make(chan result, 1)
	go func() {
		p, err := Acquire(bg, c, "busy", Options{Limit: 1, Wait: 20 * time.Second})
		third <- result{p, err}
	}()
	require.Eventually(t, func() bool { return waitPoolOf(c).queued() == 1 }, 5*time.Second,
		time.Millisecond)
	require.NoError(t, holder.Release(bg))
	for i := 0; i < 2; i++ {
		r := <-results
		require.NoError(t, r.err)
		require.NoError(t, r.p.Release(bg))
	}
	r := <-third
	require.NoError(t, r.err, "served once a turn freed")
	require.NoError(t, r.p.Release(bg))
	assert.Equal(t, int64(0), holders(t, c, "busy"))
}

// Wait connections kept between waits that the server closed meanwhile (CLIENT KILL, a
// restart, its idle timeout) fail one wait's first send at most: the next wait is served.
func TestKeptWaitConnectionsClosedByTheServer(t *testing.T) {
	_, c := testServer(t)
	info := redis.NewClient(&redis.Options{Addr: c.Options().Addr})
	defer info.Close()
	const name = "kept"
	waits := func(n int) {
		holder, err := Acquire(bg, c, name, Options{})
		require.NoError(t, err)
		errs := make(chan error, n)
		for i := 0; i < n; i++ {
			go func() {
				p, err := Acquire(bg, c, name, Options{Wait: 5 * time.Second})
				if err == nil {
					err = p.Release(bg)
				}
				errs <- err
			}()
		}
		require.Eventually(t, func() bool {
			return infoField(t, info, "clients", "blocked_clients") == int64(n)
		}, 5*time.Second, 5*time.Millisecond)
		require.NoError(t, holder.Release(bg))
		for i := 0; i < n; i++ {
			require.NoError(t, <-errs)
		}
	}
	waits(3)
	wp := waitPoolOf(c)
	wp.mu.Lock()
	kept := len(wp.idle)
	wp.mu.Unlock()
	require.Equal(t, 3, kept, "three connections kept")
	require.NoError(t, info.Do(bg, "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes").Err())
	waits(1)
	waits(2)
}
