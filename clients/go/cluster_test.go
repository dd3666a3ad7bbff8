package redsem

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
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

// The cluster part runs when REDSEM_CLUSTER names the cluster to test: module (the module on
// every node), filter0 (the module without its command filter, as Redis 8.4+ runs it) or
// scripts (no module: the script). It starts one cluster of 3 primaries with a replica each
// through $REDSEM_TEST_CLUSTER (scripts/test-cluster).

type clusterNode struct {
	Port    int     `json:"port"`
	Alive   bool    `json:"alive"`
	Primary bool    `json:"primary"`
	Slots   [][]int `json:"slots"`
}

type testCluster struct {
	tool, dir string
	nodes     []clusterNode
}

func (c *testCluster) run(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command(c.tool, args...).Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			t.Fatalf("%s %v: %v\n%s", c.tool, args, err, ee.Stderr)
		}
		t.Fatalf("%s %v: %v", c.tool, args, err)
	}
	return string(out)
}

func (c *testCluster) refresh(t *testing.T) {
	var parsed struct {
		Nodes []clusterNode `json:"nodes"`
	}
	require.NoError(t, json.Unmarshal([]byte(c.run(t, "nodes", c.dir)), &parsed))
	c.nodes = parsed.Nodes
}

// owner is the port of the live primary serving slot.
func (c *testCluster) owner(t *testing.T, slot int) int {
	c.refresh(t)
	for _, n := range c.nodes {
		for _, r := range n.Slots {
			if n.Alive && n.Primary && r[0] <= slot && slot <= r[1] {
				return n.Port
			}
		}
	}
	t.Fatalf("no primary serves slot %d", slot)
	return 0
}

// quiet drops go-redis's log lines (a killed node's failed dials are expected here).
type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

func startCluster(t *testing.T) (*testCluster, *redis.ClusterClient) {
	mode := os.Getenv("REDSEM_CLUSTER")
	if mode == "" {
		t.Skip("REDSEM_CLUSTER is not set (module, filter0 or scripts)")
	}
	tool := os.Getenv("REDSEM_TEST_CLUSTER")
	if tool == "" {
		var err error
		tool, err = filepath.Abs("../../scripts/test-cluster")
		require.NoError(t, err)
	}
	c := &testCluster{tool: tool, dir: filepath.Join(t.TempDir(), "cluster")}
	args := []string{"start", c.dir, "--server", serverBin(), "--replicas", "1"}
	switch mode {
	case "module":
		args = append(args, "--module", modulePath(t))
	case "filter0":
		args = append(args, "--module", modulePath(t), "--module-arg", "command-filter",
			"--module-arg", "0")
	case "scripts":
		args = append(args, "--modules-later")
	default:
		t.Fatalf("REDSEM_CLUSTER=%s: use module, filter0 or scripts", mode)
	}
	var parsed struct {
		Nodes []clusterNode `json:"nodes"`
	}
	require.NoError(t, json.Unmarshal([]byte(c.run(t, args...)), &parsed))
	c.nodes = parsed.Nodes
	t.Cleanup(func() { _ = exec.Command(tool, "stop", c.dir).Run() })
	var addrs []string
	for _, n := range c.nodes {
		if n.Primary {
			addrs = append(addrs, fmt.Sprintf("127.0.0.1:%d", n.Port))
		}
	}
	redis.SetLogger(quiet{})
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	t.Cleanup(func() { _ = cc.Close() })
	return c, cc
}

func clusterModule() bool { return os.Getenv("REDSEM_CLUSTER") != "scripts" }

func TestCluster(t *testing.T) {
	tc, cc := startCluster(t)
	t.Run("Basics", func(t *testing.T) { clusterBasics(t, cc) })
	t.Run("Waits", func(t *testing.T) { clusterWaits(t, tc) })
	t.Run("SlotMoveUnderLoad", func(t *testing.T) { clusterMove(t, tc, cc) })
	t.Run("ManualFailoverUnderAWaiter", func(t *testing.T) { clusterManualFailover(t, tc, cc) })
	t.Run("RefreshUnansweredWithinTheLease", func(t *testing.T) { clusterStalledRefresh(t, tc, cc) })
	t.Run("PrimaryKilledUnderAWaiter", func(t *testing.T) { clusterFailover(t, tc, cc) })
	if !clusterModule() { // last: it leaves a node with the module
		t.Run("ModuleLoadedLive", func(t *testing.T) { clusterModuleLive(t, tc, cc) })
	}
}

func clusterBasics(t *testing.T, cc *redis.ClusterClient) {
	_, err := Acquire(bg, cc, "jobs", Options{Limit: 1})
	require.ErrorIs(t, err, ErrBadInput)

	a, err := Acquire(bg, cc, "{jobs}", Options{Limit: 2, Fair: true})
	require.NoError(t, err)
	b, err := Acquire(bg, cc, "app:{jobs}", Options{Limit: 1, Fair: true})
	require.NoError(t, err)
	_, err = Acquire(bg, cc, "{jobs}", Options{Limit: 1, Fair: true})
	require.ErrorIs(t, err, ErrNotAcquired)
	n, err := cc.ZCard(bg, "{jobs}").Result()
	require.NoError(t, err)
	assert.Equal(t, int64(1), n)

	go func() {
		time.Sleep(300 * time.Millisecond)
		_ = a.Release(bg)
	}()
	w, err := Acquire(bg, cc, "{jobs}", Options{Limit: 1, Fair: true, Wait: 10 * time.Second})
	require.NoError(t, err)
	assert.Greater(t, w.Ticket(), a.Ticket())
	require.NoError(t, w.Release(bg))
	require.NoError(t, b.Release(bg))

	ctx, cancel := context.WithCancel(bg)
	h, err := Acquire(bg, cc, "{jobs}", Options{Limit: 1})
	require.NoError(t, err)
	time.AfterFunc(200*time.Millisecond, cancel)
	_, err = Acquire(ctx, cc, "{jobs}", Options{Limit: 1, Wait: WaitForever})
	require.ErrorIs(t, err, context.Canceled)
	require.NoError(t, h.Release(bg))

	require.NoError(t, SetLimit(bg, cc, "{jobs}", 0))
	limit, ok, err := StoredLimit(bg, cc, "{jobs}")
	require.NoError(t, err)
	assert.True(t, ok)
	assert.Equal(t, int64(0), limit)
	_, err = Acquire(bg, cc, "{jobs}", Options{Limit: 5})
	require.ErrorIs(t, err, ErrNotAcquired)
	cleared, err := ClearLimit(bg, cc, "{jobs}")
	require.NoError(t, err)
	assert.True(t, cleared)

	members := []Member{{Name: "{app}a", Limit: 1}, {Name: "{app}b", Limit: 2, Count: 2}}
	if !clusterModule() {
		_, err = AcquireAll(bg, cc, members, SetOptions{})
		require.ErrorIs(t, err, ErrModuleRequired)
		_, err = WaitEmpty(bg, cc, "{app}a", time.Second)
		require.ErrorIs(t, err, ErrModuleRequired)
		return
	}
	s, err := AcquireAll(bg, cc, members, SetOptions{Fair: true, Wait: time.Second})
	require.NoError(t, err)
	require.Len(t, s.Tickets(), 2)
	go func() {
		time.Sleep(200 * time.Millisecond)
		_ = s.Release(bg)
	}()
	empty, err := WaitEmpty(bg, cc, "{app}b", 10*time.Second)
	require.NoError(t, err)
	assert.True(t, empty)
}

// load runs workers that acquire (waiting, fair), hold a moment and release name until stop
// is closed; it checks that no more than limit hold at once and that no ticket repeats.
func load(t *testing.T, cc *redis.ClusterClient, name string, limit int64, workers int,
	stop <-chan struct{},
) (served *atomic.Int64, wait func()) {
	served = &atomic.Int64{}
	var inside, most atomic.Int64
	var mu sync.Mutex
	tickets := map[int64]bool{}
	var wg sync.WaitGroup
	for i := 0; i < workers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				p, err := Acquire(bg, cc, name, Options{Limit: limit, Fair: true,
					Lease: 5 * time.Second, Wait: 20 * time.Second})
				if !assert.NoError(t, err) {
					return
				}
				n := inside.Add(1)
				if n > most.Load() {
					most.Store(n)
				}
				mu.Lock()
				assert.False(t, tickets[p.Ticket()], "ticket %d granted twice", p.Ticket())
				tickets[p.Ticket()] = true
				mu.Unlock()
				time.Sleep(5 * time.Millisecond)
				inside.Add(-1)
				assert.NoError(t, p.Check())
				assert.NoError(t, p.Release(bg))
				served.Add(1)
			}
		}()
	}
	return served, func() {
		wg.Wait()
		assert.LessOrEqual(t, most.Load(), limit, "over-admission")
	}
}

func clusterMove(t *testing.T, tc *testCluster, cc *redis.ClusterClient) {
	const name = "{mv}"
	slot := keySlot(name)
	from := tc.owner(t, slot)
	to := 0
	for _, n := range tc.nodes {
		if n.Primary && n.Alive && n.Port != from {
			to = n.Port
			break
		}
	}
	stop := make(chan struct{})
	served, wait := load(t, cc, name, 2, 6, stop)
	time.Sleep(300 * time.Millisecond)
	before, redirectedBefore := served.Load(), redirected.Load()
	tc.run(t, "move", tc.dir, strconv.Itoa(slot), strconv.Itoa(to), "--pause-ms", "50")
	time.Sleep(500 * time.Millisecond)
	close(stop)
	wait()
	assert.Equal(t, to, tc.owner(t, slot), "the slot moved")
	assert.Greater(t, served.Load(), before, "permits were served through the move")
	assert.Greater(t, redirected.Load(), redirectedBefore, "calls met the move")
	t.Logf("%d permits served, %d calls sent again", served.Load(), redirected.Load()-redirectedBefore)
	n, err := cc.ZCard(bg, name).Result()
	require.NoError(t, err)
	assert.Equal(t, int64(0), n, "every permit was given back")
}

// clusterStalledRefresh: a refresh that no primary answers before the permit's confirmed lease
// ends (its slot moving key by key, slowly: every call on it gets TRYAGAIN) reports the permit
// lost, not the cluster unavailable: the lease may have run out on the server unconfirmed.
func clusterStalledRefresh(t *testing.T, tc *testCluster, cc *redis.ClusterClient) {
	const name = "{stall}"
	p, err := Acquire(bg, cc, name, Options{Limit: 1, Lease: time.Second, Fair: true,
		ManualRefresh: true})
	require.NoError(t, err)
	slot := keySlot(name)
	from := tc.owner(t, slot)
	to := 0
	for _, n := range tc.nodes {
		if n.Alive && n.Primary && n.Port != from {
			to = n.Port
		}
	}
	moved := make(chan struct{})
	go func() {
		defer close(moved)
		tc.run(t, "move", tc.dir, strconv.Itoa(slot), strconv.Itoa(to), "--pause-ms", "1500")
	}()
	time.Sleep(300 * time.Millisecond) // the first key moved: the name's keys are split
	err = p.Refresh(bg)
	require.ErrorIs(t, err, ErrPermitLost, "%v", err)
	assert.NotErrorIs(t, err, ErrUnavailable)
	<-moved
	assert.ErrorIs(t, p.Release(bg), ErrPermitLost)
}

func clusterFailover(t *testing.T, tc *testCluster, cc *redis.ClusterClient) {
	const name = "{fo}"
	holder, err := Acquire(bg, cc, name, Options{Limit: 1, Lease: 15 * time.Second})
	require.NoError(t, err)
	time.Sleep(300 * time.Millisecond) // the grant reaches the replica
	type result struct {
		p   *Permit
		err error
	}
	got := make(chan result, 1)
	go func() {
		p, err := Acquire(bg, cc, name, Options{Limit: 1, Lease: 15 * time.Second,
			Wait: 40 * time.Second})
		got <- result{p, err}
	}()
	time.Sleep(300 * time.Millisecond) // the waiter is in line
	primary := tc.owner(t, keySlot(name))
	tc.run(t, "kill", tc.dir, strconv.Itoa(primary))
	tc.run(t, "wait", tc.dir)
	require.NotEqual(t, primary, tc.owner(t, keySlot(name)), "a replica took over")

	select {
	case r := <-got:
		t.Fatalf("the waiter ended while the holder held: %v %v", r.p, r.err)
	case <-time.After(500 * time.Millisecond):
	}
	require.NoError(t, holder.Release(bg), "the holder's permit survived the failover")
	var r result
	select {
	case r = <-got:
	case <-time.After(45 * time.Second):
		t.Fatal("the waiter got no answer")
	}
	require.NoError(t, r.err, "the waiter gets its permit on the new primary")
	n, err := cc.ZCard(bg, name).Result()
	require.NoError(t, err)
	assert.Equal(t, int64(1), n, "one holder, never two")
	require.NoError(t, r.p.Release(bg))
}

// clusterManualFailover: CLUSTER FAILOVER ends the old primary's blocked calls with
// "UNBLOCKED force unblock"; the waiter waits again on the new primary, within its budget.
func clusterManualFailover(t *testing.T, tc *testCluster, cc *redis.ClusterClient) {
	const name = "{mf}"
	holder, err := Acquire(bg, cc, name, Options{Limit: 1, Lease: 15 * time.Second})
	require.NoError(t, err)
	primary := tc.owner(t, keySlot(name))
	pc := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", primary)})
	defer pc.Close()
	role, err := pc.Do(bg, "ROLE").Slice()
	require.NoError(t, err)
	replicas, _ := role[2].([]any)
	require.NotEmpty(t, replicas, "the slot's primary has a replica")
	first := replicas[0].([]any)
	rc := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("%s:%s", first[0], first[1])})
	defer rc.Close()
	require.NoError(t, pc.Wait(bg, 1, 2*time.Second).Err(), "the grant reached the replica")

	type result struct {
		p   *Permit
		err error
	}
	got := make(chan result, 1)
	go func() {
		p, err := Acquire(bg, cc, name, Options{Limit: 1, Lease: 15 * time.Second,
			Wait: 40 * time.Second})
		got <- result{p, err}
	}()
	require.Eventually(t, func() bool { return blockedClient(t, pc) != 0 }, 5*time.Second,
		10*time.Millisecond, "the waiter blocks on the primary")
	require.NoError(t, rc.Do(bg, "CLUSTER", "FAILOVER").Err())
	require.Eventually(t, func() bool {
		role, err := pc.Do(bg, "ROLE").Slice()
		return err == nil && len(role) > 0 && role[0] == "slave"
	}, 20*time.Second, 50*time.Millisecond, "the old primary is a replica")
	tc.run(t, "wait", tc.dir)

	select {
	case r := <-got:
		t.Fatalf("the waiter ended while the holder held: %v %v", r.p, r.err)
	case <-time.After(time.Second):
	}
	require.NoError(t, holder.Release(bg), "the holder's permit survived the failover")
	var r result
	select {
	case r = <-got:
	case <-time.After(45 * time.Second):
		t.Fatal("the waiter got no answer")
	}
	require.NoError(t, r.err, "the waiter gets its permit on the new primary")
	n, err := cc.ZCard(bg, name).Result()
	require.NoError(t, err)
	assert.Equal(t, int64(1), n, "one holder, never two")
	require.NoError(t, r.p.Release(bg))
}

// clusterWaits: on the slot's primary, waiters are granted in arrival order, the first at a
// lease's end (TICK from a timer, on the node's pool), and sequential waits reuse the node's
// connections.
func clusterWaits(t *testing.T, tc *testCluster) {
	const name, poolSize = "{line}", 3
	var addrs []string
	for _, n := range tc.nodes {
		if n.Primary && n.Alive {
			addrs = append(addrs, fmt.Sprintf("127.0.0.1:%d", n.Port))
		}
	}
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, PoolSize: poolSize})
	defer cc.Close()

	holder, err := Acquire(bg, cc, name, Options{Limit: 1, Fair: true})
	require.NoError(t, err)
	var mu sync.Mutex
	var order []int
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func(who int) {
			defer wg.Done()
			p, err := Acquire(bg, cc, name, Options{Limit: 1, Fair: true, Wait: 20 * time.Second})
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
	assert.Equal(t, []int{0, 1, 2, 3}, order, "first come, first served")

	_, err = Acquire(bg, cc, name, Options{Limit: 1, Lease: 300 * time.Millisecond,
		ManualRefresh: true}) // never refreshed nor released
	require.NoError(t, err)
	answered := time.Now()
	p, err := Acquire(bg, cc, name, Options{Limit: 1, Wait: 5 * time.Second})
	require.NoError(t, err)
	assert.Less(t, time.Since(answered.Add(300*time.Millisecond)), 300*time.Millisecond,
		"granted at the lease's end")
	require.NoError(t, p.Release(bg))

	node := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d",
		tc.owner(t, keySlot(name)))})
	defer node.Close()
	received := func() int64 {
		text, err := node.Info(bg, "stats").Result()
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
	before := received()
	for i := 0; i < 20; i++ {
		holder, err := Acquire(bg, cc, name, Options{Limit: 1})
		require.NoError(t, err)
		time.AfterFunc(20*time.Millisecond, func() { _ = holder.Release(bg) })
		p, err := Acquire(bg, cc, name, Options{Limit: 1, Wait: 5 * time.Second})
		require.NoError(t, err)
		require.NoError(t, p.Release(bg))
	}
	grew := received() - before
	t.Logf("20 waits: %d connections received by the slot's primary", grew)
	assert.LessOrEqual(t, grew, int64(poolSize))
}

// clusterModuleLive: MODULE LOAD on the primary of a slot where a waiter waits in the script's
// line; a release through the script tells it (M), and it waits on with the module there: the
// client is on the module for that node at once (BOUND, the module's only, works).
func clusterModuleLive(t *testing.T, tc *testCluster, cc *redis.ClusterClient) {
	const name = "{live}"
	holder, err := Acquire(bg, cc, name, Options{Limit: 1})
	require.NoError(t, err)
	type result struct {
		p   *Permit
		err error
	}
	got := make(chan result, 1)
	go func() {
		p, err := Acquire(bg, cc, name, Options{Limit: 1, Wait: 20 * time.Second})
		got <- result{p, err}
	}()
	time.Sleep(200 * time.Millisecond)
	n, err := cc.Exists(bg, name+":line").Result()
	require.NoError(t, err)
	require.Equal(t, int64(1), n, "the waiter is in the script's line")
	node := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d",
		tc.owner(t, keySlot(name)))})
	defer node.Close()
	require.NoError(t, node.Do(bg, "MODULE", "LOAD", modulePath(t)).Err())

	require.NoError(t, holder.Release(bg), "a release through the script")
	var r result
	select {
	case r = <-got:
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter was not served")
	}
	require.NoError(t, r.err)
	require.NoError(t, r.p.Release(bg))
	bound, err := Acquire(bg, cc, name, Options{Limit: 1, Bound: true})
	require.NoError(t, err, "the client is on the module for that node")
	require.NoError(t, bound.Release(bg))
}
