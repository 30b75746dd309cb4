package execlog

import (
	"strconv"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/wire"
	"golang.org/x/sys/unix"
)

// BenchmarkFirstExec is the churn loop's share of the exec log: a fresh
// sandbox's first exec writes 3 bytes of output and exits, then the
// sandbox is removed. Run it under `strace -f -c` to count the files it
// makes (openat with O_CREAT, mkdirat) and removes.
func BenchmarkFirstExec(b *testing.B) {
	s, err := Open(Config{Dir: b.TempDir(), MinFree: -1})
	if err != nil {
		b.Fatal(err)
	}
	cmd := []string{"echo", "hi"}
	b.ReportAllocs()
	before := cpuTime()
	for i := 0; b.Loop(); i++ {
		id := "sbx-" + strconv.Itoa(i)
		w, err := s.Start(id, "", 1, cmd, time.Now())
		if err != nil {
			b.Fatal(err)
		}
		if err := w.Write(wire.Stdout, []byte("hi\n")); err != nil {
			b.Fatal(err)
		}
		if err := w.Finish(api.ExitStatus{}); err != nil {
			b.Fatal(err)
		}
		if err := s.Remove(id); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(cpuTime()-before)/float64(b.N), "cpu-ns/op")
}

// cpuTime is the process's user and system CPU time.
func cpuTime() time.Duration {
	var ru unix.Rusage
	unix.Getrusage(unix.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
