package guestapi

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"sync/atomic"
	"testing"

	"github.com/paddock-dev/paddock/wire"
)

// TestStartsTakeTurns: both kinds of start wait for the client's turn,
// hold it while the guest answers and give it back after; other calls
// take none, and a start refused its turn reaches no guest.
func TestStartsTakeTurns(t *testing.T) {
	var held, taken atomic.Int32
	var refuse atomic.Bool
	guest := func(conn net.Conn) {
		defer conn.Close()
		f, err := wire.NewReader(conn).Read()
		if err != nil {
			return
		}
		var req Request
		if err := json.Unmarshal(f.Payload, &req); err != nil {
			t.Error(err)
			return
		}
		if want := int32(0); req.Op == OpStart {
			want = 1
			if held.Load() != want {
				t.Errorf("the guest got a start while %d turns were held, want %d", held.Load(), want)
			}
		} else if held.Load() != want {
			t.Errorf("the guest got op %s while %d turns were held, want %d", req.Op, held.Load(), want)
		}
		w := wire.NewWriter(conn)
		w.WriteJSON(wire.Response, Response{PID: 7})
		if req.Op == OpStart && req.Start.Attach {
			w.Write(wire.Stdout, []byte("hi\n"))
			w.WriteJSON(wire.Exit, struct{}{})
		}
	}
	c := NewClient(func(ctx context.Context) (net.Conn, error) {
		ours, theirs := net.Pipe()
		go guest(theirs)
		return ours, nil
	}).WithTurns(func(ctx context.Context) (func(), error) {
		if refuse.Load() {
			return nil, context.Canceled
		}
		taken.Add(1)
		held.Add(1)
		return func() { held.Add(-1) }, nil
	})
	ctx := t.Context()
	pid, conn, err := c.StartAttached(ctx, &StartRequest{Cmd: []string{"echo", "hi"}})
	if err != nil || pid != 7 {
		t.Fatalf("StartAttached: pid %d, %v", pid, err)
	}
	conn.Close()
	if held.Load() != 0 {
		t.Fatal("StartAttached kept its turn after the guest answered")
	}
	if pid, err := c.Start(ctx, &StartRequest{Cmd: []string{"sleep", "1"}}); err != nil || pid != 7 {
		t.Fatalf("Start: pid %d, %v", pid, err)
	}
	if held.Load() != 0 {
		t.Fatal("Start kept its turn after the guest answered")
	}
	if _, err := c.Processes(ctx); err != nil {
		t.Fatal(err)
	}
	if n := taken.Load(); n != 2 {
		t.Fatalf("%d turns taken, want 2 (one per start)", n)
	}
	refuse.Store(true)
	if _, _, err := c.StartAttached(ctx, &StartRequest{Cmd: []string{"echo"}}); !errors.Is(err, context.Canceled) {
		t.Fatalf("a start refused its turn returned %v", err)
	}
	if _, err := c.Start(ctx, &StartRequest{Cmd: []string{"echo"}}); !errors.Is(err, context.Canceled) {
		t.Fatalf("a background start refused its turn returned %v", err)
	}
}
