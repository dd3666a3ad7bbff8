package redsem

import (
	"context"

	"github.com/redis/go-redis/v9"
)

// Semaphore is a handle on the semaphore name through a client, with the options of its
// acquires: made once, it takes permits with TryAcquire (never waits) and Acquire (waits),
// as golang.org/x/sync/semaphore's Weighted takes them, each permit given back by its own
// Release. It holds no connection and sends nothing until a call; its methods may be called
// from any goroutine.
type Semaphore struct {
	client  redis.UniversalClient
	name    string
	options Options
}

// NewSemaphore makes a handle on the semaphore name through client (a *redis.Client, from
// redis.NewClient or redis.NewFailoverClient, or a *redis.ClusterClient) with options; the
// zero Options is a semaphore of one permit (a mutex) with DefaultLease. Its options are
// checked here: a bad one returns an error matching ErrBadInput, as Acquire would.
func NewSemaphore(client redis.UniversalClient, name string, options Options) (*Semaphore,
	error,
) {
	if _, err := options.checked(name); err != nil {
		return nil, err
	}
	if _, err := newLine(client, []string{name}, options.RetryFor, false); err != nil {
		return nil, err
	}
	return &Semaphore{client: client, name: name, options: options}, nil
}

// Name is the semaphore's name.
func (s *Semaphore) Name() string { return s.name }

// Options are the options of the handle's acquires.
func (s *Semaphore) Options() Options { return s.options }

// TryAcquire takes a permit if one is free now, without waiting whatever Options.Wait says:
// an error matching ErrNotAcquired when the semaphore is full.
func (s *Semaphore) TryAcquire(ctx context.Context) (*Permit, error) {
	o := s.options
	o.Wait = 0
	return Acquire(ctx, s.client, s.name, o)
}

// Acquire takes a permit, waiting in the server for one as long as Options.Wait says, or,
// when it is zero, until the context ends (as Weighted.Acquire waits): an error matching
// ErrNotAcquired when Options.Wait passed first, the context's error when it ended first.
func (s *Semaphore) Acquire(ctx context.Context) (*Permit, error) {
	o := s.options
	if o.Wait == 0 {
		o.Wait = WaitForever
	}
	return Acquire(ctx, s.client, s.name, o)
}
