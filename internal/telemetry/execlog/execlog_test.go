package execlog

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/wire"
	"golang.org/x/sys/unix"
)

func open(t *testing.T, cfg Config) *Store {
	t.Helper()
	if cfg.Dir == "" {
		cfg.Dir = t.TempDir()
	}
	s, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// readAll returns what Read gives from offset from, as "stream:data" runs,
// and the offset of the first chunk.
func readAll(t *testing.T, s *Store, id string, seq uint64, from int64) (string, int64) {
	t.Helper()
	var out strings.Builder
	first := int64(-1)
	err := s.Read(context.Background(), id, seq, from, false, func(c Chunk) error {
		if first < 0 {
			first = c.Offset
		}
		fmt.Fprintf(&out, "%d:%s|", c.Stream, c.Data)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out.String(), first
}

func TestWriteRead(t *testing.T) {
	s := open(t, Config{})
	w, err := s.Start("sbx", "", 42, []string{"sh", "-c", "echo hi"}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	w.Write(wire.Stdout, []byte("hello "))
	w.Write(wire.Stderr, []byte("oops "))
	w.Write(wire.Stdout, []byte("world"))
	if err := w.Finish(api.ExitStatus{ExitCode: 3}); err != nil {
		t.Fatal(err)
	}
	got, first := readAll(t, s, "sbx", w.Seq(), 0)
	if got != "1:hello |2:oops |1:world|" || first != 0 {
		t.Errorf("Read = %q from %d", got, first)
	}
	// From the middle of a record.
	if got, first := readAll(t, s, "sbx", w.Seq(), 8); got != "2:ps |1:world|" || first != 8 {
		t.Errorf("Read from 8 = %q from %d", got, first)
	}
	p, err := s.Find("sbx", "", 42)
	if err != nil || p.Seq != 1 || p.End != 16 || p.Start != 0 || p.Exit == nil || p.Exit.ExitCode != 3 || p.EndedAt == nil {
		t.Errorf("Find = %+v, %v", p, err)
	}
	if _, err := s.Find("sbx", "", 7); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Find of an unknown pid = %v", err)
	}
	// A pid reused: Find gives the newest.
	w2, _ := s.Start("sbx", "", 42, []string{"true"}, time.Now())
	w2.Finish(api.ExitStatus{})
	if p, _ := s.Find("sbx", "", 42); p.Seq != 2 {
		t.Errorf("Find of a reused pid = seq %d, want 2", p.Seq)
	}
	// Each container numbers its own processes: the same pid in another
	// container is another process, and neither hides the other.
	w3, _ := s.Start("sbx", "db", 42, []string{"postgres"}, time.Now())
	w3.Write(wire.Stdout, []byte("ready"))
	if p, err := s.Find("sbx", "db", 42); err != nil || p.Seq != 3 || p.Container != "db" || p.End != 5 {
		t.Errorf("Find in container db = %+v, %v", p, err)
	}
	if p, _ := s.Find("sbx", "", 42); p.Seq != 2 || p.Container != "" {
		t.Errorf("Find in the first container after db's = %+v, want seq 2", p)
	}
	if _, err := s.Find("sbx", "tools", 42); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Find in a container without that pid = %v", err)
	}
	w3.Finish(api.ExitStatus{})
	for _, id := range []string{"", "../etc", "A"} {
		if _, err := s.Start(id, "", 1, nil, time.Now()); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("Start(%q) = %v, want ErrInvalid", id, err)
		}
	}
}

func TestProcessCap(t *testing.T) {
	s := open(t, Config{MaxProcessBytes: 64 << 10})
	w, _ := s.Start("sbx", "", 1, nil, time.Now())
	var all bytes.Buffer
	for i := 0; i < 1000; i++ {
		line := fmt.Sprintf("line %04d %s\n", i, strings.Repeat("x", 1000))
		all.WriteString(line)
		if err := w.Write(wire.Stdout, []byte(line)); err != nil {
			t.Fatal(err)
		}
	}
	w.Finish(api.ExitStatus{})
	p, _ := s.Find("sbx", "", 1)
	kept := p.End - p.Start
	if p.End != int64(all.Len()) || kept > 64<<10 || kept < 16<<10 {
		t.Errorf("kept [%d, %d) of %d bytes", p.Start, p.End, all.Len())
	}
	var got bytes.Buffer
	first := int64(-1)
	s.Read(context.Background(), "sbx", p.Seq, 0, false, func(c Chunk) error {
		if first < 0 {
			first = c.Offset
		}
		got.Write(c.Data)
		return nil
	})
	if first != p.Start || !bytes.Equal(got.Bytes(), all.Bytes()[p.Start:]) {
		t.Errorf("read %d bytes from %d; want the newest %d from %d", got.Len(), first, kept, p.Start)
	}
	if n, _ := s.Bytes("sbx"); n > 64<<10+2*hdrSize*64 {
		t.Errorf("%d bytes on disk", n)
	}
}

func TestSandboxCaps(t *testing.T) {
	s := open(t, Config{MaxProcessBytes: 64 << 10, MaxSandboxBytes: 128 << 10, MaxProcesses: 5})
	chunk := bytes.Repeat([]byte("y"), 8<<10)
	for pid := 1; pid <= 8; pid++ {
		w, _ := s.Start("sbx", "", pid, nil, time.Now())
		for i := 0; i < 6; i++ { // 48 KiB each
			w.Write(wire.Stdout, chunk)
		}
		w.Finish(api.ExitStatus{})
		if n, _ := s.Bytes("sbx"); n > 128<<10 {
			t.Fatalf("after process %d: %d bytes on disk, cap %d", pid, n, 128<<10)
		}
	}
	procs, _ := s.List("sbx")
	if len(procs) != 5 || procs[0].PID != 4 || procs[4].PID != 8 {
		t.Fatalf("kept processes %v, want the newest 5", procs)
	}
	// The newest keeps its output; the oldest kept have lost theirs first.
	if last := procs[4]; last.End-last.Start != 48<<10 {
		t.Errorf("newest process kept %d bytes, want all 48 KiB", last.End-last.Start)
	}
	if procs[0].End-procs[0].Start >= procs[4].End-procs[4].Start {
		t.Errorf("oldest kept %d bytes, newest %d: oldest should go first", procs[0].End-procs[0].Start, procs[4].End-procs[4].Start)
	}
	entries, _ := os.ReadDir(filepath.Join(s.cfg.Dir, "sbx"))
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "1.") || strings.HasPrefix(e.Name(), "2.") {
			t.Errorf("%s of a dropped process is still on disk", e.Name())
		}
	}
}

func TestFollow(t *testing.T) {
	s := open(t, Config{})
	w, _ := s.Start("sbx", "", 9, nil, time.Now())
	w.Write(wire.Stdout, []byte("a"))
	var mu sync.Mutex
	var got strings.Builder
	done := make(chan error, 1)
	go func() {
		done <- s.Read(context.Background(), "sbx", w.Seq(), 0, true, func(c Chunk) error {
			mu.Lock()
			defer mu.Unlock()
			got.Write(c.Data)
			return nil
		})
	}()
	for _, p := range []string{"b", "c", "d"} {
		time.Sleep(10 * time.Millisecond)
		w.Write(wire.Stdout, []byte(p))
	}
	w.Skip(100) // lost in the guest
	w.Write(wire.Stderr, []byte("e"))
	time.Sleep(10 * time.Millisecond)
	w.Finish(api.ExitStatus{ExitCode: 0})
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a follow did not end with the process")
	}
	if got.String() != "abcde" {
		t.Errorf("followed %q", got.String())
	}
	if p, _ := s.Find("sbx", "", 9); p.End != 105 {
		t.Errorf("End = %d after a skip of 100, want 105", p.End)
	}
	// A follow ends with ctx too.
	w2, _ := s.Start("sbx", "", 10, nil, time.Now())
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := s.Read(ctx, "sbx", w2.Seq(), 0, true, func(Chunk) error { return nil }); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Read with an ended ctx = %v", err)
	}
}

// TestRestart: a new store carries on; an unfinished process's copy
// resumes at its offset after a torn record is cut off.
func TestRestart(t *testing.T) {
	dir := t.TempDir()
	s := open(t, Config{Dir: dir})
	w, _ := s.Start("sbx", "", 5, []string{"make"}, time.Now())
	w.Write(wire.Stdout, []byte("building\n"))
	w.Close() // the daemon stops
	// A crash mid-frame.
	tear(t, filepath.Join(dir, "sbx.log"), []byte{frameOutput, 1, 0, 0, 0, 0, 0, 50, 0, 0})

	s2 := open(t, Config{Dir: dir})
	procs, err := s2.List("sbx")
	if err != nil || len(procs) != 1 || procs[0].End != 9 || procs[0].Exit != nil {
		t.Fatalf("List after restart = %+v, %v", procs, err)
	}
	w2, err := s2.Resume("sbx", 1)
	if err != nil {
		t.Fatal(err)
	}
	if w2.Offset() != 9 {
		t.Errorf("Offset = %d, want 9", w2.Offset())
	}
	if _, err := s2.Resume("sbx", 1); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("a second Resume = %v, want ErrConflict", err)
	}
	w2.Write(wire.Stdout, []byte("done\n"))
	w2.Finish(api.ExitStatus{ExitCode: 0})
	if got, _ := readAll(t, s2, "sbx", 1, 0); got != "1:building\n|1:done\n|" {
		t.Errorf("after resume: %q", got)
	}
	w3, _ := s2.Start("sbx", "", 6, nil, time.Now())
	if w3.Seq() != 2 {
		t.Errorf("seq after restart = %d, want 2", w3.Seq())
	}
	w3.Finish(api.ExitStatus{})

	ids, _ := s2.IDs()
	if fmt.Sprint(ids) != "[sbx]" {
		t.Errorf("IDs = %v", ids)
	}
	if err := s2.Remove("sbx"); err != nil {
		t.Fatal(err)
	}
	if m, _ := filepath.Glob(filepath.Join(dir, "sbx*")); len(m) != 0 {
		t.Errorf("files left after Remove: %v", m)
	}
	if procs, _ := s2.List("sbx"); len(procs) != 0 {
		t.Errorf("List after Remove = %v", procs)
	}
}

func TestConcurrentWritersAndReaders(t *testing.T) {
	s := open(t, Config{MaxProcessBytes: 64 << 10, MaxSandboxBytes: 256 << 10})
	var wg sync.WaitGroup
	for pid := 1; pid <= 4; pid++ {
		w, err := s.Start("sbx", "", pid, nil, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(2)
		go func() {
			defer wg.Done()
			for i := 0; i < 300; i++ {
				w.Write(wire.Stdout, bytes.Repeat([]byte{'a' + byte(pid)}, 512))
			}
			w.Finish(api.ExitStatus{})
		}()
		go func() {
			defer wg.Done()
			last := int64(-1)
			err := s.Read(context.Background(), "sbx", w.Seq(), 0, true, func(c Chunk) error {
				if c.Offset <= last {
					return fmt.Errorf("offset %d after %d", c.Offset, last)
				}
				last = c.Offset
				return nil
			})
			if err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if n, _ := s.Bytes("sbx"); n > 256<<10 {
		t.Errorf("%d bytes on disk, cap %d", n, 256<<10)
	}
}

// TestRecordSavedLazily: a process's record reaches the disk with its
// first output, with Save, or when its writer closes, not at Start; the
// store lists it from memory meanwhile.
func TestRecordSavedLazily(t *testing.T) {
	tests := []struct {
		name string
		do   func(w *Writer) error
	}{
		{"first output", func(w *Writer) error { return w.Write(wire.Stdout, []byte("hi\n")) }},
		{"save", func(w *Writer) error { return w.Save() }},
		{"close", func(w *Writer) error { return w.Close() }},
		{"finish", func(w *Writer) error { return w.Finish(api.ExitStatus{}) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			s := open(t, Config{Dir: dir})
			w, err := s.Start("sbx", "", 7, []string{"sleep", "9"}, time.Now())
			if err != nil {
				t.Fatal(err)
			}
			if ps, err := s.List("sbx"); err != nil || len(ps) != 1 || ps[0].PID != 7 {
				t.Fatalf("List after Start = %+v, %v", ps, err)
			}
			if ps, _ := open(t, Config{Dir: dir}).List("sbx"); len(ps) != 0 {
				t.Fatalf("a record on disk right after Start: %+v", ps)
			}
			if err := tt.do(w); err != nil {
				t.Fatal(err)
			}
			if ps, _ := open(t, Config{Dir: dir}).List("sbx"); len(ps) != 1 || ps[0].PID != 7 || ps[0].Cmd[0] != "sleep" {
				t.Errorf("records on disk after %s: %+v", tt.name, ps)
			}
		})
	}
}

// tear appends a part of a frame to path, as a crash mid-write leaves.
func tear(t *testing.T, path string, part []byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.Write(part)
	f.Close()
}

// TestRecordsFile: records are frames of the sandbox's log, which is
// compacted as processes are dropped; after a restart the dropped ones
// stay dropped, an unfinished old one stays, and a torn last frame is cut
// off.
func TestRecordsFile(t *testing.T) {
	dir := t.TempDir()
	const keep = 4
	s := open(t, Config{Dir: dir, MaxProcesses: keep})
	server, _ := s.Start("sbx", "", 1, []string{"server"}, time.Now())
	server.Write(wire.Stdout, []byte("listening\n"))
	for pid := 2; pid <= 1000; pid++ {
		w, _ := s.Start("sbx", "", pid, []string{"true"}, time.Now())
		if err := w.Finish(api.ExitStatus{ExitCode: pid}); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(dir, "sbx.log")
	info, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if info.Size() > compactSlack+4<<10 {
		t.Errorf("log of %d bytes for %d records: not compacted", info.Size(), keep)
	}
	if m, _ := filepath.Glob(filepath.Join(dir, "*")); len(m) != 1 {
		t.Errorf("files %v besides the sandbox's log", m)
	}
	want, _ := s.List("sbx")
	if len(want) != keep || want[0].PID != 1 || want[len(want)-1].PID != 1000 {
		t.Fatalf("kept %v, want the running server and the newest %d", pids(want), keep-1)
	}
	server.Close() // the daemon stops

	// A crash mid-append.
	hdr := frame(frameRecord, 0, 1001, 0, 100)
	tear(t, path, append(hdr[:], `{"seq":1001,"pid":4`...))
	s2 := open(t, Config{Dir: dir, MaxProcesses: keep})
	got, err := s2.List("sbx")
	if err != nil || fmt.Sprint(pids(got)) != fmt.Sprint(pids(want)) {
		t.Fatalf("after restart: %v, %v; want %v", pids(got), err, pids(want))
	}
	if got[len(got)-1].Exit == nil || got[len(got)-1].Exit.ExitCode != 1000 {
		t.Errorf("last record after restart = %+v", got[len(got)-1])
	}
	if out, _ := readAll(t, s2, "sbx", 1, 0); out != "1:listening\n|" {
		t.Errorf("the server's output after restart: %q", out)
	}
	w, _ := s2.Start("sbx", "", 1001, nil, time.Now())
	w.Finish(api.ExitStatus{ExitCode: 1001})
	s3 := open(t, Config{Dir: dir, MaxProcesses: keep})
	got, _ = s3.List("sbx")
	if last := got[len(got)-1]; last.PID != 1001 || last.Exit == nil || last.Exit.ExitCode != 1001 {
		t.Errorf("a record appended after a torn line reads back as %+v", last)
	}
	if got[0].PID != 1 {
		t.Errorf("the unfinished server's record was dropped: %v", pids(got))
	}
}

// TestLegacyRecords: records of a daemon from before the records file,
// one <seq>.json each, are moved into it.
func TestLegacyRecords(t *testing.T) {
	dir := t.TempDir()
	sbx := filepath.Join(dir, "sbx")
	os.MkdirAll(sbx, 0o700)
	os.WriteFile(filepath.Join(sbx, "1.json"), []byte(`{"seq":1,"pid":7,"cmd":["make"],"started_at":"2026-12-01T10:00:00Z","exit":{"exit_code":2},"start":0,"end":0}`), 0o600)
	os.WriteFile(filepath.Join(sbx, "2.json"), []byte(`{"seq":2,"pid":8`), 0o600) // cut by a crash
	s := open(t, Config{Dir: dir})
	got, err := s.List("sbx")
	if err != nil || len(got) != 1 || got[0].PID != 7 || got[0].Exit == nil || got[0].Exit.ExitCode != 2 {
		t.Fatalf("List = %+v, %v", got, err)
	}
	if m, _ := filepath.Glob(filepath.Join(sbx, "*.json")); len(m) != 0 {
		t.Errorf("legacy record files left: %v", m)
	}
	got, _ = open(t, Config{Dir: dir}).List("sbx")
	if len(got) != 1 || got[0].PID != 7 {
		t.Errorf("after a second restart: %+v", got)
	}
	w, _ := s.Start("sbx", "", 9, nil, time.Now())
	if w.Seq() != 2 {
		t.Errorf("seq after legacy records = %d, want 2", w.Seq())
	}
}

// TestLegacyRecordsFile: a daemon from before the sandbox's log kept the
// records as JSON lines in <sandbox>/records; they move into the log, and
// the segments stay where they were.
func TestLegacyRecordsFile(t *testing.T) {
	dir := t.TempDir()
	sbx := filepath.Join(dir, "sbx")
	os.MkdirAll(sbx, 0o700)
	os.WriteFile(filepath.Join(sbx, "records"), []byte(`{"seq":1,"pid":7,"cmd":["make"],"started_at":"2026-12-01T10:00:00Z","start":0,"end":0}
{"seq":1,"pid":7,"cmd":["make"],"started_at":"2026-12-01T10:00:00Z","exit":{"exit_code":2},"start":0,"end":6}
{"seq":2,"pid":8,"cmd":["sleep"],"started_at":"2026-12-01T10:00:00Z","start":0,"end":0}
{"seq":3,`), 0o600)
	os.WriteFile(filepath.Join(sbx, "1.log"), appendRecord(nil, wire.Stderr, 0, []byte("error\n")), 0o600)
	s := open(t, Config{Dir: dir})
	got, err := s.List("sbx")
	if err != nil || fmt.Sprint(pids(got)) != "[7 8]" || got[0].Exit == nil || got[0].Exit.ExitCode != 2 || got[0].End != 6 {
		t.Fatalf("List = %+v, %v", got, err)
	}
	if out, _ := readAll(t, s, "sbx", 1, 0); out != "2:error\n|" {
		t.Errorf("output of a legacy process: %q", out)
	}
	if _, err := os.Stat(filepath.Join(sbx, "records")); !os.IsNotExist(err) {
		t.Errorf("legacy records file left: %v", err)
	}
	got, _ = open(t, Config{Dir: dir}).List("sbx")
	if fmt.Sprint(pids(got)) != "[7 8]" {
		t.Errorf("after a second restart: %+v", got)
	}
	w, err := s.Resume("sbx", 2)
	if err != nil {
		t.Fatal(err)
	}
	w.Write(wire.Stdout, []byte("awake\n"))
	w.Finish(api.ExitStatus{})
	if out, _ := readAll(t, open(t, Config{Dir: dir}), "sbx", 2, 0); out != "1:awake\n|" {
		t.Errorf("output after the upgrade: %q", out)
	}
}

// TestSmallOutputMakesNoFiles: a short command's output goes to the
// sandbox's log, the only file of a sandbox's first exec; output past
// inlineMax moves to a segment, whole and in order, across restarts.
func TestSmallOutputMakesNoFiles(t *testing.T) {
	dir := t.TempDir()
	s := open(t, Config{Dir: dir})
	w, _ := s.Start("sbx", "", 1, []string{"echo", "hi"}, time.Now())
	w.Write(wire.Stdout, []byte("hi\n"))
	w.Finish(api.ExitStatus{})
	w, _ = s.Start("sbx", "", 2, []string{"cat", "big"}, time.Now())
	w.Write(wire.Stdout, []byte("head\n"))
	w.Write(wire.Stderr, []byte("warn\n"))
	if m, _ := filepath.Glob(filepath.Join(dir, "*")); fmt.Sprint(m) != fmt.Sprint([]string{filepath.Join(dir, "sbx.log")}) {
		t.Fatalf("files after small outputs: %v", m)
	}
	var want strings.Builder
	want.WriteString("1:head\n|2:warn\n|")
	for i := range 40 {
		line := fmt.Sprintf("%02d %s\n", i, strings.Repeat("x", 1000))
		w.Write(wire.Stdout, []byte(line))
		fmt.Fprintf(&want, "1:%s|", line)
	}
	if _, err := os.Stat(filepath.Join(dir, "sbx", "2.log")); err != nil {
		t.Errorf("no segment for output past %d bytes: %v", inlineMax, err)
	}
	if got, _ := readAll(t, s, "sbx", 2, 0); got != want.String() {
		t.Errorf("output across the move: %d bytes, want %d", len(got), want.Len())
	}
	w.Close()
	s2 := open(t, Config{Dir: dir})
	if got, _ := readAll(t, s2, "sbx", 2, 0); got != want.String() {
		t.Errorf("output across the move after restart: %d bytes, want %d", len(got), want.Len())
	}
	if got, _ := readAll(t, s2, "sbx", 1, 0); got != "1:hi\n|" {
		t.Errorf("small output after restart: %q", got)
	}
	n1, _ := s.Bytes("sbx")
	n2, _ := s2.Bytes("sbx")
	if n1 != n2 {
		t.Errorf("Bytes = %d, %d after restart", n1, n2)
	}
}

// TestCrashMidMove: a crash while output moved to a segment leaves a
// partial segment; the output in the log stands and the move is redone.
func TestCrashMidMove(t *testing.T) {
	dir := t.TempDir()
	s := open(t, Config{Dir: dir})
	w, _ := s.Start("sbx", "", 1, nil, time.Now())
	w.Write(wire.Stdout, []byte("one\n"))
	w.Write(wire.Stdout, []byte("two\n"))
	w.Close()
	os.MkdirAll(filepath.Join(dir, "sbx"), 0o700)
	os.WriteFile(filepath.Join(dir, "sbx", "1.log"), appendRecord(nil, wire.Stdout, 0, []byte("one\n")), 0o600)
	s2 := open(t, Config{Dir: dir})
	if got, _ := readAll(t, s2, "sbx", 1, 0); got != "1:one\n|1:two\n|" {
		t.Errorf("after a crash mid-move: %q", got)
	}
	w, _ = s2.Resume("sbx", 1)
	w.Write(wire.Stdout, bytes.Repeat([]byte("z"), inlineMax))
	w.Finish(api.ExitStatus{})
	got, _ := readAll(t, open(t, Config{Dir: dir}), "sbx", 1, 0)
	if want := "1:one\n|1:two\n|1:" + strings.Repeat("z", inlineMax) + "|"; got != want {
		t.Errorf("after the move was redone: %d bytes, want %d", len(got), len(want))
	}
}

func pids(ps []Process) []int {
	var out []int
	for _, p := range ps {
		out = append(out, p.PID)
	}
	return out
}

// TestMinFree: output is dropped, and counted, while the logs' file system
// is short of MinFree, and kept again once there is room; a real tmpfs
// of 8 MiB stands for a full host disk.
func TestMinFree(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a tmpfs")
	}
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=8m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	now := time.Now()
	s := open(t, Config{Dir: filepath.Join(dir, "logs"), MinFree: 4 << 20, Now: func() time.Time { return now }})
	w, err := s.Start("sbx", "", 1, nil, now)
	if err != nil {
		t.Fatal(err)
	}
	mib := bytes.Repeat([]byte("z"), 1<<20)
	write := func() {
		t.Helper()
		if err := w.Write(wire.Stdout, mib); err != nil {
			t.Fatalf("write: %v", err)
		}
	}
	kept := func() int64 {
		t.Helper()
		n, err := s.Bytes("sbx")
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	write()
	write()
	if n := kept(); n < 2<<20 {
		t.Fatalf("kept %d bytes with room to spare, want 2 MiB", n)
	}
	// Another writer takes the room: free drops under MinFree.
	filler := filepath.Join(dir, "filler")
	if err := os.WriteFile(filler, bytes.Repeat([]byte("f"), 3<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	now = now.Add(2 * spaceCheckEvery)
	before := kept()
	write()
	if n := kept(); n != before {
		t.Fatalf("kept %d bytes while short of space, want %d (output dropped)", n, before)
	}
	p, err := s.Find("sbx", "", 1)
	if err != nil {
		t.Fatal(err)
	}
	if p.End != 3<<20 {
		t.Fatalf("end offset %d, want %d: dropped output must still be counted", p.End, 3<<20)
	}
	os.Remove(filler)
	now = now.Add(2 * spaceCheckEvery)
	write()
	if n := kept(); n <= before {
		t.Fatalf("kept %d bytes after room came back, want more than %d", n, before)
	}
	var got int64
	if err := s.Read(context.Background(), "sbx", w.Seq(), 0, false, func(c Chunk) error { got += int64(len(c.Data)); return nil }); err != nil {
		t.Fatal(err)
	}
	if got != 3<<20 {
		t.Fatalf("read %d bytes back, want the 3 MiB that were kept", got)
	}
}

// FuzzLoad: whatever a sandbox's log holds (a crash, a disk error, a
// hand edit), loading it neither panics nor keeps the store from
// listing, reading and writing the sandbox.
func FuzzLoad(f *testing.F) {
	dir := f.TempDir()
	s, err := Open(Config{Dir: dir, MinFree: -1})
	if err != nil {
		f.Fatal(err)
	}
	w, _ := s.Start("sbx", "", 1, []string{"echo", "hi"}, time.Now())
	w.Write(wire.Stdout, []byte("hi\n"))
	w.Write(wire.Stderr, []byte("oops\n"))
	w.Close()
	seed, err := os.ReadFile(filepath.Join(dir, "sbx.log"))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(seed)
	f.Add(seed[:len(seed)-3])
	f.Add(append(seed, seed[frameHdr:]...))
	// Output frames that go back over each other (the log of CI's
	// failing run): read back, they must not give more than End-Start.
	overlap := slices.Clone(seed)
	for _, n := range []int{3, 1} {
		hdr := frame(frameOutput, wire.Stdout, 1, 8, n)
		overlap = append(append(overlap, hdr[:]...), "abc"[:n]...)
	}
	f.Add(overlap)
	f.Fuzz(func(t *testing.T, log []byte) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "sbx.log"), log, 0o600); err != nil {
			t.Fatal(err)
		}
		s := open(t, Config{Dir: dir, MinFree: -1})
		procs, err := s.List("sbx")
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range procs {
			var got int64
			err := s.Read(context.Background(), "sbx", p.Seq, 0, false, func(c Chunk) error {
				got += int64(len(c.Data))
				return nil
			})
			if err != nil || got > p.End-p.Start {
				t.Fatalf("Read of %+v: %d bytes, %v", p, got, err)
			}
		}
		w, err := s.Start("sbx", "", 2, nil, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Write(wire.Stdout, []byte("after\n")); err != nil {
			t.Fatal(err)
		}
		w.Finish(api.ExitStatus{})
		got, _ := readAll(t, open(t, Config{Dir: dir, MinFree: -1}), "sbx", w.Seq(), 0)
		if got != "1:after\n|" {
			t.Fatalf("output written after loading: %q", got)
		}
	})
}

// TestRemovedLogRecycled: a removed sandbox's log becomes the next
// sandbox's, which reads only its own output, now and after a restart
// (which deletes the spares); a Read that holds the log open when its
// sandbox is removed makes the removal delete it instead, so that the
// reader never reads the next sandbox's frames.
func TestRemovedLogRecycled(t *testing.T) {
	dir := t.TempDir()
	s := open(t, Config{Dir: dir})
	write := func(s *Store, id, out string) {
		t.Helper()
		w, err := s.Start(id, "", 1, []string{"echo"}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Write(wire.Stdout, []byte(out)); err != nil {
			t.Fatal(err)
		}
		if err := w.Finish(api.ExitStatus{}); err != nil {
			t.Fatal(err)
		}
	}
	write(s, "sbx-a", "a's secret output, longer than b's\n")
	fa, err := os.Stat(filepath.Join(dir, "sbx-a.log"))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Remove("sbx-a"); err != nil {
		t.Fatal(err)
	}
	write(s, "sbx-b", "b\n")
	fb, err := os.Stat(filepath.Join(dir, "sbx-b.log"))
	if err != nil {
		t.Fatal(err)
	}
	if !os.SameFile(fa, fb) {
		t.Error("the next sandbox's log is a new file, not the spare")
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "sbx-b.log")); bytes.Contains(b, []byte("secret")) {
		t.Errorf("the next sandbox's log holds the first's output: %q", b)
	}
	check := func(s *Store) {
		t.Helper()
		ps, err := s.List("sbx-b")
		if err != nil || len(ps) != 1 || ps[0].Exit == nil {
			t.Fatalf("sbx-b's processes: %+v, %v", ps, err)
		}
		if got, _ := readAll(t, s, "sbx-b", 1, 0); got != "1:b\n|" {
			t.Errorf("sbx-b's output = %q", got)
		}
	}
	check(s)
	write(s, "sbx-c", "c\n")
	if err := s.Remove("sbx-c"); err != nil {
		t.Fatal(err)
	}
	s2 := open(t, Config{Dir: dir})
	check(s2)
	if m, _ := filepath.Glob(filepath.Join(dir, ".*")); len(m) != 0 {
		t.Errorf("spares left after a restart: %v", m)
	}

	// A Read in progress when the sandbox is removed.
	write(s2, "sbx-d", "d's output\n")
	reading, release := make(chan struct{}), make(chan struct{})
	done := make(chan string)
	go func() {
		var got strings.Builder
		s2.Read(context.Background(), "sbx-d", 1, 0, false, func(c Chunk) error {
			close(reading)
			<-release
			got.Write(c.Data)
			return nil
		})
		done <- got.String()
	}()
	<-reading
	if err := s2.Remove("sbx-d"); err != nil {
		t.Fatal(err)
	}
	if s2.spares.Len() != 0 {
		t.Error("a log being read became a spare")
	}
	close(release)
	if got := <-done; got != "d's output\n" {
		t.Errorf("the reader read %q", got)
	}
	write(s2, "sbx-e", "e\n")
	if got, _ := readAll(t, s2, "sbx-e", 1, 0); got != "1:e\n|" {
		t.Errorf("sbx-e's output = %q", got)
	}
}

// TestRemoveRefusesStragglers: a process recorded as its sandbox is
// removed (an exec whose start the daemon records behind its answer,
// racing the delete) is either in the log before it goes or refused after
// it, with ErrRemoved (a not-found): none makes the log again, a file no
// sandbox owns. A second removal is no error.
func TestRemoveRefusesStragglers(t *testing.T) {
	dir := t.TempDir()
	s := open(t, Config{Dir: dir})
	for i := range 50 {
		id := fmt.Sprintf("race-%d", i)
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 20 {
				w, err := s.Start(id, "", 100+j, []string{"echo"}, time.Now())
				if errors.Is(err, ErrRemoved) {
					continue
				}
				if err != nil {
					t.Errorf("%s: %v", id, err)
					return
				}
				if err := w.Write(wire.Stdout, []byte("hi\n")); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
					t.Errorf("%s: writing: %v", id, err)
				}
				w.Finish(api.ExitStatus{})
			}
		}()
		if err := s.Remove(id); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		if _, err := os.Stat(filepath.Join(dir, id+".log")); err == nil {
			t.Fatalf("%s: a process racing the removal made the log again", id)
		}
		if _, err := os.Stat(filepath.Join(dir, id)); err == nil {
			t.Fatalf("%s: a process racing the removal made its segments' directory again", id)
		}
		if _, err := s.Start(id, "", 1, []string{"late"}, time.Now()); !errors.Is(err, ErrRemoved) || !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("%s: a start after the removal: %v, want ErrRemoved", id, err)
		}
		if err := s.Remove(id); err != nil {
			t.Fatalf("%s: removed again: %v", id, err)
		}
	}
}
