package sandbox

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
)

// TestTeardownRetried: a removal answers at once even when its teardown
// fails; the sandbox is gone from the API, but its record, its uid range
// and what the host has of it stay until a retry succeeds, and a daemon
// that stops meanwhile leaves the teardown to the next one.
func TestTeardownRetried(t *testing.T) {
	ctx := context.Background()
	tb := newTestbed(t)
	var failing atomic.Bool
	failing.Store(true)
	boom := errors.New("boom: device busy")
	tb.rt.Fail = func(op, id string) error {
		if op == "remove" && failing.Load() {
			return boom
		}
		return nil
	}
	sb := tb.create()
	if err := tb.m.Remove(ctx, sb.ID, true); err != nil {
		t.Fatalf("Remove: %v", err)
	}
	if _, err := tb.m.Get(ctx, sb.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Get after Remove: %v, want not found", err)
	}
	if tb.host.Running(sb.ID) {
		t.Error("the removed sandbox's guest still runs after the answer")
	}
	var rec record
	if err := tb.st.Get(bucket, sb.ID, &rec); err != nil || rec.State != stateRemoving {
		t.Fatalf("record while its teardown fails: %+v, %v; want state %s", rec.State, err, stateRemoving)
	}
	// Its uid range is not handed out again: every other one is.
	var made []string
	for range tb.m.cfg.MaxSandboxes - 1 {
		made = append(made, tb.create().ID)
	}
	if _, err := tb.m.Create(ctx, api.CreateRequest{}); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("a create with every other range taken: %v, want unavailable", err)
	}
	for _, id := range made {
		if err := tb.m.Remove(ctx, id, true); err != nil {
			t.Fatal(err)
		}
	}
	// A restart takes the teardown up; this time it succeeds.
	tb.stop()
	tb.start()
	if err := tb.m.Settle(ctx); err != nil {
		t.Fatal(err)
	}
	if left := tb.rt.Traces(sb.ID); len(left) > 0 {
		t.Errorf("after the restart's teardown the host still has %v", left)
	}
	if err := tb.st.Get(bucket, sb.ID, &rec); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("record after the teardown: %v, want not found", err)
	}
	if left, _ := tb.rt.Leftovers(); len(left) != 0 {
		t.Errorf("the host still has %v", left)
	}
}

// TestTeardownRetriedInPlace: a teardown that failed succeeds on a later
// attempt of the same daemon.
func TestTeardownRetriedInPlace(t *testing.T) {
	ctx := context.Background()
	tb := newTestbed(t)
	var failing atomic.Bool
	failing.Store(true)
	tb.rt.Fail = func(op, id string) error {
		if op == "remove" && failing.Load() {
			return errors.New("boom")
		}
		return nil
	}
	sb := tb.create()
	if err := tb.m.Remove(ctx, sb.ID, true); err != nil {
		t.Fatalf("Remove: %v", err)
	}
	time.Sleep(100 * time.Millisecond) // the first attempt fails
	failing.Store(false)
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := tb.m.Settle(sctx); err != nil {
		t.Fatal(err)
	}
	if left := tb.rt.Traces(sb.ID); len(left) > 0 {
		t.Errorf("after the retry the host still has %v", left)
	}
}
