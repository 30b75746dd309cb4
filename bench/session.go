package main

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/client"
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
	var rss, threads []int64
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
			if got, err := r.client.Get(ctx, id); err == nil && got.Runtime != nil {
				b, err1 := procStatusBytes(got.Runtime.HostPID, "VmRSS")
				n, err2 := procStatusCount(got.Runtime.HostPID, "Threads")
				if err1 == nil && err2 == nil {
					rss, threads = append(rss, b), append(threads, n)
				}
			}
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
	slices.Sort(rss)
	slices.Sort(threads)
	if len(rss) > 0 {
		t.add("the guest after them: RSS, threads (medians)", fmt.Sprintf("%d KiB", rss[len(rss)/2]>>10), strconv.FormatInt(threads[len(threads)/2], 10))
	}
	return t, nil
}
