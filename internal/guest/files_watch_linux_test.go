package guest

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/guestapi"
)

// watchEvents collects a watch's events on a channel.
func watchEvents(t *testing.T, g *fileGuest, p string, recursive bool) (<-chan api.FileEvent, <-chan error, *guestapi.EventStream) {
	t.Helper()
	es, err := g.c.Watch(fileCtx(t), guestapi.FileRequest{Path: p, Recursive: recursive})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(es.Abort)
	ch := make(chan api.FileEvent, 256)
	done := make(chan error, 1)
	go func() {
		for {
			ev, err := es.Next()
			if err != nil {
				es.Close()
				done <- err
				close(ch)
				return
			}
			ch <- ev
		}
	}()
	return ch, done, es
}

// expectEvents waits (a bounded time) until each wanted "type path" has
// been seen, in order; other events may come between.
func expectEvents(t *testing.T, ch <-chan api.FileEvent, want ...string) {
	t.Helper()
	var seen []string
	timeout := time.After(5 * time.Second)
	for len(want) > 0 {
		select {
		case ev, ok := <-ch:
			if !ok {
				t.Fatalf("the watch ended; saw %v, still want %v", seen, want)
			}
			s := ev.Type + " " + ev.Path
			if ev.OldPath != "" {
				s += " from " + ev.OldPath
			}
			if ev.Time.IsZero() {
				t.Errorf("event %s has no time", s)
			}
			seen = append(seen, s)
			if s == want[0] {
				want = want[1:]
			}
		case <-timeout:
			t.Fatalf("saw %v, still want %v", seen, want)
		}
	}
}

func TestFileWatch(t *testing.T) {
	g := startFileGuest(t)
	os.MkdirAll(g.host("/workspace/w/pre/deeper"), 0o755)
	ch, _, _ := watchEvents(t, g, "/workspace/w", true)
	w := g.host("/workspace/w")

	fileWriteHost(t, filepath.Join(w, "a"), "1")
	expectEvents(t, ch, "create /workspace/w/a", "write /workspace/w/a")
	f, _ := os.OpenFile(filepath.Join(w, "a"), os.O_APPEND|os.O_WRONLY, 0)
	f.WriteString("more")
	f.Close()
	expectEvents(t, ch, "write /workspace/w/a")
	os.Chmod(filepath.Join(w, "a"), 0o600)
	expectEvents(t, ch, "chmod /workspace/w/a")
	os.Rename(filepath.Join(w, "a"), filepath.Join(w, "b"))
	expectEvents(t, ch, "rename /workspace/w/b from /workspace/w/a")
	os.Remove(filepath.Join(w, "b"))
	expectEvents(t, ch, "remove /workspace/w/b")

	// Directories that existed before, and new ones, are watched; what
	// a new directory got before its watch was added is reported too.
	fileWriteHost(t, filepath.Join(w, "pre/deeper/x"), "x")
	expectEvents(t, ch, "create /workspace/w/pre/deeper/x")
	os.MkdirAll(filepath.Join(w, "n1/n2"), 0o755)
	fileWriteHost(t, filepath.Join(w, "n1/n2/f"), "f")
	expectEvents(t, ch, "create /workspace/w/n1", "create /workspace/w/n1/n2/f")
	// A renamed directory's contents are reported under its new name.
	os.Rename(filepath.Join(w, "n1"), filepath.Join(w, "m1"))
	expectEvents(t, ch, "rename /workspace/w/m1 from /workspace/w/n1")
	fileWriteHost(t, filepath.Join(w, "m1/n2/g"), "g")
	expectEvents(t, ch, "create /workspace/w/m1/n2/g")
	// Moved out of the tree: a removal; moved in: a creation.
	os.Rename(filepath.Join(w, "m1"), g.host("/workspace/outside"))
	expectEvents(t, ch, "remove /workspace/w/m1")
	fileWriteHost(t, g.host("/workspace/outside/n2/h"), "h")
	os.Rename(g.host("/workspace/outside"), filepath.Join(w, "back"))
	expectEvents(t, ch, "create /workspace/w/back")
	fileWriteHost(t, filepath.Join(w, "back/n2/i"), "i")
	expectEvents(t, ch, "create /workspace/w/back/n2/i")
	for ev := range drainEvents(ch) {
		if strings.Contains(ev.Path, "/workspace/w/m1") || strings.HasSuffix(ev.Path, "/h") {
			t.Errorf("event for a directory that left the tree: %+v", ev)
		}
	}
}

func drainEvents(ch <-chan api.FileEvent) <-chan api.FileEvent {
	out := make(chan api.FileEvent, 256)
	go func() {
		defer close(out)
		for {
			select {
			case ev, ok := <-ch:
				if !ok {
					return
				}
				out <- ev
			case <-time.After(100 * time.Millisecond):
				return
			}
		}
	}()
	return out
}

func TestFileWatchFlatAndEnd(t *testing.T) {
	g := startFileGuest(t)
	os.MkdirAll(g.host("/workspace/flat/sub"), 0o755)
	ch, done, _ := watchEvents(t, g, "/workspace/flat", false)
	fileWriteHost(t, g.host("/workspace/flat/sub/hidden"), "x")
	fileWriteHost(t, g.host("/workspace/flat/seen"), "x")
	expectEvents(t, ch, "create /workspace/flat/seen")
	for ev := range drainEvents(ch) {
		if strings.Contains(ev.Path, "hidden") {
			t.Errorf("a flat watch reported %+v", ev)
		}
	}
	// Removing the watched directory ends the watch with a reason.
	os.RemoveAll(g.host("/workspace/flat"))
	select {
	case err := <-done:
		var we *guestapi.WatchEnded
		if !errors.As(err, &we) || !strings.Contains(we.Reason, "removed") {
			t.Errorf("watch ended with %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the watch did not end when its directory was removed")
	}
	// Watching a file or a missing path is refused.
	if _, err := g.c.Watch(fileCtx(t), guestapi.FileRequest{Path: "/etc/passwd"}); err == nil {
		t.Error("watching a file succeeded")
	}
	if _, err := g.c.Watch(fileCtx(t), guestapi.FileRequest{Path: "/nope"}); err == nil {
		t.Error("watching a missing path succeeded")
	}
}

func TestFileWatchClientGoes(t *testing.T) {
	g := startFileGuest(t)
	count := func() int {
		n := 0
		entries, _ := os.ReadDir("/proc/self/fd")
		for _, e := range entries {
			if l, _ := os.Readlink("/proc/self/fd/" + e.Name()); strings.Contains(l, "inotify") {
				n++
			}
		}
		return n
	}
	before := count()
	for i := 0; i < 5; i++ {
		es, err := g.c.Watch(fileCtx(t), guestapi.FileRequest{Path: "/workspace", Recursive: true})
		if err != nil {
			t.Fatal(err)
		}
		es.Close()
	}
	deadline := time.Now().Add(5 * time.Second)
	for count() != before {
		if time.Now().After(deadline) {
			t.Fatalf("%d inotify descriptors left after the clients went away", count()-before)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
