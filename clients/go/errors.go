package redsem

import (
	"errors"
	"fmt"
)

var (
	// ErrNotAcquired: no permit was granted (the semaphore was full, for Wait when waiting).
	ErrNotAcquired = errors.New("redsem: no permit was granted")
	// ErrPermitLost: the permit ran out before it was given back (its lease ended, or another
	// client removed it); from then on another holder may have held it, so the work it guarded
	// may have overlapped another holder's.
	ErrPermitLost = errors.New("redsem: the permit was lost")
	// ErrModuleRequired: the server has no redsem module loaded, and what was asked needs it
	// (Bound, a set of semaphores, WaitEmpty). Returned before the call is sent; everything
	// else works without the module, through the script.
	ErrModuleRequired = errors.New("redsem: the redsem module is required")
	// ErrBadInput: an argument is out of range (the message names it), or in Redis Cluster a
	// name has no hash tag or the names of a set are in different slots. Nothing was sent.
	ErrBadInput = errors.New("redsem: bad input")
	// ErrReleased: the permit was given back by Release. It is the cause of the permit's
	// Context then, and Refresh and ReleaseSome return it; nothing is sent.
	ErrReleased = errors.New("redsem: the permit was released")
	// ErrUnavailable: in Redis Cluster, the primary of the semaphore's slot gave no answer
	// through moves and failovers within RetryFor. The error also matches the last error met.
	ErrUnavailable = errors.New("redsem: the semaphore's node is unavailable")
	// ErrNotDurable: fewer replicas than Options.DurableReplicas had the grant in time, and the
	// permit was given back. Every *NotDurableError matches it; errors.As gives its figures.
	ErrNotDurable = errors.New("redsem: the grant did not reach the replicas asked for")
)

// NotDurableError: fewer replicas than Options.DurableReplicas acknowledged the grant in time
// (WAIT numreplicas timeout), or the WAIT was cut (its connection lost, or the server ended
// it in a failover) and the primary then serving had no such holder: the grant was lost
// before any replica had it (Gone). The permit was given back.
type NotDurableError struct {
	Name   string
	Acked  int64 // replicas that acknowledged
	Wanted int64 // Options.DurableReplicas
	Gone   bool  // the grant was not on the primary found after the WAIT was cut
}

// Is makes every *NotDurableError match ErrNotDurable.
func (e *NotDurableError) Is(target error) bool { return target == ErrNotDurable }

func (e *NotDurableError) Error() string {
	if e.Gone {
		return fmt.Sprintf("redsem: the grant of %q was lost before %d replicas had it: the "+
			"WAIT for them was cut, and the primary serving then has no such holder",
			e.Name, e.Wanted)
	}
	return fmt.Sprintf("redsem: %d of %d replicas acknowledged the grant of %q in time; the "+
		"permit was given back", e.Acked, e.Wanted, e.Name)
}

// described is an error with its own message that matches a sentinel with errors.Is.
type described struct {
	msg  string
	kind error
	err  error // a further cause, or nil
}

func (e *described) Error() string { return e.msg }

func (e *described) Unwrap() []error {
	if e.err == nil {
		return []error{e.kind}
	}
	return []error{e.kind, e.err}
}

func badInput(format string, args ...any) error {
	return &described{msg: "redsem: " + fmt.Sprintf(format, args...), kind: ErrBadInput}
}

func moduleRequired(what string) error {
	return &described{
		msg:  "redsem: " + what + " needs the redsem module loaded in the server",
		kind: ErrModuleRequired,
	}
}

// serverError is an error the server sent in a waiter's grant message (E...): raised as
// go-redis raises the server's errors (redis.Error, redis.HasErrorPrefix).
type serverError string

func (e serverError) Error() string { return string(e) }

func (serverError) RedisError() {}
