package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/client"
	"github.com/paddock-dev/paddock/internal/exitprog"
	"github.com/paddock-dev/paddock/internal/guestapi"
)

const (
	execWarmup     = 20
	execMinSamples = 200
	peerWarmup     = 3
	execBarIssue2  = 5 * time.Millisecond
	execBarIssue3  = 2 * time.Millisecond

	rowExecSDK   = "paddock exec (Go SDK)"
	rowExecCLI   = "paddock exec (CLI process)"
	rowRuncExec  = "runc exec"
	rowBwrapTrue = "bwrap, cold run of /bin/true (context)"
	rowFloor     = "floor: fork+exec+wait of /bin/true, no sandbox"
)

// execRow is one line of the round-trip table: how to take one sample.
type execRow struct {
	name   string
	n      int
	warmup int
	sample func(ctx context.Context) (time.Duration, error)
}

// benchExec measures an exec round trip of `true` in a sandbox that is
// already running, and its peers. Each row runs as its own block, so that
// the short paddock samples are not interleaved with process spawns.
func benchExec(ctx context.Context, r *rig) *section {
	s := &section{}
	n := max(execMinSamples, r.opts.n)
	s.Method = execMethod(n, r.opts.n)
	samples := map[string][]time.Duration{}
	err := r.withSandbox(ctx, api.CreateRequest{}, func(id string) error {
		rows := []execRow{
			{rowExecSDK, n, execWarmup, func(ctx context.Context) (time.Duration, error) { return r.execTrue(ctx, id) }},
			{rowExecCLI, r.opts.n, peerWarmup, func(ctx context.Context) (time.Duration, error) {
				return timeRun(ctx, []string{r.opts.bin, "--host", r.daemon.host, "exec", id, "--", "true"})
			}},
		}
		rows = append(rows, execRow{rowFloor, n, execWarmup, func(context.Context) (time.Duration, error) { return forkExecTrue() }})
		if r.bwrap != "" {
			rows = append(rows, execRow{rowBwrapTrue, r.opts.n, peerWarmup, func(ctx context.Context) (time.Duration, error) {
				return timeRun(ctx, bwrapArgv(r.bwrap, "/bin/true"))
			}})
		}
		if err := r.runRows(ctx, rows, samples); err != nil {
			return err
		}
		return r.pairedShare(ctx, s, n, id)
	})
	var session, files table
	if err == nil {
		session, err = r.sessions(ctx)
	}
	if err == nil {
		files, err = r.fileSessions(ctx)
	}
	if err == nil && r.runc != nil {
		err = r.withRuncSleeper(ctx, func(id string) error {
			return r.runRows(ctx, []execRow{{rowRuncExec, r.opts.n, peerWarmup, func(ctx context.Context) (time.Duration, error) {
				return timeRun(ctx, r.runc.argv("exec", id, "true"))
			}}}, samples)
		})
	}
	s.Err = err
	execTable(s, samples)
	for _, t := range []table{session, files} {
		if len(t.Rows) > 0 {
			s.Tables = append(s.Tables, t)
		}
	}
	s.Bars = execBars(samples[rowExecSDK])
	return s
}

func execMethod(n, peers int) []string {
	return []string{
		fmt.Sprintf("**paddock exec (Go SDK)**: %d samples after %d warm-ups, in one sandbox created beforehand. The clock runs "+
			"around `client.Exec(ctx, id, {Cmd: [true]}, ExecIO{})`: request, start in the sandbox, exit status back.", n, execWarmup),
		fmt.Sprintf("**paddock exec (CLI process)**: `paddock --host … exec ID -- true` as a child process, fork/exec to reaped exit; "+
			"%d samples after %d warm-ups.", peers, peerWarmup),
		fmt.Sprintf("**runc exec**: `runc exec ID true` into a container started with `runc run -d` running `sleep 3600` "+
			"(same bundle as the cold table), fork/exec to reaped exit; %d samples after %d warm-ups.", peers, peerWarmup),
		"**floor**: the harness itself forks and execs `/bin/true` (vfork, as the guest does) and reaps it, without any sandbox or RPC: " +
			"what the kernel alone costs on this machine for the process the round trip runs.",
		"**paddock over the floor** (a note under the table): SDK round trips and floor samples taken in alternation, so that both see the same minute; " +
			"the median of their differences is what paddock adds to the command.",
		"**with a minimal command** (a second note, x86-64 only): the same pairs with a 129-byte static program that only calls exit(0), " +
			"written into the sandbox and onto the host: the round trip and paddock's share when the command is not most of it.",
		"**bwrap**: bubblewrap has no exec into a running sandbox; a cold `bwrap … /bin/true` (same flags as the cold table) is shown for context.",
		"Ratios are this row's median ÷ the peer's median: below 1 is faster. p99 is nearest-rank on the sorted samples.",
		fmt.Sprintf("**A session** (the second table): %d sandboxes one after another, each created (untimed) and then given %d execs of "+
			"`echo hi` back to back through the one Go SDK client, which opens a lane bound to the sandbox behind its second exec; "+
			"the clock runs around each `client.Exec`. After the execs, the guest's VmRSS and thread count (host pid from `Get`) and the sandbox's memory cgroup's charge.",
			sessionSandboxes, sessionExecs),
		fmt.Sprintf("**A session with files** (the third table): %d sandboxes one after another, each created (untimed) and then taken through "+
			"%s of a script `/tmp/session.sh` holding `echo hi` (`WriteFile`, `Exec(sh /tmp/session.sh)`, `ReadFile`, `Stat`), back to back, the clock around each call. "+
			"The sandboxes are kept; what each guest holds is read right after its session, and again for all of them once %s "+
			"(the fast guest's helper's idle time and 2 s) have passed.", sessionSandboxes, strings.Join(fileSessionSteps, ", "), guestapi.HelperIdle+2*time.Second),
	}
}

// pairedShare takes n pairs of an SDK round trip and a floor sample, one
// right after the other, and notes the median of their differences: what
// paddock adds to the command in the same minute. The rows above run as
// blocks, a few seconds apart, and this VM's floor moves by half a
// millisecond between minutes. It does the same for a program that costs
// the kernel little (exitprog.ELF), when this machine can run it: what the
// round trip is when the command is not most of it.
func (r *rig) pairedShare(ctx context.Context, s *section, n int, id string) error {
	d, f, _, err := r.pairs(ctx, n, id, "true", "/bin/true")
	if err != nil {
		return err
	}
	s.note("paddock over the floor, paired (%d SDK round trips each followed by a floor sample; median of the differences): "+
		"%s (p90 %s), at a floor of %s in those pairs (each floor sample there runs right after an exec, while the daemon "+
		"may still be writing it to the exec log).", d.N, ms(d.Median), ms(d.P90), ms(f.Median))
	prog := exitprog.ELF()
	if prog == nil {
		return nil
	}
	host := filepath.Join(r.root, "noop")
	if err := os.WriteFile(host, prog, 0o755); err != nil {
		return err
	}
	const inBox = "/tmp/paddock-bench-noop"
	if _, err := r.client.WriteFile(ctx, id, inBox, bytes.NewReader(prog), client.WriteOptions{Mode: 0o755}); err != nil {
		return fmt.Errorf("writing the no-op program into the sandbox: %w", err)
	}
	d, f, trip, err := r.pairs(ctx, n, id, inBox, host)
	if err != nil {
		return err
	}
	s.note("the same pairs with a command that costs the kernel little (a %d-byte static program that only exits, "+
		"no loader, no libc): SDK round trip %s, floor (spawn and reap of the same program on the host) %s, paddock over "+
		"the floor %s (p90 %s).", len(prog), ms(trip.Median), ms(f.Median), ms(d.Median), ms(d.P90))
	return nil
}

// pairs takes n pairs of an SDK exec of cmd and a spawn of host on the
// host, after warm-ups: the differences and the floor samples.
func (r *rig) pairs(ctx context.Context, n int, id, cmd, host string) (diff, floor, trip summary, _ error) {
	r.idle(ctx)
	var diffs, floors, trips []time.Duration
	for i := 0; i < execWarmup+n; i++ {
		a, err := r.execCmd(ctx, id, cmd)
		if err != nil {
			return summary{}, summary{}, summary{}, fmt.Errorf("paired SDK sample %d: %w", i+1, err)
		}
		b, err := forkExec(host)
		if err != nil {
			return summary{}, summary{}, summary{}, fmt.Errorf("paired floor sample %d: %w", i+1, err)
		}
		if i >= execWarmup {
			diffs, floors, trips = append(diffs, a-b), append(floors, b), append(trips, a)
		}
	}
	return summarize(diffs), summarize(floors), summarize(trips), nil
}

// forkExecTrue times a bare fork, exec and wait of /bin/true.
func forkExecTrue() (time.Duration, error) { return forkExec("/bin/true") }

// forkExec times a bare fork, exec and wait of the program at path.
func forkExec(path string) (time.Duration, error) {
	null, err := os.Open(os.DevNull)
	if err != nil {
		return 0, err
	}
	defer null.Close()
	fd := null.Fd()
	t0 := time.Now()
	pid, err := syscall.ForkExec(path, []string{filepath.Base(path)}, &syscall.ProcAttr{Files: []uintptr{fd, fd, fd}})
	if err != nil {
		return 0, err
	}
	var ws syscall.WaitStatus
	if _, err := syscall.Wait4(pid, &ws, 0, nil); err != nil {
		return 0, err
	}
	return time.Since(t0), nil
}

// execTrue is one timed SDK exec round trip of `true`.
func (r *rig) execTrue(ctx context.Context, id string) (time.Duration, error) {
	return r.execCmd(ctx, id, "true")
}

// execTrues takes n timed SDK exec round trips of `true`; on an error,
// those taken so far.
func (r *rig) execTrues(ctx context.Context, id string, n int) ([]time.Duration, error) {
	var out []time.Duration
	for range n {
		d, err := r.execTrue(ctx, id)
		if err != nil {
			return out, err
		}
		out = append(out, d)
	}
	return out, nil
}

// execCmd is one timed SDK exec round trip of cmd.
func (r *rig) execCmd(ctx context.Context, id, cmd string) (time.Duration, error) {
	req := api.ExecRequest{Cmd: []string{cmd}}
	t0 := time.Now()
	st, err := r.client.Exec(ctx, id, req, client.ExecIO{})
	d := time.Since(t0)
	return d, execResult(req.Cmd, st, err, "")
}

// runRows takes each row's warm-ups and samples in turn.
func (r *rig) runRows(ctx context.Context, rows []execRow, samples map[string][]time.Duration) error {
	for _, row := range rows {
		r.idle(ctx)
		for i := 0; i < row.warmup+row.n; i++ {
			d, err := row.sample(ctx)
			if err != nil {
				return fmt.Errorf("%s, sample %d: %w", row.name, i+1, err)
			}
			if i >= row.warmup {
				samples[row.name] = append(samples[row.name], d)
			}
		}
		r.log.Info("exec round trip", "row", row.name, "samples", row.n)
	}
	return nil
}

// withSandbox creates a sandbox, runs f with its id and removes it, also
// when f fails.
func (r *rig) withSandbox(ctx context.Context, req api.CreateRequest, f func(id string) error) error {
	sb, err := r.create(ctx, req)
	if err != nil {
		return err
	}
	return errors.Join(f(sb.ID), r.removeAll([]string{sb.ID}))
}

// withRuncSleeper starts a detached runc container running `sleep 3600`,
// runs f with its id and deletes it.
func (r *rig) withRuncSleeper(ctx context.Context, f func(id string) error) error {
	id := r.runc.newID("sleep")
	dir, err := r.runc.bundle(id, []string{"sleep", "3600"})
	if err != nil {
		return err
	}
	defer func() {
		// A fresh context: the container must go also after an interrupt.
		dctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		defer cancel()
		if err := r.runc.remove(dctx, id); err != nil {
			r.log.Warn("removing runc container", "id", id, "err", err)
		}
		time.Sleep(50 * time.Millisecond)
		reapOrphans(r.daemon.pid())
	}()
	if err := runDetached(ctx, r.runc.argv("run", "-d", "--bundle", dir, id), dir); err != nil {
		return err
	}
	return f(id)
}

// runDetached runs a command whose children outlive it: they inherit its
// stdio, so stdout goes to /dev/null and stderr to a file, never to a pipe
// that would keep Wait waiting.
func runDetached(ctx context.Context, argv []string, dir string) error {
	errf, err := os.Create(filepath.Join(dir, "stderr"))
	if err != nil {
		return fmt.Errorf("making stderr file: %w", err)
	}
	defer errf.Close()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Stderr = errf
	if err := cmd.Run(); err != nil {
		msg, _ := os.ReadFile(errf.Name())
		return fmt.Errorf("running %v: %w (stderr: %s)", argv, err, truncate(string(msg), 300))
	}
	return nil
}

func execTable(s *section, samples map[string][]time.Duration) {
	runc, bwrap := summarize(samples[rowRuncExec]), summarize(samples[rowBwrapTrue])
	t := table{Header: []string{"tool", "n", "median", "p90", "p99", "÷ runc exec", "÷ bwrap /bin/true"}}
	for _, name := range []string{rowExecSDK, rowExecCLI, rowRuncExec, rowBwrapTrue, rowFloor} {
		if len(samples[name]) == 0 {
			continue
		}
		sm := summarize(samples[name])
		t.add(name, fmt.Sprint(sm.N), ms(sm.Median), ms(sm.P90), ms(sm.P99), ratio(sm.Median, runc.Median), ratio(sm.Median, bwrap.Median))
	}
	s.Tables = append(s.Tables, t)
}

func execBars(sdk []time.Duration) []bar {
	b2 := bar{Issue: 2, What: "exec round trip of `true`, median (Go SDK)", Target: "≤ 5 ms", Value: noPeerValue, Verdict: notMeasured}
	b3 := bar{Issue: 3, What: "exec round trip of `true`, median (Go SDK)", Target: "≤ 2 ms", Value: noPeerValue, Verdict: notMeasured}
	if len(sdk) > 0 {
		sm := summarize(sdk)
		v := fmt.Sprintf("%s (p99 %s)", ms(sm.Median), ms(sm.P99))
		b2.Value, b2.Verdict = v, check(sm.Median <= execBarIssue2)
		b3.Value, b3.Verdict = v, check(sm.Median <= execBarIssue3)
	}
	return []bar{b2, b3}
}
