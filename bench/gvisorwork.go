package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/paddock-dev/paddock/api"
)

// Issue 23, bars 2 and 5: the same work in a native and a gvisor sandbox of
// one daemon, side by side.
const (
	workRounds     = 5
	workGetpids    = 200_000
	workRepoDirs   = 100 // × workRepoFiles files: the 10k-file repository
	workRepoFiles  = 100
	workRequests   = 200
	workStreamSize = 256 << 20
	workExecs      = 20 // exec round trips of `true` per round
	workTimeout    = time.Minute
	workDeadline   = 12 * time.Minute
)

// workGetpid calls getpid argv[1] times and prints how long the loop took,
// in seconds: the interpreter's start is not in it.
const workGetpid = `import os, sys, time
g, n = os.getpid, int(sys.argv[1])
t = time.perf_counter()
for _ in range(n):
    g()
print(time.perf_counter() - t)
`

// workHTTP starts `python3 -m http.server` on loopback, waits until it
// answers, then times argv[1] GETs of a small file from this process, each
// on a new connection, and prints the loop's time in seconds.
const workHTTP = `import os, subprocess, sys, time, urllib.request
os.makedirs("/tmp/www", exist_ok=True)
open("/tmp/www/ok", "w").write("ok\n")
srv = subprocess.Popen([sys.executable, "-m", "http.server", "8765", "--bind", "127.0.0.1", "--directory", "/tmp/www"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
try:
    url = "http://127.0.0.1:8765/ok"
    for _ in range(600):
        try:
            urllib.request.urlopen(url).read()
            break
        except OSError:
            time.sleep(0.05)
    n = int(sys.argv[1])
    t = time.perf_counter()
    for _ in range(n):
        with urllib.request.urlopen(url) as r:
            if r.read() != b"ok\n":
                sys.exit("bad answer")
    print(time.perf_counter() - t)
finally:
    srv.kill()
    srv.wait()
`

// workRepo makes /tmp/repo: a git repository of workRepoDirs × workRepoFiles
// small files, all committed.
var workRepo = fmt.Sprintf(`set -e
rm -rf /tmp/repo
mkdir /tmp/repo
cd /tmp/repo
git init -q
python3 -c 'import os
for d in range(%d):
    os.mkdir("d%%d" %% d)
    for f in range(%d):
        open("d%%d/f%%d" %% (d, f), "w").write("%%d %%d\n" %% (d, f))'
git add -A
git -c user.name=bench -c user.email=bench@localhost commit -qm files
`, workRepoDirs, workRepoFiles)

// workRow is one kind of work: sample takes one round's samples of it in
// one sandbox.
type workRow struct {
	name   string
	short  string // its name in the bars
	bar    int    // issue 23's bar it serves: 2 or 5
	stream bool   // samples are the time to stream workStreamSize bytes
	sample func(ctx context.Context, id string) ([]time.Duration, error)
}

func (r *rig) workRows() []workRow {
	one := func(f func(ctx context.Context, id string) (time.Duration, error)) func(context.Context, string) ([]time.Duration, error) {
		return func(ctx context.Context, id string) ([]time.Duration, error) {
			d, err := f(ctx, id)
			return []time.Duration{d}, err
		}
	}
	return []workRow{
		{bar: 2, short: "getpid", name: fmt.Sprintf("getpid ×%d (python3 loop, in-process clock)", workGetpids), sample: one(func(ctx context.Context, id string) (time.Duration, error) {
			return r.workPrinted(ctx, id, "python3", "-c", workGetpid, strconv.Itoa(workGetpids))
		})},
		{bar: 2, short: "git status", name: fmt.Sprintf("`git status` of a %d-file repository", workRepoDirs*workRepoFiles), sample: one(func(ctx context.Context, id string) (time.Duration, error) {
			return r.workWall(ctx, id, "git", "-C", "/tmp/repo", "status", "--porcelain")
		})},
		{bar: 2, short: "imports", name: "`python3 -c 'import json, http.server, email, asyncio, decimal'`", sample: one(func(ctx context.Context, id string) (time.Duration, error) {
			return r.workWall(ctx, id, "python3", "-c", "import json, http.server, email, asyncio, decimal")
		})},
		{bar: 2, short: "HTTP", name: fmt.Sprintf("%d HTTP GETs to `python3 -m http.server` on loopback (urllib, in-process clock)", workRequests), sample: one(func(ctx context.Context, id string) (time.Duration, error) {
			return r.workPrinted(ctx, id, "python3", "-c", workHTTP, strconv.Itoa(workRequests))
		})},
		{bar: 5, short: "exec", name: "exec round trip of `true` (Go SDK)", sample: func(ctx context.Context, id string) ([]time.Duration, error) {
			return r.execTrues(ctx, id, workExecs)
		}},
		{bar: 5, short: "stream", name: fmt.Sprintf("`head -c %d /dev/zero` streamed through exec", workStreamSize), stream: true, sample: one(r.workStream)},
	}
}

// benchGvisorWork runs the same work in a native and a gvisor sandbox
// (issue 23, bars 2 and 5).
func benchGvisorWork(ctx context.Context, r *rig) *section {
	s := &section{}
	if gvisorArgs() == nil {
		s.Skip = "PADDOCK_RUNSC is not set (make bench builds runsc and sets it)"
		return s
	}
	rows := r.workRows()
	s.Method = []string{
		fmt.Sprintf("One daemon, two sandboxes made beforehand with the default image (the host's /usr), limits and disk: one `native`, one `gvisor` (runsc, systrap). In each, untimed: a git repository of %d files (%d directories of %d, committed) at /tmp/repo. "+
			"Then %d timed rounds after one warm-up round; each round runs every row in both sandboxes, one after the other, the order of the two alternating by round. Ratios are the gvisor median ÷ the native median (of times: above 1 is slower).", workRepoDirs*workRepoFiles, workRepoDirs, workRepoFiles, workRounds),
		"**wall** rows: the clock runs around `client.Exec` (request, the process's start and run in the sandbox, exit status back). **in-process clock** rows: the Python program times its own loop (`time.perf_counter`) and prints it, so the interpreter's start is not in them.",
		fmt.Sprintf("**getpid**: `os.getpid()` %d times. **git status**: `git -C /tmp/repo status --porcelain` (must print nothing). **imports**: the interpreter's start and its imports. **HTTP**: the program starts `python3 -m http.server` on 127.0.0.1 (a second process), waits until it answers, then times %d `urllib` GETs of a 3-byte file, a new connection each.", workGetpids, workRequests),
		fmt.Sprintf("**exec** (bar 5): %d round trips of `true` per round. **stream** (bar 5): `head -c %d /dev/zero` into a byte-counting writer, timed around the Exec; MB/s = 10^6 bytes/s.", workExecs, workStreamSize),
	}
	native, gvisor := map[string][]time.Duration{}, map[string][]time.Duration{}
	s.Err = r.withSandbox(ctx, api.CreateRequest{}, func(nid string) error {
		return r.withSandbox(ctx, api.CreateRequest{Runtime: "gvisor"}, func(gid string) error {
			for _, id := range []string{nid, gid} {
				sctx, cancel := context.WithTimeout(ctx, 2*opTimeout)
				err := r.exec(sctx, id, nil, "sh", "-c", workRepo)
				cancel()
				if err != nil {
					return fmt.Errorf("making the repository: %w", err)
				}
			}
			for i := 0; i < workRounds+1; i++ {
				tiers := []struct {
					id  string
					out map[string][]time.Duration
				}{{nid, native}, {gid, gvisor}}
				if i%2 == 1 {
					tiers[0], tiers[1] = tiers[1], tiers[0]
				}
				for _, row := range rows {
					for _, t := range tiers {
						r.idle(ctx)
						ds, err := row.sample(ctx, t.id)
						if err != nil {
							return fmt.Errorf("%s, round %d: %w", row.name, i+1, err)
						}
						if i > 0 {
							t.out[row.name] = append(t.out[row.name], ds...)
						}
					}
				}
				r.log.Info("gvisorwork round done", "round", i+1)
			}
			return nil
		})
	})
	workTable(s, rows, native, gvisor)
	return s
}

// workPrinted runs cmd, which prints a time in seconds, and returns it.
func (r *rig) workPrinted(ctx context.Context, id string, cmd ...string) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, workTimeout)
	defer cancel()
	var out strings.Builder
	if err := r.exec(ctx, id, &out, cmd...); err != nil {
		return 0, err
	}
	sec, err := strconv.ParseFloat(strings.TrimSpace(out.String()), 64)
	if err != nil {
		return 0, fmt.Errorf("%s printed %q, want seconds", cmd[0], truncate(out.String(), 100))
	}
	return time.Duration(sec * float64(time.Second)), nil
}

// workWall times cmd around the Exec call; it must print nothing.
func (r *rig) workWall(ctx context.Context, id string, cmd ...string) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, workTimeout)
	defer cancel()
	var out strings.Builder
	t0 := time.Now()
	err := r.exec(ctx, id, &out, cmd...)
	d := time.Since(t0)
	if err == nil && out.Len() > 0 {
		err = fmt.Errorf("%s printed %q, want nothing", cmd[0], truncate(out.String(), 100))
	}
	return d, err
}

// workStream times `head -c workStreamSize /dev/zero` through exec.
func (r *rig) workStream(ctx context.Context, id string) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, workTimeout)
	defer cancel()
	cw := &countWriter{}
	t0 := time.Now()
	err := r.exec(ctx, id, cw, "head", "-c", strconv.Itoa(workStreamSize), "/dev/zero")
	d := time.Since(t0)
	if err == nil && cw.n != workStreamSize {
		err = fmt.Errorf("head delivered %d bytes, want %d", cw.n, workStreamSize)
	}
	return d, err
}

func workTable(s *section, rows []workRow, native, gvisor map[string][]time.Duration) {
	t := table{Header: []string{"work", "n", "native median", "gvisor median", "gvisor ÷ native", "native p90", "gvisor p90"}}
	var b2, b5 []string
	for _, row := range rows {
		n, g := summarize(native[row.name]), summarize(gvisor[row.name])
		if n.N == 0 || g.N == 0 {
			continue
		}
		show := ms
		if row.stream {
			show = func(d time.Duration) string { return fmt.Sprintf("%.0f MB/s", mbps(workStreamSize, d)) }
		}
		t.add(row.name, fmt.Sprint(min(n.N, g.N)), show(n.Median), show(g.Median), ratio(g.Median, n.Median), show(n.P90), show(g.P90))
		v := fmt.Sprintf("%s %s (%s vs %s)", row.short, ratio(g.Median, n.Median), show(g.Median), show(n.Median))
		if row.bar == 5 {
			b5 = append(b5, v)
		} else {
			b2 = append(b2, v)
		}
	}
	s.Tables = append(s.Tables, t)
	s.Bars = append(s.Bars,
		workBar("syscall-heavy work, gvisor ÷ native, medians (getpid loop, git status of 10k files, Python imports, local HTTP loop)", b2),
		workBar("exec round trip and streaming throughput, gvisor beside native, medians", b5))
}

func workBar(what string, values []string) bar {
	b := bar{Issue: 23, What: what, Target: "reported", Value: noPeerValue, Verdict: notMeasured}
	if len(values) > 0 {
		b.Value, b.Verdict = strings.Join(values, "; "), reported
	}
	return b
}
