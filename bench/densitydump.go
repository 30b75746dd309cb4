package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	paddockd "github.com/paddock-dev/paddock/internal/daemon"
)

// densityDump, if set, is a directory where the density section leaves
// the daemon's memory maps (/proc/PID/smaps, smaps_rollup, status) and
// its Go runtime's counters (the go_* lines of its Prometheus
// exposition) at each reading: before, with the sandboxes, after their
// removal. They say which mappings hold the daemon's RSS (issue 21).
var densityDump string

// densityPprof adds the daemon's heap and goroutine profiles to the dump,
// through its debug socket; that socket samples the heap 128 times as
// often, which costs the daemon memory of its own, so the RSS of such a
// run is not the bar's.
var densityPprof bool

// dumpMemory writes the daemon's maps and counters for the reading
// named at; errors only leave a file out.
func (r *rig) dumpMemory(ctx context.Context, at string) {
	if densityDump == "" {
		return
	}
	if err := os.MkdirAll(densityDump, 0o755); err != nil {
		r.log.Warn("density dump", "err", err)
		return
	}
	pid := r.daemon.pid()
	for _, f := range []string{"smaps", "smaps_rollup", "status"} {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/%s", pid, f))
		if err == nil {
			err = os.WriteFile(filepath.Join(densityDump, at+"."+f), b, 0o644)
		}
		if err != nil {
			r.log.Warn("density dump", "file", f, "err", err)
		}
	}
	if densityPprof {
		sock := filepath.Join(r.root, "run", paddockd.DebugSocket)
		for _, p := range []struct{ query, file string }{{"heap?gc=1", "heap.pb.gz"}, {"goroutine?debug=1", "goroutines.txt"}} {
			if err := saveProfile(ctx, sock, p.query, filepath.Join(densityDump, at+"."+p.file)); err != nil {
				r.log.Warn("density dump", "profile", p.query, "err", err)
			}
		}
	}
	b, err := r.client.Prometheus(ctx)
	if err != nil {
		r.log.Warn("density dump", "err", err)
		return
	}
	var gos []string
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "go_") || strings.HasPrefix(line, "process_") {
			gos = append(gos, line)
		}
	}
	os.WriteFile(filepath.Join(densityDump, at+".metrics"), []byte(strings.Join(gos, "\n")+"\n"), 0o644)
}
