package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"
	"weak"

	"github.com/paddock-dev/paddock/internal/errdefs"
)

type rec struct {
	Name string `json:"name"`
	N    int    `json:"n"`
}

func TestPutGetDeleteEach(t *testing.T) {
	path := filepath.Join(t.TempDir(), "db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Put("b", "k1", rec{"one", 1}); err != nil {
		t.Fatal(err)
	}
	if err := s.Put("b", "k2", rec{"two", 2}); err != nil {
		t.Fatal(err)
	}
	var r rec
	if err := s.Get("b", "k1", &r); err != nil || r.N != 1 {
		t.Fatalf("Get k1 = %+v, %v", r, err)
	}
	if err := s.Get("b", "missing", &r); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Get missing: %v, want ErrNotFound", err)
	}
	if err := s.Get("nobucket", "k", &r); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Get in missing bucket: %v, want ErrNotFound", err)
	}
	if err := s.Delete("b", "k1"); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete("b", "k1"); err != nil {
		t.Fatalf("second delete: %v", err)
	}
	s.Close()

	// Records survive reopening.
	s, err = Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var keys []string
	err = s.Each("b", func(k string, raw json.RawMessage) error {
		var r rec
		if err := json.Unmarshal(raw, &r); err != nil {
			return err
		}
		keys = append(keys, k+"="+r.Name)
		return nil
	})
	if err != nil || len(keys) != 1 || keys[0] != "k2=two" {
		t.Fatalf("Each = %v, %v", keys, err)
	}
}

// crash abandons s as a kill -9 would: nothing journaled is folded (what
// is in the page cache stays, as it does for a killed process).
func crash(t *testing.T, s *Store) {
	t.Helper()
	s.jmu.Lock()
	s.closed = true
	if s.folding != nil {
		s.folding.Stop()
	}
	s.jmu.Unlock()
	close(s.syncs)
	<-s.syncerDone
	s.journal.Close()
	if err := s.db.Close(); err != nil {
		t.Fatal(err)
	}
}

func getN(t *testing.T, s *Store, key string) int {
	t.Helper()
	var r rec
	err := s.Get("b", key, &r)
	if errors.Is(err, errdefs.ErrNotFound) {
		return -1
	}
	if err != nil {
		t.Fatal(err)
	}
	return r.N
}

// TestPutNowSurvivesACrash: a record PutNow or PutQuick returned is there
// after the process's crash that left it in the journal only; one a later Delete removed (or
// a later Put replaced) is not brought back by the journal; and an entry
// torn by the crash is dropped with what follows it.
func TestPutNowSurvivesACrash(t *testing.T) {
	path := filepath.Join(t.TempDir(), "db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	// No timed fold may run before the crash below: under load one
	// could, and fold what the test means to leave in the journal.
	s.foldDelay = time.Hour
	for i, k := range []string{"a", "b", "c", "d"} {
		put := s.PutNow
		if i%2 == 1 {
			put = s.PutQuick
		}
		if err := put("b", k, rec{k, i}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Delete("b", "b"); err != nil {
		t.Fatal(err)
	}
	if err := s.Put("b", "c", rec{"c", 30}); err != nil {
		t.Fatal(err)
	}
	// After the fold the file is rewound: this entry overwrites the
	// first, and the stale ones after it must not be replayed.
	if err := s.PutNow("b", "e", rec{"e", 4}); err != nil {
		t.Fatal(err)
	}
	if got := getN(t, s, "e"); got != 4 {
		t.Fatalf("Get of a journaled record = %d", got)
	}
	if err := s.PutQuick("b", "f", rec{"f", 5}); err != nil {
		t.Fatal(err)
	}
	off := s.off
	crash(t, s)
	// Tear the last entry.
	f, err := os.OpenFile(path+".journal", os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte{0xff}, off-1); err != nil {
		t.Fatal(err)
	}
	f.Close()

	s, err = Open(path)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int{"a": 0, "b": -1, "c": 30, "d": 3, "e": 4, "f": -1}
	for k, n := range want {
		if got := getN(t, s, k); got != n {
			t.Errorf("after the crash %s = %d, want %d", k, got, n)
		}
	}
	// And again after a clean close: everything is in the database.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if s, err = Open(path); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var keys []string
	s.Each("b", func(k string, _ json.RawMessage) error { keys = append(keys, k); return nil })
	if fmt.Sprint(keys) != "[a c d e]" {
		t.Fatalf("Each = %v", keys)
	}
}

// TestPutNowFoldsAndEach: journaled records are folded into the database
// in the background, and Each lists them before and after.
func TestPutNowFoldsAndEach(t *testing.T) {
	s, err := Open(filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Put("b", "x", rec{"x", 1}); err != nil {
		t.Fatal(err)
	}
	if err := s.PutNow("b", "y", rec{"y", 2}); err != nil {
		t.Fatal(err)
	}
	list := func() string {
		var keys []string
		s.Each("b", func(k string, _ json.RawMessage) error { keys = append(keys, k); return nil })
		return fmt.Sprint(keys)
	}
	if got := list(); got != "[x y]" {
		t.Fatalf("Each = %s", got)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		s.jmu.Lock()
		n := len(s.pending)
		s.jmu.Unlock()
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the journal was not folded")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if f, err := s.folded(); err != nil || f != s.seq {
		t.Fatalf("folded %d, %v; want %d", f, err, s.seq)
	}
}

// TestConcurrentWritesCommitTogether: Puts and Deletes from many
// goroutines at once, which share group commits, are each done when they
// return: the database, reopened, has every Put not deleted after it.
func TestConcurrentWritesCommitTogether(t *testing.T) {
	path := filepath.Join(t.TempDir(), "db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	const n = 64
	var wg sync.WaitGroup
	errs := make(chan error, 2*n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := fmt.Sprintf("k%02d", i)
			if err := s.Put("b", key, rec{key, i}); err != nil {
				errs <- err
				return
			}
			if i%2 == 0 {
				errs <- s.Delete("b", key)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	s.Close()

	s, err = Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got := 0
	if err := s.Each("b", func(k string, raw json.RawMessage) error {
		var r rec
		if err := json.Unmarshal(raw, &r); err != nil {
			return err
		}
		if r.N%2 == 0 || r.Name != k {
			t.Errorf("record %s = %+v survived, or is not its own", k, r)
		}
		got++
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if got != n/2 {
		t.Fatalf("%d records after reopening, want %d", got, n/2)
	}
}

// BenchmarkConcurrentPutDelete: 8 writers at once, each a Put then a
// Delete of its own key (a sandbox's record and its removal).
func BenchmarkConcurrentPutDelete(b *testing.B) {
	s, err := Open(filepath.Join(b.TempDir(), "db"))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	b.SetParallelism(8)
	var seq atomic.Int64
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			key := fmt.Sprint(seq.Add(1))
			if err := s.Put("b", key, rec{key, 1}); err != nil {
				b.Fatal(err)
			}
			if err := s.Delete("b", key); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestDeleteQuick: a key DeleteQuick removed is gone at once (Get, Each),
// stays gone after the process's crash that left the deletion in the
// journal only, and a later write of the same key brings it back; a
// missing key's deletion is no error.
func TestDeleteQuick(t *testing.T) {
	path := filepath.Join(t.TempDir(), "db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	// No timed fold may run before the crash below: under load one
	// could, and fold what the test means to leave in the journal.
	s.foldDelay = time.Hour
	for i, k := range []string{"a", "b"} {
		if err := s.Put("b", k, rec{k, i}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.PutQuick("b", "c", rec{"c", 2}); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"a", "c", "missing"} {
		if err := s.DeleteQuick("b", k); err != nil {
			t.Fatalf("DeleteQuick(%s): %v", k, err)
		}
	}
	list := func(s *Store) string {
		var keys []string
		if err := s.Each("b", func(k string, _ json.RawMessage) error { keys = append(keys, k); return nil }); err != nil {
			t.Fatal(err)
		}
		return fmt.Sprint(keys)
	}
	for k, n := range map[string]int{"a": -1, "b": 1, "c": -1} {
		if got := getN(t, s, k); got != n {
			t.Errorf("before the fold %s = %d, want %d", k, got, n)
		}
	}
	if got := list(s); got != "[b]" {
		t.Errorf("Each = %s, want [b]", got)
	}
	// Journaled after a fold (Each folds): the crash below leaves
	// these in the journal only.
	if err := s.DeleteQuick("b", "b"); err != nil {
		t.Fatal(err)
	}
	if err := s.PutQuick("b", "a", rec{"a", 10}); err != nil {
		t.Fatal(err)
	}
	crash(t, s)
	if s, err = Open(path); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for k, n := range map[string]int{"a": 10, "b": -1, "c": -1} {
		if got := getN(t, s, k); got != n {
			t.Errorf("after the crash %s = %d, want %d", k, got, n)
		}
	}
	if got := list(s); got != "[a]" {
		t.Errorf("Each after the crash = %s, want [a]", got)
	}
}

// TestFoldLetsEntriesGo: once folded, the journal's entries are not
// kept alive by the store: their keys (the ids of removed sandboxes) were
// kept by the backing array of the pending entries, each pinning a page
// of the heap after a thousand removals (issue 21).
func TestFoldLetsEntriesGo(t *testing.T) {
	s, err := Open(filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.foldDelay = time.Hour // folded below, by the test
	var keys []weak.Pointer[byte]
	for i := range 3 {
		// On the heap, and larger than the tiny allocator's blocks, so
		// that each key is an object of its own.
		k := fmt.Sprintf("sandbox-key-%d-%s", i, strings.Repeat("x", 32))
		keys = append(keys, weak.Make(unsafe.StringData(k)))
		if err := s.DeleteQuick("b", k); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.fold(nil); err != nil {
		t.Fatal(err)
	}
	runtime.GC()
	runtime.GC()
	for i, k := range keys {
		if k.Value() != nil {
			t.Errorf("key %d is still alive after its entry was folded", i)
		}
	}
}

// TestRelease: the pages of the database that reads mapped leave the
// process's RSS, and the records read the same afterwards.
func TestRelease(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc/self/smaps")
	}
	path := filepath.Join(t.TempDir(), "db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const n = 200
	pad := strings.Repeat("x", 10000)
	for i := range n {
		if err := s.Put("b", fmt.Sprint(i), rec{pad, i}); err != nil {
			t.Fatal(err)
		}
	}
	each := func() int {
		t.Helper()
		seen := 0
		if err := s.Each("b", func(string, json.RawMessage) error { seen++; return nil }); err != nil {
			t.Fatal(err)
		}
		return seen
	}
	each()
	before := mappedRSS(t, path)
	if before < 1<<20 {
		t.Fatalf("%d bytes of the database mapped after reading %d records of 10 KB: the test reads too little", before, n)
	}
	if err := s.Release(); err != nil {
		t.Fatal(err)
	}
	after := mappedRSS(t, path)
	if after > before/10 {
		t.Errorf("after Release %d bytes of the database stay mapped, %d before", after, before)
	}
	t.Logf("mapped and resident: %d bytes before Release, %d after", before, after)
	if got := each(); got != n {
		t.Errorf("%d records after Release, want %d", got, n)
	}
	var r rec
	if err := s.Get("b", "123", &r); err != nil || r.N != 123 {
		t.Errorf("Get after Release = %+v, %v", r, err)
	}
}

// mappedRSS is the resident size of the process's mappings of path.
func mappedRSS(t *testing.T, path string) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/smaps")
	if err != nil {
		t.Fatal(err)
	}
	var rss int64
	in := false
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		switch {
		case len(f) >= 5 && strings.Contains(f[0], "-"):
			in = len(f) == 6 && f[5] == path
		case in && f[0] == "Rss:":
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			rss += kb << 10
		}
	}
	return rss
}
