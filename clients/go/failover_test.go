package redsem

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Through a FailoverClient (Sentinel): a primary, its replica and one sentinel.
func TestFailoverClient(t *testing.T) {
	primary := startServer(t, !scriptsBackend())
	replica := startServer(t, !scriptsBackend(), "--replicaof", "127.0.0.1",
		strconv.Itoa(primary.port))
	port := freePort(t)
	dir := t.TempDir()
	conf := filepath.Join(dir, "sentinel.conf")
	require.NoError(t, os.WriteFile(conf, []byte(fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\n"+
		"sentinel monitor m 127.0.0.1 %d 1\nsentinel down-after-milliseconds m 1000\n"+
		"sentinel failover-timeout m 5000\n", port, dir, primary.port)), 0o600))
	sentinelCmd := exec.Command(serverBin(), conf, "--sentinel")
	require.NoError(t, sentinelCmd.Start())
	t.Cleanup(func() {
		_ = sentinelCmd.Process.Kill()
		_ = sentinelCmd.Wait()
	})
	sentinel := redis.NewSentinelClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", port)})
	defer sentinel.Close()
	p, r := primary.client(t), replica.client(t)
	require.Eventually(t, func() bool {
		info, err := p.Info(bg, "replication").Result()
		return err == nil && strings.Contains(info, "state=online")
	}, 10*time.Second, 50*time.Millisecond, "the replica is online")

	c := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "m",
		SentinelAddrs: []string{fmt.Sprintf("127.0.0.1:%d", port)}})
	defer c.Close()

	// Durability: the one replica acknowledges the grant.
	durable, err := Acquire(bg, c, "{fo}", Options{Limit: 3, DurableReplicas: 1,
		DurableTimeout: 5 * time.Second})
	require.NoError(t, err)
	_, err = r.ZScore(bg, "{fo}", durable.ID()).Result()
	require.NoError(t, err, "the grant is on the replica")
	waiter, err := Acquire(bg, c, "{fo}", Options{Limit: 3, Wait: 5 * time.Second})
	require.NoError(t, err)
	plain, err := Acquire(bg, c, "{fo}", Options{Limit: 3})
	require.NoError(t, err)
	require.NoError(t, p.Wait(bg, 1, 2*time.Second).Err())

	// A failover: the replica becomes the primary.
	require.Eventually(t, func() bool {
		return sentinel.Failover(bg, "m").Err() == nil
	}, 15*time.Second, 200*time.Millisecond, "SENTINEL FAILOVER")
	require.Eventually(t, func() bool {
		role, err := r.Do(bg, "ROLE").Slice()
		return err == nil && len(role) > 0 && role[0] == "master"
	}, 20*time.Second, 50*time.Millisecond, "the replica was promoted")
	require.Eventually(t, func() bool {
		role, err := p.Do(bg, "ROLE").Slice()
		return err == nil && len(role) > 0 && role[0] == "slave"
	}, 20*time.Second, 50*time.Millisecond, "the old primary is a replica")

	// Each permit is refreshed on the new primary (never reported lost).
	for _, h := range []*Permit{durable, waiter, plain} {
		require.Eventually(t, func() bool {
			err := h.Refresh(bg)
			assert.NotErrorIs(t, err, ErrPermitLost)
			return err == nil
		}, 20*time.Second, 100*time.Millisecond, "a refresh of %s on the new primary", h.ID())
	}
	require.Eventually(t, func() bool {
		_, err := Acquire(bg, c, "{fo}", Options{Limit: 3, Wait: 100 * time.Millisecond})
		return errorsIs(err, ErrNotAcquired)
	}, 10*time.Second, 100*time.Millisecond, "the three holders count on the new primary")
	for _, h := range []*Permit{durable, waiter, plain} {
		require.NoError(t, h.Release(bg))
	}
	assert.Equal(t, int64(0), holders(t, r, "{fo}"))
}

func errorsIs(err, target error) bool { return errors.Is(err, target) }
