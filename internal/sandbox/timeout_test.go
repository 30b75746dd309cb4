package sandbox

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
)

// TestTimeoutAcrossRestart: a timeout is the record's, so a manager that
// stops before it is up and a new one over the same records act on it
// then: on_timeout pause pauses the sandbox and clears its timeout, the
// default removes it, and a timeout cleared before it is up does nothing.
func TestTimeoutAcrossRestart(t *testing.T) {
	tb := newTestbed(t)
	ctx := context.Background()
	create := func(action api.TimeoutAction) string {
		t.Helper()
		sb, err := tb.m.Create(ctx, api.CreateRequest{TimeoutSeconds: 3, OnTimeout: action, Resources: api.Resources{CPUs: 1, MemoryBytes: 256 << 20, Pids: 100}})
		if err != nil {
			t.Fatal(err)
		}
		if sb.OnTimeout != action || sb.ExpiresAt == nil {
			t.Fatalf("created with on_timeout %q: %+v", action, sb)
		}
		return sb.ID
	}
	start := time.Now()
	paused, removed, kept := create(api.TimeoutPause), create(""), create(api.TimeoutPause)
	if _, err := tb.m.SetTimeout(ctx, kept, 0); err != nil {
		t.Fatal(err)
	}

	tb.stop()
	tb.start()
	if time.Since(start) > 2500*time.Millisecond {
		t.Skipf("the restart took %v, too close to the 3 s timeout", time.Since(start))
	}

	tb.waitState(paused, api.StatePaused)
	if sb := tb.get(paused); sb.ExpiresAt != nil {
		t.Errorf("paused by its timeout, still expires at %v", sb.ExpiresAt)
	}
	tb.checkHost(tb.get(paused))
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := tb.m.Get(ctx, removed)
		if errors.Is(err, errdefs.ErrNotFound) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the default timeout did not remove its sandbox: %v", err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if sb := tb.get(kept); sb.State != api.StateRunning || sb.ExpiresAt != nil {
		t.Errorf("a sandbox whose timeout was cleared: %s, expires %v", sb.State, sb.ExpiresAt)
	}
	// Resumed, it runs until a new timeout says otherwise.
	if _, err := tb.m.Resume(ctx, paused); err != nil {
		t.Fatal(err)
	}
	if _, err := tb.m.SetTimeout(ctx, paused, 50*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	tb.waitState(paused, api.StatePaused)
}

func TestOnTimeoutValidated(t *testing.T) {
	tb := newTestbed(t)
	_, err := tb.m.Create(context.Background(), api.CreateRequest{TimeoutSeconds: 5, OnTimeout: "explode"})
	if !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("on_timeout explode: %v, want invalid", err)
	}
}
