// Package s3test runs a real S3-compatible object store for tests:
// SeaweedFS's `weed server -s3` (scripts/s3-bins.sh builds it), on
// loopback ports, with its data in a temporary directory.
package s3test

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/internal/deathsig"
	"github.com/paddock-dev/paddock/internal/freeport"
)

// Keys every test store takes.
const (
	AccessKey = "paddock"
	SecretKey = "paddock-secret"
)

// Server is a running store.
type Server struct {
	// Endpoint is its S3 URL, http://127.0.0.1:PORT.
	Endpoint string
	Dir      string
	cmd      *exec.Cmd
	done     <-chan struct{} // closed once cmd has exited and is reaped
	args     []string
	weed     string
	// sockets are the unix sockets weed makes in /tmp whatever its flags
	// say (its services' gRPC, named by port), left there when it is
	// killed: Stop removes them.
	sockets []string
}

// Bin is the weed binary: $PADDOCK_S3_BIN (the directory s3-bins.sh
// --print-dir names) or the repository's cache; "" if it is not built.
func Bin() string {
	dir := os.Getenv("PADDOCK_S3_BIN")
	if dir == "" {
		out, err := exec.Command(filepath.Join(repoRoot(), "scripts", "s3-bins.sh"), "--print-dir").Output()
		if err != nil {
			return ""
		}
		dir = string(out[:len(out)-1])
	}
	p := filepath.Join(dir, "weed")
	if _, err := os.Stat(p); err != nil {
		return ""
	}
	return p
}

func repoRoot() string {
	wd, _ := os.Getwd()
	for d := wd; d != "/"; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "scripts", "s3-bins.sh")); err == nil {
			return d
		}
	}
	return wd
}

// Start runs a store for t, stopped at t's end; t is skipped when weed
// is not built (make s3-bins).
func Start(t testing.TB) *Server {
	t.Helper()
	weed := Bin()
	if weed == "" {
		t.Skip("weed is not built: run make s3-bins (or set PADDOCK_S3_BIN)")
	}
	dir := t.TempDir()
	s, err := start(weed, dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s
}

// Run starts a store with its data under dir (the bench's way in); the
// caller stops it.
func Run(dir string) (*Server, error) {
	weed := Bin()
	if weed == "" {
		return nil, fmt.Errorf("weed is not built: run make s3-bins (or set PADDOCK_S3_BIN)")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	return start(weed, dir)
}

func start(weed, dir string) (*Server, error) {
	ports, err := freeport.Ports(8)
	if err != nil {
		return nil, err
	}
	cfg := filepath.Join(dir, "s3.json")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`{"identities":[{"name":"paddock","credentials":[{"accessKey":%q,"secretKey":%q}],"actions":["Admin","Read","Write","List","Tagging"]}]}`, AccessKey, SecretKey)), 0o600); err != nil {
		return nil, err
	}
	data := filepath.Join(dir, "data")
	if err := os.MkdirAll(data, 0o700); err != nil {
		return nil, err
	}
	p := func(i int) string { return strconv.Itoa(ports[i]) }
	// -logtostderr and -filer.localSocket: weed writes its log files and
	// the filer's socket to /tmp otherwise.
	args := []string{"-logtostderr", "server", "-dir=" + data, "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
		"-master.port=" + p(1), "-master.port.grpc=" + p(2), "-master.telemetry=false", "-master.volumeSizeLimitMB=1024",
		"-volume.port=" + p(3), "-volume.port.grpc=" + p(4), "-volume.max=0",
		"-filer", "-filer.port=" + p(5), "-filer.port.grpc=" + p(6), "-filer.localSocket=" + filepath.Join(dir, "filer.sock"),
		"-s3", "-s3.port=" + p(0), "-s3.port.grpc=" + p(7), "-s3.port.iceberg=0", "-s3.port.lance=0",
		"-s3.config=" + cfg, "-s3.localSocket=" + filepath.Join(dir, "s3.sock")}
	s := &Server{Endpoint: "http://127.0.0.1:" + p(0), Dir: dir, args: args, weed: weed}
	for svc, i := range map[string]int{"master": 2, "volume": 4, "filer": 6, "s3": 7} {
		s.sockets = append(s.sockets, fmt.Sprintf("/tmp/seaweedfs-%s-grpc-%s.sock", svc, p(i)))
	}
	return s, s.run()
}

// run starts weed and waits until its S3 port answers.
func (s *Server) run() error {
	logf, err := os.OpenFile(filepath.Join(s.Dir, "weed.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(s.weed, s.args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// It dies with the test binary (deathsig: not when the thread that
	// started it ends, as other tests' namespace work ends threads).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	done, err := deathsig.Start(cmd)
	if err != nil {
		return err
	}
	s.cmd, s.done = cmd, done
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := http.Get(s.Endpoint + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode < 500 {
				return nil
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	s.Stop()
	log, _ := os.ReadFile(filepath.Join(s.Dir, "weed.log"))
	if len(log) > 4000 {
		log = log[len(log)-4000:]
	}
	return fmt.Errorf("weed did not serve S3 at %s in 60 s:\n%s", s.Endpoint, log)
}

// Stop ends the store (its data stays in Dir until the test ends).
func (s *Server) Stop() {
	if s.cmd == nil {
		return
	}
	syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
	<-s.done
	s.cmd = nil
	for _, path := range s.sockets {
		if st, err := os.Lstat(path); err == nil && st.Mode()&os.ModeSocket != 0 {
			os.Remove(path)
		}
	}
}

// Restart starts a stopped store again on the same ports and data.
func (s *Server) Restart() error {
	s.Stop()
	return s.run()
}
