package redsem

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// The tests start real servers: REDIS_SERVER (default redis-server) on a free port, with
// --loadmodule $REDSEM_MODULE (default ../../target/debug/libredsem.so) unless
// REDSEM_BACKEND=scripts.

func serverBin() string {
	if s := os.Getenv("REDIS_SERVER"); s != "" {
		return s
	}
	return "redis-server"
}

func modulePath(t testing.TB) string {
	if m := os.Getenv("REDSEM_MODULE"); m != "" {
		return m
	}
	m, err := filepath.Abs("../../target/debug/libredsem.so")
	require.NoError(t, err)
	return m
}

func scriptsBackend() bool { return os.Getenv("REDSEM_BACKEND") == "scripts" }

func freePort(t testing.TB) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

type server struct {
	port int
	addr string
}

// startServer starts a server; withModule false starts it without the module (MODULE LOAD
// allowed).
func startServer(t testing.TB, withModule bool, extra ...string) *server {
	t.Helper()
	port := freePort(t)
	dir := t.TempDir()
	args := []string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "",
		"--appendonly", "no", "--dir", dir, "--enable-module-command", "yes"}
	if withModule {
		args = append(args, "--loadmodule", modulePath(t))
	}
	args = append(args, extra...)
	cmd := exec.Command(serverBin(), args...)
	cmd.Stdout = nil
	cmd.Stderr = nil
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	s := &server{port: port, addr: fmt.Sprintf("127.0.0.1:%d", port)}
	c := redis.NewClient(&redis.Options{Addr: s.addr})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if err := c.Ping(context.Background()).Err(); err == nil {
			return s
		}
		require.True(t, time.Now().Before(deadline), "%s did not answer on %d", serverBin(), port)
		time.Sleep(20 * time.Millisecond)
	}
}

// testServer starts the server of this run's backend.
func testServer(t testing.TB) (*server, *redis.Client) {
	s := startServer(t, !scriptsBackend())
	c := s.client(t)
	return s, c
}

func (s *server) client(t testing.TB) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.addr})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func holders(t testing.TB, c redis.Cmdable, name string) int64 {
	n, err := c.ZCard(context.Background(), name).Result()
	require.NoError(t, err)
	return n
}
