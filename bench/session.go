package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/client"
	"github.com/paddock-dev/paddock/internal/guestapi"
)

// An agent's session: the first execs of a new sandbox, back to back,
// through one Go SDK client (which opens a lane bound to the sandbox
// behind its second exec, docs/exec.md), and what the sandbox's guest
// holds after them.
const (
	sessionSandboxes = 20
	sessionExecs     = 6
)

// sessions measures sessionSandboxes sessions of sessionExecs execs of
// `echo hi` each, and returns their table.
func (r *rig) sessions(ctx context.Context) (table, error) {
	lat := make([][]time.Duration, sessionExecs)
	var held guestHold
	for range sessionSandboxes {
		r.idle(ctx)
		err := r.withSandbox(ctx, api.CreateRequest{}, func(id string) error {
			for k := range sessionExecs {
				req := api.ExecRequest{Cmd: []string{"echo", "hi"}}
				t0 := time.Now()
				st, err := r.client.Exec(ctx, id, req, client.ExecIO{})
				lat[k] = append(lat[k], time.Since(t0))
				if err := execResult(req.Cmd, st, err, ""); err != nil {
					return fmt.Errorf("session exec %d: %w", k+1, err)
				}
			}
			got, _ := r.client.Get(ctx, id)
			held.read(got)
			return nil
		})
		if err != nil {
			return table{}, err
		}
	}
	t := table{Caption: fmt.Sprintf("A session: the first %d execs of `echo hi` in a new sandbox, back to back, one Go SDK client (%d sandboxes)", sessionExecs, sessionSandboxes),
		Header: []string{"exec", "median", "p90"}}
	for k, d := range lat {
		slices.Sort(d)
		t.add(strconv.Itoa(k+1), ms(median(d)), ms(percentile(d, 90)))
	}
	held.row(&t, "the guest after them (medians)")
	return t, nil
}

// fileSessionSteps is an agent's session that writes and reads files
// between its commands (the fast guest's helper serves the file ops).
var fileSessionSteps = []string{"write", "run", "read", "run", "write", "stat"}

// guestHold is what a sandbox's guest holds: its RSS and threads, and the
// sandbox's memory cgroup's charge.
type guestHold struct{ rss, threads, charge []int64 }

func (h *guestHold) read(sb *api.Sandbox) {
	if sb == nil || sb.Runtime == nil {
		return
	}
	b, err1 := procStatusBytes(sb.Runtime.HostPID, "VmRSS")
	n, err2 := procStatusCount(sb.Runtime.HostPID, "Threads")
	c, err3 := cgroupMemory(sb.Runtime.Cgroup)
	if err1 == nil && err2 == nil && err3 == nil {
		h.rss, h.threads, h.charge = append(h.rss, b), append(h.threads, n), append(h.charge, c)
	}
}

func (h *guestHold) row(t *table, what string) {
	if len(h.rss) == 0 {
		return
	}
	for _, s := range [][]int64{h.rss, h.threads, h.charge} {
		slices.Sort(s)
	}
	t.add(what, fmt.Sprintf("RSS %d KiB, %d threads, cgroup %d KiB", h.rss[len(h.rss)/2]>>10, h.threads[len(h.threads)/2], h.charge[len(h.charge)/2]>>10), "")
}

// fileSessions measures sessionSandboxes sessions of fileSessionSteps
// each, the sandboxes kept, then what their guests hold right after and
// once the helper's idle time has passed; and returns its table.
func (r *rig) fileSessions(ctx context.Context) (table, error) {
	lat := make([][]time.Duration, len(fileSessionSteps))
	var ids []string
	defer func() { r.removeAll(ids) }()
	var after, idle guestHold
	for range sessionSandboxes {
		r.idle(ctx)
		sb, err := r.create(ctx, api.CreateRequest{})
		if err != nil {
			return table{}, err
		}
		ids = append(ids, sb.ID)
		for k, step := range fileSessionSteps {
			t0 := time.Now()
			err := r.fileSessionStep(ctx, sb.ID, step)
			lat[k] = append(lat[k], time.Since(t0))
			if err != nil {
				return table{}, fmt.Errorf("file session step %d (%s): %w", k+1, step, err)
			}
		}
		got, _ := r.client.Get(ctx, sb.ID)
		after.read(got)
	}
	time.Sleep(guestapi.HelperIdle + 2*time.Second)
	for _, id := range ids {
		got, _ := r.client.Get(ctx, id)
		idle.read(got)
	}
	t := table{Caption: fmt.Sprintf("A session with files: %s of a script in a new sandbox, back to back, one Go SDK client (%d sandboxes)", strings.Join(fileSessionSteps, ", "), sessionSandboxes),
		Header: []string{"step", "median", "p90"}}
	for k, d := range lat {
		slices.Sort(d)
		t.add(strconv.Itoa(k+1)+" "+fileSessionSteps[k], ms(median(d)), ms(percentile(d, 90)))
	}
	after.row(&t, "the guest after them (medians)")
	idle.row(&t, fmt.Sprintf("the guest %s later (medians)", guestapi.HelperIdle+2*time.Second))
	return t, nil
}

// fileSessionStep runs one step of a file session in sandbox id.
func (r *rig) fileSessionStep(ctx context.Context, id, step string) error {
	const script = "/tmp/session.sh"
	switch step {
	case "write":
		_, err := r.client.WriteFile(ctx, id, script, strings.NewReader("echo hi\n"), client.WriteOptions{})
		return err
	case "read":
		rc, err := r.client.ReadFile(ctx, id, script)
		if err != nil {
			return err
		}
		defer rc.Close()
		b, err := io.ReadAll(rc)
		if err == nil && string(b) != "echo hi\n" {
			err = fmt.Errorf("read %q", b)
		}
		return err
	case "stat":
		_, err := r.client.Stat(ctx, id, script)
		return err
	}
	var out strings.Builder
	cmd := []string{"sh", script}
	st, err := r.client.Exec(ctx, id, api.ExecRequest{Cmd: cmd}, client.ExecIO{Stdout: &out})
	if err := execResult(cmd, st, err, ""); err != nil {
		return err
	}
	if out.String() != "hi\n" {
		return fmt.Errorf("output %q", out.String())
	}
	return nil
}
