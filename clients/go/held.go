package redsem

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"
)

// held is what a Permit and a PermitSet share: identity, refresh, lost-permit reporting and
// release over the line (its connection).
type held struct {
	line   *line // its names are the semaphores'
	id     string
	lease  time.Duration
	set    bool  // a PermitSet: SEM.REFRESHALL and SEM.RELEASEALL
	wanted int64 // how many semaphores a refresh or a release must find held

	mu             sync.Mutex
	ctx            context.Context // made at the first call of Context
	cancel         context.CancelCauseFunc
	confirmedUntil time.Time // the server's deadline is at least this
	lostErr        error
	released       bool
	releaseErr     error

	releaseMu sync.Mutex
	stopped   bool // the refresh was stopped (a release was asked)

	// The background refresh, guarded by the scheduler's lock.
	sched      *scheduler // nil: no background refresh
	due        time.Time  // when the next refresh is due
	slot       int        // the index in the scheduler's heap, -1 when not in it
	refreshing bool       // a refresh is under way
	removed    bool       // no more refreshes
}

func (h *held) init(l *line, id string, lease time.Duration, sent time.Time, set bool) {
	h.line, h.id, h.lease, h.set = l, id, lease, set
	h.wanted = int64(len(l.names))
	h.confirmedUntil = sent.Add(lease)
	h.slot = -1
}

// what names the semaphore, or the set, in messages.
func (h *held) what() string {
	if h.set {
		return "the set " + quoted(h.line.names)
	}
	return strconv.Quote(h.line.names[0])
}

// refreshArgs and releaseArgs are made when sent: a held permit keeps only its names.
func (h *held) refreshArgs() []any {
	if h.set {
		n := len(h.line.names)
		return append(append([]any{"SEM.REFRESHALL", n}, anys(h.line.names)...), h.id,
			seconds(h.lease))
	}
	return []any{"SEM.REFRESH", h.line.names[0], h.id, seconds(h.lease)}
}

func (h *held) releaseArgs() []any {
	if h.set {
		n := len(h.line.names)
		return append(append([]any{"SEM.RELEASEALL", n}, anys(h.line.names)...), h.id)
	}
	return []any{"SEM.RELEASE", h.line.names[0], h.id}
}

// ID is the holder's identifier: Options.ID, or the UUID v4 made for this permit.
func (h *held) ID() string { return h.id }

// Context is cancelled when the permit is lost (context.Cause matches ErrPermitLost) or
// released: pass it to the work the permit guards, so that the work stops once another holder
// may have the permit.
func (h *held) Context() context.Context {
	h.noteDeadline()
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ctx == nil {
		h.ctx, h.cancel = context.WithCancelCause(context.Background())
		switch {
		case h.lostErr != nil:
			h.cancel(h.lostErr)
		case h.released:
			h.cancel(ErrReleased)
		}
	}
	return h.ctx
}

// Lost reports whether the permit may have run out: a refresh or the release answered 0, or
// no refresh was confirmed within a lease (the server is unreachable). It stays true.
func (h *held) Lost() bool {
	h.noteDeadline()
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.lostErr != nil
}

// Check returns an error matching ErrPermitLost once the permit is lost: call it in long work
// to stop early.
func (h *held) Check() error {
	h.noteDeadline()
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.lostErr
}

func (h *held) noteDeadline() {
	h.mu.Lock()
	expired := !h.released && !time.Now().Before(h.confirmedUntil)
	h.mu.Unlock()
	if expired {
		h.markLost("no refresh was confirmed within the lease")
	}
}

func (h *held) markLost(reason string) {
	h.mu.Lock()
	if h.lostErr == nil {
		h.lostErr = &described{
			msg:  fmt.Sprintf("redsem: the permit %q of %s was lost: %s", h.id, h.what(), reason),
			kind: ErrPermitLost,
		}
	}
	err, cancel := h.lostErr, h.cancel
	h.mu.Unlock()
	if cancel != nil {
		cancel(err)
	}
}

func (h *held) answered(command any, reply any) string {
	if h.wanted == 1 {
		return fmt.Sprintf("%v answered %v", command, reply)
	}
	return fmt.Sprintf("%v answered %v of %d", command, reply, h.wanted)
}

// Refresh moves the deadline to now + lease (the background refresh does this every
// lease/3). It returns an error matching ErrPermitLost, and marks the permit lost, if it had
// run out.
func (h *held) Refresh(ctx context.Context) error {
	h.mu.Lock()
	until := h.confirmedUntil
	h.mu.Unlock()
	return h.refresh(ctx, until)
}

// refresh sends a refresh; in Redis Cluster it is resent through a move or a failover until
// `until` at the latest.
func (h *held) refresh(ctx context.Context, until time.Time) error {
	h.mu.Lock()
	released := h.released
	h.mu.Unlock()
	if released {
		return ErrReleased
	}
	sent := time.Now()
	v, err := h.line.run(ctx, until, func(e *endpoint) (any, error) {
		return e.send(ctx, h.refreshArgs()...)
	})
	if err != nil {
		// In Redis Cluster no primary of the slot answered before the confirmed lease ended
		// (a move or a failover under way): the lease may have run out on the server with no
		// refresh confirmed, so the permit is lost, as a refresh that finds no holder says.
		if !until.IsZero() && !time.Now().Before(until) && errors.Is(err, ErrUnavailable) {
			h.markLost("no refresh was answered before the lease ended (" + err.Error() + ")")
			return h.Check()
		}
		return err
	}
	if n, _ := v.(int64); n == h.wanted {
		h.mu.Lock()
		if h.lostErr == nil {
			h.confirmedUntil = sent.Add(h.lease)
		}
		h.mu.Unlock()
		return h.Check()
	}
	h.markLost(h.answered(h.refreshArgs()[0], v) + " (the lease ran out, or the holder was " +
		"removed)")
	return h.Check()
}

// start has the permit refreshed every lease/3 by its client's scheduler.
func (h *held) start() {
	schedulerOf(h.line).add(h, time.Now().Add(h.lease/3))
}

// ReleaseTimeout bounds a release whose context is already over when it is called (the
// common `defer permit.Release(ctx)` of a request that was cancelled): it is sent with a context
// of its own (context.WithoutCancel, this long), because a permit not given back is held by
// nobody until its lease ends.
const ReleaseTimeout = 5 * time.Second

// Release gives the permit back. It returns nil if the permit was held throughout, an error
// matching ErrPermitLost if it was lost (the work it guarded may have overlapped another
// holder's), or the error of the call. Once it had an answer, later calls return the same. A
// context already over is replaced by one of ReleaseTimeout. A release that got no answer (its
// context ended during the call, the connection failed) leaves the permit releasable: call
// Release again; it is no longer refreshed meanwhile, so its lease ends it at the latest.
func (h *held) Release(ctx context.Context) error {
	h.releaseMu.Lock()
	defer h.releaseMu.Unlock()
	h.mu.Lock()
	if h.released {
		err := h.releaseErr
		h.mu.Unlock()
		return err
	}
	h.mu.Unlock()
	h.noteDeadline()
	if !h.stopped {
		h.stopped = true
		if h.sched != nil {
			h.sched.remove(h) // lets a refresh under way finish first
		}
	}
	if ctx.Err() != nil {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), ReleaseTimeout)
		defer cancel()
	}
	v, err := h.line.run(ctx, time.Time{}, func(e *endpoint) (any, error) {
		return e.send(ctx, h.releaseArgs()...)
	})
	if err != nil {
		return fmt.Errorf("redsem: the release of %q of %s got no answer (call Release again): %w",
			h.id, h.what(), err)
	}
	h.line.close()
	if n, _ := v.(int64); n != h.wanted {
		h.markLost(h.answered(h.releaseArgs()[0], v) + ": the lease ran out before the release")
	}
	h.mu.Lock()
	h.released = true
	err = h.lostErr
	h.releaseErr = err
	cancel := h.cancel
	h.mu.Unlock()
	if cancel != nil {
		cancel(ErrReleased)
	}
	return err
}

// Permit is a granted permit of one semaphore: refreshed in the background every lease/3
// while held (unless Options.ManualRefresh), given back by Release. Its methods may be called
// from any goroutine.
type Permit struct {
	held
	name   string
	ticket int64
	count  int64
}

// ReleaseSome gives back k of a weighted permit's permits (SEM.RELEASE ... COUNT k) and keeps
// holding the rest, with its deadline and ticket; k is from 1 to Count()-1 (Release gives back
// all). It returns an error matching ErrPermitLost, and marks the permit lost, if it had run
// out.
func (p *Permit) ReleaseSome(ctx context.Context, k int64) error {
	p.mu.Lock()
	released, count := p.released, p.count
	p.mu.Unlock()
	if released {
		return ErrReleased
	}
	if k < 1 || k >= count {
		return badInput("k must be from 1 to %d (Count()-1); Release gives back all, not %d",
			count-1, k)
	}
	v, err := p.line.run(ctx, time.Time{}, func(e *endpoint) (any, error) {
		return e.send(ctx, "SEM.RELEASE", p.name, p.id, "COUNT", k)
	})
	if err != nil {
		return err
	}
	if v != int64(1) {
		p.markLost(fmt.Sprintf("SEM.RELEASE answered %v: the lease ran out before the release", v))
		return p.Check()
	}
	p.mu.Lock()
	p.count -= k
	p.mu.Unlock()
	return nil
}

// Name is the semaphore's name.
func (p *Permit) Name() string { return p.name }

// Ticket is the fencing ticket of a fair permit (it only grows per name), 0 otherwise.
func (p *Permit) Ticket() int64 { return p.ticket }

// Count is the number of permits held (Options.Count, less what ReleaseSome gave back).
func (p *Permit) Count() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.count
}

func (p *Permit) String() string {
	return fmt.Sprintf("redsem.Permit{%q id=%q ticket=%d count=%d}", p.name, p.id, p.ticket,
		p.Count())
}
