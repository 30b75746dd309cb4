package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/paddock-dev/paddock/client"
)

// diskOvercommit is the daemon's --disk-overcommit (its maximum): how far
// its thin disks' capacity may exceed the host's free space.
const diskOvercommit = 100

const (
	daemonStartTimeout = 30 * time.Second
	// daemonStopTimeout: a daemon waits for its pending teardowns before
	// it exits.
	daemonStopTimeout = time.Minute
)

// daemon is the private `paddock serve` the benchmarks run against.
type daemon struct {
	bin     string
	host    string // unix:///.../paddock.sock
	args    []string
	logPath string
	client  *client.Client

	cmd     *exec.Cmd
	exited  chan struct{}
	waitErr error // set before exited is closed
}

// newDaemon describes a daemon whose state, run directory and socket are
// under root, whose sandboxes live under cgroupParent and get host uids from
// uidStart; extra are more flags of `paddock serve`.
func newDaemon(bin, root, cgroupParent string, uidStart uint32, extra ...string) (*daemon, error) {
	sock := filepath.Join(root, "paddock.sock")
	d := &daemon{
		bin:     bin,
		host:    "unix://" + sock,
		logPath: filepath.Join(root, "daemon.log"),
		args: []string{"serve",
			"--state-dir", filepath.Join(root, "state"),
			"--run-dir", filepath.Join(root, "run"),
			"--listen", "unix://" + sock,
			"--cgroup-parent", cgroupParent,
			"--uid-start", fmt.Sprint(uidStart),
			// Thin disks, promised up to the daemon's limit beyond the
			// host's free space: the bench's sandboxes write a few MiB
			// each. Fifty 10 GiB disks and the pools' then need 6 GiB
			// free.
			"--disk-overcommit", fmt.Sprint(diskOvercommit),
			"--log-level", logLevel(),
		},
	}
	d.args = append(d.args, extra...)
	c, err := client.New(d.host)
	if err != nil {
		return nil, fmt.Errorf("making client: %w", err)
	}
	d.client = c
	return d, nil
}

// start starts the daemon and waits until it answers.
func (d *daemon) start(ctx context.Context) error {
	logf, err := os.OpenFile(d.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("opening daemon log: %w", err)
	}
	defer logf.Close()
	// Not CommandContext: the daemon must outlive an interrupt so that the
	// sandboxes can be removed through it. Its own process group keeps a
	// terminal's ^C away from it.
	cmd := exec.Command(d.bin, d.args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting %s serve: %w", d.bin, err)
	}
	d.cmd = cmd
	d.exited = make(chan struct{})
	go func() {
		d.waitErr = cmd.Wait()
		close(d.exited)
	}()
	if err := d.waitReady(ctx); err != nil {
		d.stop()
		return err
	}
	return nil
}

func (d *daemon) waitReady(ctx context.Context) error {
	deadline := time.Now().Add(daemonStartTimeout)
	for {
		vctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := d.client.Version(vctx)
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-d.exited:
			return fmt.Errorf("daemon exited while starting (%v): %s", d.waitErr, d.logTail(10))
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("daemon did not answer within %s (%v): %s", daemonStartTimeout, err, d.logTail(10))
		}
	}
}

// running reports whether the daemon process is alive.
func (d *daemon) running() bool {
	if d.cmd == nil {
		return false
	}
	select {
	case <-d.exited:
		return false
	default:
		return true
	}
}

func (d *daemon) pid() int { return d.cmd.Process.Pid }

// stop asks the daemon to exit and kills it if it does not. It leaves
// sandboxes running, as the daemon does by design.
func (d *daemon) stop() error {
	if !d.running() {
		return nil
	}
	d.client.Close()
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("signalling daemon: %w", err)
	}
	select {
	case <-d.exited:
	case <-time.After(daemonStopTimeout):
		d.cmd.Process.Kill()
		<-d.exited
		return fmt.Errorf("daemon ignored SIGTERM for %s and was killed", daemonStopTimeout)
	}
	if d.waitErr != nil {
		return fmt.Errorf("daemon exited badly: %w", d.waitErr)
	}
	return nil
}

// kill sends the daemon SIGKILL, as a crash would, and waits until it is
// gone. Its sandboxes and helpers are left as the kill left them.
func (d *daemon) kill() {
	if !d.running() {
		return
	}
	d.cmd.Process.Kill()
	<-d.exited
}

// rss is the daemon's resident set size.
func (d *daemon) rss() (int64, error) { return procStatusBytes(d.pid(), "VmRSS") }

// logTail returns the last n lines of the daemon's log, on one line.
func (d *daemon) logTail(n int) string {
	b, err := os.ReadFile(d.logPath)
	if err != nil {
		return "(no daemon log)"
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " ⏎ ")
}

// daemonLogSummary is what the daemon logged above info level.
type daemonLogSummary struct {
	Path     string // where the log was kept, if it was
	Warnings int
	Errors   int
	Lines    []string // the first few
}

const maxLogLines = 12

func summarizeLog(path string) (daemonLogSummary, error) {
	s := daemonLogSummary{}
	f, err := os.Open(path)
	if err != nil {
		return s, fmt.Errorf("reading daemon log: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.Contains(line, "level=WARN"):
			s.Warnings++
		case strings.Contains(line, "level=ERROR"):
			s.Errors++
		default:
			continue
		}
		if len(s.Lines) < maxLogLines {
			s.Lines = append(s.Lines, truncate(line, 400))
		}
	}
	return s, sc.Err()
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

func (s daemonLogSummary) write(b *strings.Builder) {
	b.WriteString("## Daemon log\n\n")
	if s.Warnings+s.Errors == 0 {
		b.WriteString("The daemon logged no warning or error during the run.\n\n")
		return
	}
	fmt.Fprintf(b, "The daemon logged %d warning(s) and %d error(s) during the run", s.Warnings, s.Errors)
	if s.Path != "" {
		fmt.Fprintf(b, " (full log kept at `%s`)", s.Path)
	}
	b.WriteString(". The first ones:\n\n```\n")
	for _, l := range s.Lines {
		b.WriteString(l + "\n")
	}
	b.WriteString("```\n\n")
}

// logLevel is the daemon's log level: $PADDOCK_BENCH_LOG_LEVEL, or info.
// At debug the daemon logs the phases of each build and start, and the
// log is kept after the run.
func logLevel() string {
	if l := os.Getenv("PADDOCK_BENCH_LOG_LEVEL"); l != "" {
		return l
	}
	return "info"
}
