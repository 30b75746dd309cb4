package events

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/paddock-dev/paddock/api"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/telemetry/internal/gone"
	"github.com/paddock-dev/paddock/internal/telemetry/metrics"
)

func openLog(t *testing.T, dir string, maxBytes int64) *Log {
	t.Helper()
	l, err := Open(Config{Dir: dir, MaxBytes: maxBytes})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func appendN(t *testing.T, l *Log, id string, n int) []Event {
	t.Helper()
	var out []Event
	for i := 0; i < n; i++ {
		e, err := l.Append(id, Event{Type: Exec, Message: fmt.Sprintf("event %d", i), Data: Data(ExecData{PID: i})})
		if err != nil {
			t.Fatalf("Append: %v", err)
		}
		out = append(out, e)
	}
	return out
}

func TestAppendList(t *testing.T) {
	l := openLog(t, t.TempDir(), 0)
	got := appendN(t, l, "sbx-1", 5)
	for i, e := range got {
		if e.Seq != uint64(i+1) || e.Sandbox != "sbx-1" || e.Time.IsZero() {
			t.Errorf("event %d = %+v", i, e)
		}
	}
	if _, err := l.Append("sbx-2", Event{Type: OOM, Data: Data(OOMData{Kills: 1})}); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name string
		q    Query
		want []uint64
	}{
		{"all", Query{}, []uint64{1, 2, 3, 4, 5}},
		{"after", Query{After: 3}, []uint64{4, 5}},
		{"limit", Query{After: 1, Limit: 2}, []uint64{2, 3}},
		{"after the last", Query{After: 5}, nil},
		{"by type", Query{Types: []Type{OOM}}, nil},
		{"since", Query{Since: got[2].Time}, []uint64{3, 4, 5}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			evs, err := l.List("sbx-1", tt.q)
			if err != nil {
				t.Fatal(err)
			}
			if s := seqs(evs); fmt.Sprint(s) != fmt.Sprint(tt.want) {
				t.Errorf("seqs %v, want %v", s, tt.want)
			}
		})
	}
	evs, _ := l.List("sbx-1", Query{After: 4})
	var d ExecData
	if err := json.Unmarshal(evs[0].Data, &d); err != nil || d.PID != 4 || evs[0].Message != "event 4" {
		t.Errorf("round trip: %+v, %+v, %v", evs[0], d, err)
	}
	if evs, err := l.List("never-written", Query{}); err != nil || len(evs) != 0 {
		t.Errorf("List of an empty log = %v, %v", evs, err)
	}
}

func seqs(evs []Event) []uint64 {
	var s []uint64
	for _, e := range evs {
		s = append(s, e.Seq)
	}
	return s
}

func TestRefuses(t *testing.T) {
	l := openLog(t, t.TempDir(), 0)
	for _, id := range []string{"", "../x", "A", "a/b", strings.Repeat("a", 65), "a.jsonl"} {
		if _, err := l.Append(id, Event{Type: Exec}); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("Append(%q) = %v, want ErrInvalid", id, err)
		}
		if _, err := l.List(id, Query{}); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("List(%q) = %v, want ErrInvalid", id, err)
		}
	}
	if _, err := l.Append("a", Event{}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("Append without a type = %v, want ErrInvalid", err)
	}
	big := Event{Type: Policy, Data: Data(map[string]string{"x": strings.Repeat("y", MaxEventBytes)})}
	if _, err := l.Append("a", big); !errors.Is(err, errdefs.ErrTooLarge) {
		t.Errorf("Append of a huge event = %v, want ErrTooLarge", err)
	}
	e, err := l.Append("a", Event{Type: Exec, Message: strings.Repeat("é", MaxMessage)})
	if err != nil || len(e.Message) > MaxMessage || !strings.HasPrefix(e.Message, "é") {
		t.Errorf("long message: %d bytes, %v", len(e.Message), err)
	}
	if _, err := Open(Config{Dir: t.TempDir(), MaxBytes: 100}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("Open with a tiny cap = %v, want ErrInvalid", err)
	}
}

func TestCutCmd(t *testing.T) {
	long := strings.Repeat("a", 2000)
	got := CutCmd([]string{"sh", "-c", long})
	n := 0
	for _, a := range got {
		n += len(a)
	}
	if len(got) != 3 || got[0] != "sh" || n > MaxCmdBytes+len("…") {
		t.Errorf("CutCmd = %d args, %d bytes", len(got), n)
	}
	if short := []string{"ls", "-l"}; fmt.Sprint(CutCmd(short)) != fmt.Sprint(short) {
		t.Errorf("CutCmd changed a short argv")
	}
}

// TestRetention: the log keeps between half its cap and its cap, newest
// events first, with seq continuing.
func TestRetention(t *testing.T) {
	dir := t.TempDir()
	const cap = 64 << 10
	l := openLog(t, dir, cap)
	all := appendN(t, l, "r", 3000) // ~100 bytes each: ~300 KB
	size := int64(0)
	for _, p := range []string{"r.jsonl", "r.1.jsonl"} {
		fi, err := os.Stat(filepath.Join(dir, p))
		if err != nil {
			t.Fatal(err)
		}
		size += fi.Size()
	}
	if size > cap || size < cap/2 {
		t.Errorf("retained %d bytes, want between %d and %d", size, cap/2, cap)
	}
	var kept []Event
	after := uint64(0)
	for {
		evs, err := l.List("r", Query{After: after, Limit: 1000})
		if err != nil {
			t.Fatal(err)
		}
		if len(evs) == 0 {
			break
		}
		kept = append(kept, evs...)
		after = evs[len(evs)-1].Seq
	}
	if len(kept) == 0 || kept[len(kept)-1].Seq != all[len(all)-1].Seq {
		t.Fatalf("the newest event is not kept")
	}
	for i := 1; i < len(kept); i++ {
		if kept[i].Seq != kept[i-1].Seq+1 {
			t.Fatalf("gap in the kept events at %d: %d after %d", i, kept[i].Seq, kept[i-1].Seq)
		}
	}
	t.Logf("kept %d of %d events in %d bytes (cap %d)", len(kept), len(all), size, cap)
}

// TestRecovery: a new Log on the same directory continues the seq, and a
// torn last line (a crash mid-write) is ignored and cut off.
func TestRecovery(t *testing.T) {
	dir := t.TempDir()
	l := openLog(t, dir, 0)
	appendN(t, l, "c", 3)
	cur := filepath.Join(dir, "c.jsonl")
	f, err := os.OpenFile(cur, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(`{"seq":4,"time":"2030-01-01T00:00:00Z","sandbox":"c","ty`)
	f.Close()

	l2 := openLog(t, dir, 0)
	evs, err := l2.List("c", Query{})
	if err != nil || fmt.Sprint(seqs(evs)) != "[1 2 3]" {
		t.Fatalf("after a torn write: %v, %v", seqs(evs), err)
	}
	e, err := l2.Append("c", Event{Type: Lifecycle, Message: "restarted"})
	if err != nil || e.Seq != 4 {
		t.Fatalf("Append after restart = seq %d, %v; want 4", e.Seq, err)
	}
	evs, _ = l2.List("c", Query{})
	if fmt.Sprint(seqs(evs)) != "[1 2 3 4]" || evs[3].Message != "restarted" {
		t.Errorf("after repair: %v", seqs(evs))
	}

	// Recovery from the older segment when the current one is empty.
	l3 := openLog(t, dir, 4*MaxEventBytes)
	appendN(t, l3, "d", 2000)
	os.WriteFile(filepath.Join(dir, "d.jsonl"), nil, 0o600)
	l4 := openLog(t, dir, 4*MaxEventBytes)
	e, err = l4.Append("d", Event{Type: Lifecycle})
	if err != nil {
		t.Fatal(err)
	}
	evs, _ = l4.List("d", Query{After: e.Seq - 2})
	if len(evs) != 2 || evs[1].Seq != evs[0].Seq+1 {
		t.Errorf("seq after recovering from the older segment: %v", seqs(evs))
	}
}

func TestFollow(t *testing.T) {
	l := openLog(t, t.TempDir(), 0)
	appendN(t, l, "f", 3)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := l.Follow(ctx, "f", 1)
	if err != nil {
		t.Fatal(err)
	}
	recv := func(want uint64) {
		t.Helper()
		select {
		case e, ok := <-ch:
			if !ok || e.Seq != want {
				t.Fatalf("got %v (open %v), want seq %d", e.Seq, ok, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("no event %d", want)
		}
	}
	recv(2)
	recv(3)
	appendN(t, l, "f", 2) // the follower picks them up
	recv(4)
	recv(5)

	// Removal ends the stream.
	if err := l.Remove("f"); err != nil {
		t.Fatal(err)
	}
	select {
	case _, ok := <-ch:
		if ok {
			t.Fatal("event after Remove")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Follow did not end on Remove")
	}
	if evs, _ := l.List("f", Query{}); len(evs) != 0 {
		t.Errorf("events after Remove: %v", seqs(evs))
	}
	if _, err := l.Append("f", Event{Type: Lifecycle}); !errors.Is(err, ErrRemoved) {
		t.Errorf("an event after Remove: %v, want ErrRemoved", err)
	}
	if cur, _ := l.paths("f"); fileExists(cur) {
		t.Error("an event after Remove made the log again")
	}

	// Cancelling ends it too.
	ctx2, cancel2 := context.WithCancel(context.Background())
	ch2, _ := l.Follow(ctx2, "g", 0)
	cancel2()
	select {
	case <-ch2:
	case <-time.After(5 * time.Second):
		t.Fatal("Follow did not end on cancel")
	}
}

// TestConcurrent appends from several goroutines while others follow and
// list: every follower sees every seq once, in order.
func TestConcurrent(t *testing.T) {
	l := openLog(t, t.TempDir(), 256<<10)
	const writers, each = 4, 200
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var fwg sync.WaitGroup
	for f := 0; f < 3; f++ {
		ch, err := l.Follow(ctx, "x", 0)
		if err != nil {
			t.Fatal(err)
		}
		fwg.Add(1)
		go func() {
			defer fwg.Done()
			next := uint64(1)
			for e := range ch {
				if e.Seq != next {
					t.Errorf("follower got %d, want %d", e.Seq, next)
					return
				}
				if next++; next > writers*each {
					return
				}
			}
		}()
	}
	var wg sync.WaitGroup
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				if _, err := l.Append("x", Event{Type: Policy, Message: "decision"}); err != nil {
					t.Error(err)
					return
				}
				if i%50 == 0 {
					if _, err := l.List("x", Query{}); err != nil {
						t.Error(err)
					}
				}
			}
		}()
	}
	wg.Wait()
	fwg.Wait()
	ids, err := l.IDs()
	if err != nil || fmt.Sprint(ids) != "[x]" {
		t.Errorf("IDs = %v, %v", ids, err)
	}
}

func BenchmarkAppend(b *testing.B) {
	l, err := Open(Config{Dir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	e := Event{Type: Policy, Message: "GET https://example.com/ allowed by rule 3", Data: Data(map[string]any{"host": "example.com", "allowed": true})}
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if _, err := l.Append("bench", e); err != nil {
			b.Fatal(err)
		}
	}
}

func TestOOMWatch(t *testing.T) {
	dir := t.TempDir()
	l := openLog(t, dir, 0)
	w := NewOOMWatch(l)
	t0 := time.Now()
	w.Started("o")
	for i, kills := range []uint64{0, 0, 1, 1, 3} {
		w.Observe("o", metrics.Sample{Sample: api.Sample{Time: t0.Add(time.Duration(i) * time.Second), OOMKills: kills, MemoryLimitBytes: 256 << 20}})
	}
	evs, _ := l.List("o", Query{Types: []Type{OOM}})
	if len(evs) != 2 {
		t.Fatalf("%d oom events, want 2", len(evs))
	}
	var d OOMData
	json.Unmarshal(evs[1].Data, &d)
	if d.Kills != 2 || d.Total != 3 || !strings.Contains(evs[1].Message, "256 MiB") {
		t.Errorf("second oom event: %+v, %q", d, evs[1].Message)
	}
	// A restarted daemon does not report the same kills again.
	w2 := NewOOMWatch(openLog(t, dir, 0))
	w2.Resumed("o")
	w2.Observe("o", metrics.Sample{Sample: api.Sample{Time: t0.Add(time.Minute), OOMKills: 3}})
	w2.Observe("o", metrics.Sample{Sample: api.Sample{Time: t0.Add(2 * time.Minute), OOMKills: 4}})
	if evs, _ := l.List("o", Query{Types: []Type{OOM}}); len(evs) != 3 {
		t.Errorf("%d oom events after a restart and one more kill, want 3", len(evs))
	}
	// A sandbox forgotten (removed) while the sampler read it is not
	// watched again, nor its log's state made again, by that reading.
	w2.Forget("o")
	if err := l.Remove("o"); err != nil {
		t.Fatal(err)
	}
	w2.Observe("o", metrics.Sample{Sample: api.Sample{Time: t0.Add(3 * time.Minute), OOMKills: 5}})
	if _, ok := w2.last["o"]; ok {
		t.Error("a forgotten sandbox is watched again after a late sample")
	}
	if evs, _ := l.List("o", Query{Types: []Type{OOM}}); len(evs) != 0 {
		t.Errorf("%d oom events of a removed sandbox after a late sample, want 0", len(evs))
	}
	// Nor is one never started.
	w2.Observe("p", metrics.Sample{Sample: api.Sample{Time: t0, OOMKills: 1}})
	if _, ok := w2.last["p"]; ok {
		t.Error("a sandbox never started is watched after a sample")
	}
}

// TestRemovedLogRecycled: a removed sandbox's log file becomes the next
// new log, holding none of the first's events; a removal while a List
// reads the log deletes the file instead; a restart finds the next
// sandbox's events and no spare.
func TestRemovedLogRecycled(t *testing.T) {
	dir := t.TempDir()
	l := openLog(t, dir, 0)
	appendN(t, l, "sbx-a", 20)
	cur, _ := l.paths("sbx-a")
	fi, err := os.Stat(cur)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Remove("sbx-a"); err != nil {
		t.Fatal(err)
	}
	if l.spares.Len() != 1 {
		t.Fatalf("%d spares after a removal, want 1", l.spares.Len())
	}
	if _, err := l.Append("sbx-b", Event{Type: Lifecycle, Message: "created"}); err != nil {
		t.Fatal(err)
	}
	curB, _ := l.paths("sbx-b")
	fiB, err := os.Stat(curB)
	if err != nil {
		t.Fatal(err)
	}
	if !os.SameFile(fi, fiB) {
		t.Error("the next sandbox's log is a new file, not the spare")
	}
	b, err := os.ReadFile(curB)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), "sbx-a") || strings.Count(string(b), "\n") != 1 {
		t.Errorf("the next sandbox's log holds %q", b)
	}
	// A restart: the next sandbox's log as it was; the spares deleted.
	appendN(t, l, "sbx-c", 1)
	if err := l.Remove("sbx-c"); err != nil {
		t.Fatal(err)
	}
	l2 := openLog(t, dir, 0)
	evs, err := l2.List("sbx-b", Query{})
	if err != nil || len(evs) != 1 || evs[0].Seq != 1 || evs[0].Message != "created" {
		t.Errorf("after a restart sbx-b's events are %+v, %v", evs, err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("after a restart the log's directory holds %d files, want sbx-b's", len(ents))
	}
	// While a List reads it, a removed log is deleted, not kept.
	appendN(t, l2, "sbx-d", 3)
	bx := l2.box("sbx-d")
	bx.mu.Lock()
	bx.readers++ // as List does
	bx.mu.Unlock()
	if err := l2.Remove("sbx-d"); err != nil {
		t.Fatal(err)
	}
	if l2.spares.Len() != 0 {
		t.Error("a log being read became a spare")
	}
}

// TestRemoveRefusesStragglers: events that race a sandbox's removal (an
// exec's exit its output copy reaches after the teardown, say) are either
// in the log before it goes or refused after it: none makes the log
// again, a file no sandbox owns (TestDeleteThenCreate saw one). Sandboxes
// long removed are forgotten, and their ids take events again.
func TestRemoveRefusesStragglers(t *testing.T) {
	dir := t.TempDir()
	l := openLog(t, dir, 0)
	for i := range 50 {
		id := fmt.Sprintf("race-%d", i)
		appendN(t, l, id, 1)
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 20 {
				if _, err := l.Append(id, Event{Type: Exec, Message: "exited"}); err != nil && !errors.Is(err, ErrRemoved) {
					t.Errorf("%s: %v", id, err)
				}
			}
		}()
		if err := l.Remove(id); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		if cur, _ := l.paths(id); fileExists(cur) {
			t.Fatalf("%s: an event racing the removal made the log again", id)
		}
	}
	for i := range gone.Keep {
		if err := l.Remove(fmt.Sprintf("later-%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := l.Append("race-0", Event{Type: Lifecycle}); err != nil {
		t.Errorf("an id removed %d removals ago: %v", gone.Keep, err)
	}
	if n := l.gone.Len(); n != gone.Keep {
		t.Errorf("%d removed ids remembered, want %d", n, gone.Keep)
	}
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
