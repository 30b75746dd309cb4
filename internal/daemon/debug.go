package daemon

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"path/filepath"
	goruntime "runtime"
	"time"
)

// DebugSocket is the unix socket in the run dir that serves the Go
// runtime's profiles when the daemon runs with Config.Debug.
const DebugSocket = "debug.sock"

// serveDebug serves net/http/pprof's handlers on DebugSocket, readable by
// root alone, and turns on the mutex and block profiles (which cost a
// little on every contended lock and blocking operation: off unless asked
// for). It is never on a TCP port: profiles show the daemon's memory,
// where secrets and sandbox output pass. stop closes the listener.
func serveDebug(runDir string, log *slog.Logger) (stop func(), err error) {
	return ServeDebug(filepath.Join(runDir, DebugSocket), log)
}

// ServeDebug serves the profiles (as serveDebug) on the unix socket path;
// a cluster gateway's --debug-socket.
func ServeDebug(path string, log *slog.Logger) (stop func(), err error) {
	os.Remove(path)
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return nil, err
	}
	// A heap sample every 4 KiB rather than 512: per-sandbox structures
	// are small, and the density work counts them (issue 21).
	goruntime.MemProfileRate = 4096
	goruntime.SetMutexProfileFraction(5)
	goruntime.SetBlockProfileRate(int(100 * time.Microsecond))
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := hs.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Warn("debug listener", "err", err)
		}
	}()
	log.Info("serving profiles", "addr", "unix://"+path)
	return func() {
		hs.Close()
		os.Remove(path)
	}, nil
}
