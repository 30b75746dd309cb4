package sandbox

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/guestapi"
	"github.com/paddock-dev/paddock/internal/reqcheck"
	"github.com/paddock-dev/paddock/wire"
)

// A container's command is supervised: readiness checks gate the create's
// answer (waitReady), and a command that exits is restarted or not per
// its restart policy (supervise), its exit and last lines recorded in the
// container's status.

const (
	// readyTimeout is a readiness check's default timeout.
	readyTimeout = 60 * time.Second
	// maxReadyTimeout bounds what a spec may ask.
	maxReadyTimeout = time.Hour
	// restartBackoff is the first wait before a restart; it doubles up
	// to maxRestartBackoff, and starts again after a run of restartReset.
	restartBackoff    = time.Second
	maxRestartBackoff = 30 * time.Second
	restartReset      = time.Minute
	// lastLines is how many lines of a command's output its status keeps.
	lastLines = 20
)

// validateDependsOn checks the containers' depends_on: each names a
// container listed before it, once.
func validateDependsOn(cs []api.Container) error {
	before := map[string]bool{}
	for i, c := range cs {
		seen := map[string]bool{}
		for j, n := range c.DependsOn {
			field := fmt.Sprintf("containers[%d].depends_on[%d]", i, j)
			switch {
			case !before[n]:
				return errdefs.Invalid(field, "%q is not a container listed before %s", n, c.Name)
			case seen[n]:
				return errdefs.Invalid(field, "%q is named twice", n)
			}
			seen[n] = true
		}
		before[c.Name] = true
	}
	return nil
}

// validateSupervision checks container c's readiness check and restart
// policy (field names it).
func validateSupervision(field string, c api.Container) error {
	switch c.Restart {
	case "", api.RestartNo:
	case api.RestartOnFailure, api.RestartAlways:
		if len(c.Command) == 0 {
			return errdefs.Invalid(field+".restart", "restarts the command, and there is none")
		}
	default:
		return errdefs.Invalid(field+".restart", "%q is not no, on-failure or always", c.Restart)
	}
	r := c.Readiness
	if r == nil {
		return nil
	}
	switch {
	case (len(r.Exec) > 0) == (r.HTTP != ""):
		return errdefs.Invalid(field+".readiness", "want one of exec and http")
	case r.TimeoutSeconds < 0 || time.Duration(r.TimeoutSeconds)*time.Second > maxReadyTimeout:
		return errdefs.Invalid(field+".readiness.timeout_seconds", "%d is outside 0..%d", r.TimeoutSeconds, int(maxReadyTimeout/time.Second))
	case r.HTTP != "":
		if _, _, err := httpCheck(r.HTTP); err != nil {
			return fmt.Errorf("%s.readiness.http: %w", field, err)
		}
	default:
		exec := api.ExecRequest{Cmd: r.Exec}
		if err := reqcheck.Exec(&exec); err != nil {
			return fmt.Errorf("%s.readiness.exec: %w", field, err)
		}
	}
	return nil
}

// httpCheck splits an HTTP check, "PORT/PATH" ("8080/healthz", "5432").
func httpCheck(s string) (port int, path string, err error) {
	p, path, _ := strings.Cut(s, "/")
	port, err = strconv.Atoi(p)
	if err != nil || port < 1 || port > 65535 || strings.ContainsAny(path, " \r\n\x00") || len(path) > 1024 {
		return 0, "", errdefs.Invalid("http", "%q is not PORT/PATH", s)
	}
	return port, "/" + path, nil
}

// restarts reports whether policy restarts a command that ended with st.
func restarts(policy string, st *api.ExitStatus) bool {
	switch policy {
	case api.RestartAlways:
		return true
	case api.RestartOnFailure:
		return st == nil || st.ExitCode != 0 || st.Signal != ""
	}
	return false
}

// describeExit says how a command ended, for errors and events.
func describeExit(st *api.ExitStatus) string {
	switch {
	case st == nil:
		return "ended"
	case st.OOMKilled:
		return "was killed out of memory"
	case st.Signal != "":
		return "was killed by " + st.Signal
	case st.Error != "":
		return "ended: " + st.Error
	}
	return fmt.Sprintf("exited with status %d", st.ExitCode)
}

// guestOf is container i of b's guest client (nil when it runs none).
// b.mu is held.
func (b *box) guestOf(i int) *guestapi.Client {
	if i == 0 {
		return b.guest
	}
	if i-1 < len(b.members) && b.members[i-1] != nil {
		return b.members[i-1].guest
	}
	return nil
}

// outputTail keeps the last bytes a command wrote.
type outputTail struct{ b []byte }

func (t *outputTail) Write(p []byte) {
	const keep = 8 << 10
	t.b = append(t.b, p...)
	if len(t.b) > keep {
		t.b = append(t.b[:0], t.b[len(t.b)-keep:]...)
	}
}

// lines are the last lastLines lines of what it kept.
func (t *outputTail) lines() []string {
	s := strings.TrimRight(string(bytes.ToValidUTF8(t.b, []byte("?"))), "\n")
	if s == "" {
		return nil
	}
	ls := strings.Split(s, "\n")
	return ls[max(0, len(ls)-lastLines):]
}

// follow reads a process stream until its exit, keeping the tail of its
// output.
func follow(conn *guestapi.Conn, tail *outputTail) (*api.ExitStatus, error) {
	for {
		f, err := conn.Frames.Read()
		if err != nil {
			return nil, err
		}
		switch f.Type {
		case wire.Stdout, wire.Stderr:
			tail.Write(f.Payload)
		case wire.Exit:
			var st api.ExitStatus
			if err := json.Unmarshal(f.Payload, &st); err != nil {
				return nil, err
			}
			return &st, nil
		case wire.Error:
			return nil, fmt.Errorf("process stream: %s", f.Payload)
		}
	}
}

// closeOn closes conn when ctx ends, until the returned stop is called.
func closeOn(ctx context.Context, conn *guestapi.Conn) (stop func() bool) {
	return context.AfterFunc(ctx, func() { conn.Close() })
}

// exitOf waits for process pid of gc to end and returns how, with its
// last lines.
func exitOf(ctx context.Context, gc *guestapi.Client, pid int) (*api.ExitStatus, []string, error) {
	conn, err := gc.AttachQuiet(ctx, pid, 0)
	if err != nil {
		return nil, nil, err
	}
	defer conn.Close()
	defer closeOn(ctx, conn)()
	var tail outputTail
	st, err := follow(conn, &tail)
	return st, tail.lines(), err
}

// startServices starts each container's command in order, recording its
// pid; a container with depends_on once those it names pass their
// readiness checks. Then it waits for every check not yet passed, each
// within its timeout from its container's start; a command that ends
// meanwhile is restarted per its policy, or fails the call, which names
// the container and its check. b.mu is held: nothing else starts or
// records the commands meanwhile.
func (m *Manager) startServices(ctx context.Context, b *box) error {
	cs := b.rec.Containers
	started := make([]time.Time, len(cs))
	ready := make([]bool, len(cs))
	waitFor := func(j int) error {
		if ready[j] {
			return nil
		}
		ready[j] = true
		if cs[j].Readiness == nil {
			return nil
		}
		return m.readyOne(ctx, b, j, started[j].Add(readyTimeoutOf(&cs[j])))
	}
	index := make(map[string]int, len(cs))
	for i := range cs {
		index[cs[i].Name] = i
	}
	for i := range cs {
		c := &cs[i]
		for _, dep := range c.DependsOn {
			if err := waitFor(index[dep]); err != nil {
				return fmt.Errorf("container %s depends on %s: %w", c.Name, dep, err)
			}
		}
		started[i] = time.Now()
		c.PID = 0
		if len(c.Command) == 0 {
			continue
		}
		pid, err := b.guestOf(i).Start(ctx, &guestapi.StartRequest{Cmd: c.Command, Env: guestapi.EnvList(nil), User: c.User})
		if err != nil {
			return fmt.Errorf("starting container %s's command: %w", c.Name, err)
		}
		c.PID = pid
	}
	for j := range cs {
		if err := waitFor(j); err != nil {
			return err
		}
	}
	return nil
}

// readyOne waits until container i of b passes its readiness check, or
// deadline.
func (m *Manager) readyOne(ctx context.Context, b *box, i int, deadline time.Time) error {
	c := &b.rec.Containers[i]
	gc := b.guestOf(i)
	// Checks start 10 ms apart and back off to readyPoll: a service that
	// starts in a second (postgres) is seen within readyPoll of it, not a
	// second later.
	delay := 10 * time.Millisecond
	for {
		if c.PID != 0 {
			if pi, err := gc.Process(ctx, c.PID); err == nil && !pi.Running {
				st, lines, _ := exitOf(ctx, gc, c.PID)
				if st == nil {
					st = pi.Exit
				}
				c.Exit, c.LastLines = st, lines
				if !restarts(c.Restart, st) || !time.Now().Before(deadline) {
					return errdefs.New(errdefs.ErrUnavailable, "container %s is not ready: its command %s; its last lines:\n%s",
						c.Name, describeExit(st), strings.Join(lines, "\n"))
				}
				c.Restarts++
				if c.PID, err = gc.Start(ctx, &guestapi.StartRequest{Cmd: c.Command, Env: guestapi.EnvList(nil), User: c.User}); err != nil {
					return fmt.Errorf("restarting container %s's command: %w", c.Name, err)
				}
			}
		}
		left := time.Until(deadline)
		ok, why := check(ctx, gc, c.Readiness, min(max(left, time.Second), 10*time.Second))
		if ok {
			return nil
		}
		if left = time.Until(deadline); left <= 0 {
			return errdefs.New(errdefs.ErrUnavailable, "container %s is not ready after %s: %s",
				c.Name, readyTimeoutOf(c), why)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(min(delay, left)):
		}
		delay = min(2*delay, readyPoll)
	}
}

// readyPoll is the longest wait between two readiness checks.
const readyPoll = 200 * time.Millisecond

// readyTimeoutOf is container c's readiness timeout.
func readyTimeoutOf(c *api.ContainerStatus) time.Duration {
	if c.Readiness.TimeoutSeconds > 0 {
		return time.Duration(c.Readiness.TimeoutSeconds) * time.Second
	}
	return readyTimeout
}

// check runs readiness check r once in gc's container, for at most
// limit, and says why it failed.
func check(ctx context.Context, gc *guestapi.Client, r *api.Readiness, limit time.Duration) (bool, string) {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	if r.HTTP != "" {
		port, path, _ := httpCheck(r.HTTP)
		conn, err := gc.DialPort(ctx, port)
		if err != nil {
			return false, fmt.Sprintf("GET localhost:%d%s: %v", port, path, err)
		}
		defer conn.Close()
		if d, ok := ctx.Deadline(); ok {
			conn.SetDeadline(d)
		}
		req, _ := http.NewRequest(http.MethodGet, "http://localhost"+path, nil)
		req.Header.Set("User-Agent", "paddock-readiness")
		req.Close = true
		if err := req.Write(conn); err != nil {
			return false, fmt.Sprintf("GET localhost:%d%s: %v", port, path, err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(conn), req)
		if err != nil {
			return false, fmt.Sprintf("GET localhost:%d%s: %v", port, path, err)
		}
		resp.Body.Close()
		if resp.StatusCode >= 400 {
			return false, fmt.Sprintf("GET localhost:%d%s: %s", port, path, resp.Status)
		}
		return true, ""
	}
	_, conn, err := gc.StartAttached(ctx, &guestapi.StartRequest{Cmd: r.Exec, Env: guestapi.EnvList(nil),
		TimeoutSeconds: int64((limit + time.Second - 1) / time.Second)})
	if err != nil {
		return false, fmt.Sprintf("exec %q: %v", r.Exec, err)
	}
	defer conn.Close()
	defer closeOn(ctx, conn)()
	var tail outputTail
	st, err := follow(conn, &tail)
	switch {
	case err != nil:
		return false, fmt.Sprintf("exec %q: %v", r.Exec, err)
	case st.ExitCode != 0 || st.Signal != "" || st.Error != "":
		return false, fmt.Sprintf("exec %q %s: %s", r.Exec, describeExit(st), strings.Join(tail.lines(), "\n"))
	}
	return true, ""
}

// superviseAll supervises every running command of b's containers.
// b.mu is held.
func (m *Manager) superviseAll(b *box) {
	for i, c := range b.rec.Containers {
		if gc := b.guestOf(i); c.PID != 0 && gc != nil && c.State == api.StateRunning {
			m.supervise(b, i, gc, c.PID)
		}
	}
}

// supervise follows container i's command, process pid of gc: when it
// ends, its exit and last lines are recorded, and it is started again
// after a backoff if the container's policy says so; otherwise a failure
// marks the container failed. It stops following once the command is no
// longer the container's (the sandbox stopped, the guest changed).
func (m *Manager) supervise(b *box, i int, gc *guestapi.Client, pid int) {
	ctx, cancel := m.untilClosed()
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		defer cancel()
		streak, started := 0, time.Now()
		ours := func() bool {
			return b.rec.State == api.StateRunning && b.rec.Containers[i].PID == pid && b.guestOf(i) == gc
		}
		for {
			st, lines, err := exitOf(ctx, gc, pid)
			if err != nil {
				return // the guest ended, or the daemon stops
			}
			b.mu.Lock()
			if !ours() {
				b.mu.Unlock()
				return
			}
			c := &b.rec.Containers[i]
			c.Exit, c.LastLines = st, lines
			again := restarts(c.Restart, st)
			name := c.Name
			if !again {
				c.PID = 0
				if st.ExitCode != 0 || st.Signal != "" {
					c.State, c.Error = api.StateFailed, "its command "+describeExit(st)
				}
				m.persistLocked(b)
				m.notify(b).Event(b.rec.ID, "lifecycle", "container "+name+"'s command "+describeExit(st), map[string]any{"container": name, "exit": st})
				b.mu.Unlock()
				return
			}
			if time.Since(started) >= restartReset {
				streak = 0
			}
			wait := min(restartBackoff<<min(streak, 5), maxRestartBackoff)
			streak++
			c.Restarts++
			m.persistLocked(b)
			m.notify(b).Event(b.rec.ID, "lifecycle", "container "+name+"'s command "+describeExit(st)+"; restarting", map[string]any{"container": name, "exit": st, "in": wait.String()})
			b.mu.Unlock()
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
			b.mu.Lock()
			if !ours() {
				b.mu.Unlock()
				return
			}
			c = &b.rec.Containers[i]
			npid, err := gc.Start(ctx, &guestapi.StartRequest{Cmd: c.Command, Env: guestapi.EnvList(nil), User: c.User})
			if err != nil {
				c.PID, c.State, c.Error = 0, api.StateFailed, "restarting its command: "+err.Error()
				m.persistLocked(b)
				b.mu.Unlock()
				return
			}
			c.PID, pid, started = npid, npid, time.Now()
			m.persistLocked(b)
			b.mu.Unlock()
		}
	}()
}
