package gateway

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/egress"
)

// filesGateway is a Gateway with no network: enough for its per-sandbox
// files.
func filesGateway(tb testing.TB, dir string) *Gateway {
	tb.Helper()
	if err := os.MkdirAll(filepath.Join(dir, "resolv"), 0o700); err != nil {
		tb.Fatal(err)
	}
	return &Gateway{cfg: Config{Dir: dir}, cas: map[string]*egress.CA{}, denials: map[string][]egress.Event{},
		bundle: []byte("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")}
}

// BenchmarkSandboxFiles is what one sandbox's create and delete cost the
// gateway's files (Attach and Forget without the network), with the
// self tree's first write. cpu-ns/op is the process's user and system
// CPU per op (the kernel's inode work is system time).
func BenchmarkSandboxFiles(b *testing.B) {
	g := filesGateway(b, b.TempDir())
	host := netip.MustParseAddr("10.247.0.1")
	v := api.Self{Policy: api.Policy{}, Denials: []api.Denial{}}
	b.ReportAllocs()
	cpu0 := cpuTime()
	for i := 0; b.Loop(); i++ {
		id := fmt.Sprintf("sbx-%d", i)
		ca, err := g.prepare(id)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := g.writeFiles(id, ca, host); err != nil {
			b.Fatal(err)
		}
		v.Sandbox = id
		g.writeSelf(id, v, &selfTree{written: map[string]uint64{}}, time.Now())
		g.mu.Lock()
		delete(g.cas, id)
		g.mu.Unlock()
		g.removeFiles(id)
	}
	b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N), "cpu-ns/op")
}

// cpuTime is the process's user and system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
