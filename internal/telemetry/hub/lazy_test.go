package hub

import (
	"testing"

	"github.com/paddock-dev/paddock/internal/telemetry/metrics"
)

// countedReader is a cgroup reader that counts its reads and closes.
type countedReader struct{ reads, closes int }

func (c *countedReader) ReadCgroup(r *metrics.Reading) error {
	c.reads++
	r.Pids = 7
	return nil
}

func (c *countedReader) Close() error {
	c.closes++
	return nil
}

// TestLazyCgroupOpensOnFirstRead: a sandbox's cgroup files are opened by
// its first sample, not when it starts; one gone before that opens
// nothing, and none is opened after Close.
func TestLazyCgroupOpensOnFirstRead(t *testing.T) {
	opens := 0
	cr := &countedReader{}
	open := func() metrics.CgroupReader { opens++; return cr }

	l := &lazyCgroup{open: open}
	if err := l.Close(); err != nil || opens != 0 {
		t.Fatalf("closed before a read: err %v, opened %d times", err, opens)
	}
	if err := l.ReadCgroup(&metrics.Reading{}); err == nil || opens != 0 {
		t.Fatalf("a read after Close: err %v, opened %d times", err, opens)
	}

	l = &lazyCgroup{open: open}
	if opens != 0 {
		t.Fatal("opened before a read")
	}
	var r metrics.Reading
	for range 3 {
		if err := l.ReadCgroup(&r); err != nil {
			t.Fatal(err)
		}
	}
	if opens != 1 || cr.reads != 3 || r.Pids != 7 {
		t.Fatalf("three reads: opened %d times, %d reads, pids %d", opens, cr.reads, r.Pids)
	}
	if mem, pids := l.Has(); !mem || !pids || l.LocalOOM() {
		t.Errorf("a reader that is not partial: Has %v %v, LocalOOM %v", mem, pids, l.LocalOOM())
	}
	if err := l.Close(); err != nil || cr.closes != 1 {
		t.Fatalf("Close: err %v, %d closes", err, cr.closes)
	}
}
