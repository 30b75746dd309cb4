// Command bench is `make bench`. It starts a private paddock daemon from
// $PADDOCK_BIN, measures it side by side with bubblewrap and runc doing the
// same work, and writes medians, percentiles, ratios and the issues' bars
// (PASS or FAIL) to a markdown file, BENCHMARKS.md by default. It removes
// every sandbox, container, mount and cgroup it made, also after an error
// or an interrupt, and reports any it found left behind.
//
//	PADDOCK_BIN=bin/paddock go run ./bench -n 50 -out BENCHMARKS.md
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"github.com/paddock-dev/paddock/internal/durable"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// options are the command-line flags.
type options struct {
	n           int
	out         string
	bin         string
	baseline    string   // a second paddock binary to compare with; "" for none
	baselineRev string   // the revision baseline was built from, if known
	only        []string // benchmark names; empty means all
	keepGoing   bool
	args        []string // as given, for the reproduce line
}

// benchmark is one named benchmark; it reports into a section.
type benchmark struct {
	name  string // as given to -only
	title string
	run   func(ctx context.Context, r *rig) *section
}

// namedOnly are the benchmarks that run only when -only names them:
// their rows are part of another benchmark's.
var namedOnly = []string{"gvisormem"}

func allBenchmarks() []benchmark {
	return []benchmark{
		{"cold", "Cold create → first output of `echo hi`", benchCold},
		{"gvisor", "gvisor create → first output of `echo hi`: through a pool, without one, and a bare runsc run; a memory pause of 512 MiB", benchGvisor},
		{"gvisormem", "A memory pause of a gvisor sandbox holding 512 MiB (the gvisor section's rows alone)", benchGvisorMem},
		{"gvisorwork", "gVisor beside native: syscall-heavy work, exec round trip and streaming in one sandbox of each", benchGvisorWork},
		{"gvisorfork", fmt.Sprintf("Fork ×%d of a gvisor sandbox running a process that holds %d MiB, processes kept", memForkCount, memForkHeld>>20), benchGvisorFork},
		{"exec", "exec round trip of `true` in a running sandbox", benchExec},
		{"churn", "Churn: concurrent create → exec → delete loops", benchChurn},
		{"burst", fmt.Sprintf("Burst: %d creates at once, each → first output of `echo hi`", burstSize), benchBurst},
		{"delete", "Delete: the answer, the release of every part, and kill -9 during deletes", benchDelete},
		{"refill", "Refill: exec round trip while another client drains the pool", benchRefill},
		{"density", fmt.Sprintf("%d idle sandboxes, each running `sleep 3600`", densityCount), benchDensity},
		{"stream", "Streaming through exec", benchStream},
		{"files", "File upload and download through the files API", benchFiles},
		{"telemetry", "Telemetry: metrics collection cost and resize latency", benchTelemetry},
		{"template", "Create from a template, through a warm pool and without one", benchTemplate},
		{"snapshot", "Snapshot of a sandbox that wrote 1 GiB", benchSnapshot},
		{"postgres", "Three containers with a PostgreSQL service: create, exec, snapshot with postgres writing", benchPostgres},
		{"resume", "Resume of a paused sandbox → first exec output", benchResume},
		{"fork", fmt.Sprintf("Fork ×%d of a sandbox holding 1 GiB", forkCount), benchFork},
		{"gateway", "Through a cluster gateway: exec, create → first output and a 1 GiB stream against the daemon direct", benchGateway},
		{"simnodes", fmt.Sprintf("Control-plane headroom: creates through one gateway to 1, 10 and %d simulated nodes", simNodes), benchSimNodes},
		{"cluster", "A cluster on this host (3 nodes, 2 gateways, kube-apiserver): placement, kill -9 of a node and of a gateway", benchCluster},
		{"archive", "Archive: a paused sandbox with 1 GiB archived to an object store, resumed on another node after its own is gone", benchArchive},
		{"e2b", "E2B SDK: create + run('echo hi') + kill, against the native API", benchE2B},
		{"egress", "HTTPS through the egress proxy", benchEgress},
		{"console", fmt.Sprintf("Web console page loads in headless Chromium with %d sandboxes", consoleSandboxes), benchConsole},
		{"baseline", "This build against a baseline binary, in alternating blocks", benchBaseline},
	}
}

func benchmarkNames() []string {
	var names []string
	for _, b := range allBenchmarks() {
		names = append(names, b.name)
	}
	return names
}

func parseFlags(args []string) (options, error) {
	o := options{args: args}
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.IntVar(&o.n, "n", 50, "timed iterations per tool (warm-ups excluded); exec round trips take max(n, 200)")
	fs.StringVar(&o.out, "out", "BENCHMARKS.md", "markdown file to write")
	fs.StringVar(&o.bin, "bin", os.Getenv("PADDOCK_BIN"), "paddock binary (default $PADDOCK_BIN)")
	fs.StringVar(&o.baseline, "baseline", "", "a second paddock binary (the previous main, say) compared with -bin in alternating blocks")
	fs.StringVar(&o.baselineRev, "baseline-rev", "", "the revision -baseline was built from (make bench BASE=REV sets it), for the reproduce line")
	only := fs.String("only", "", "comma-separated benchmarks to run: "+strings.Join(benchmarkNames(), ","))
	fs.DurationVar(&churnTime, "churn-time", churnTime, "how long each churn loop runs")
	fs.StringVar(&simProfile, "gateway-profile", "", "write a CPU profile (pprof) of the gateway during the simnodes section's closed loop to its 100 nodes to this file")
	fs.StringVar(&churnProfile, "churn-profile", "", "serve the daemon's profiles and write its CPU, mutex and block profiles (pprof) over the default-image churn loop to this path (+.mutex, +.block)")
	fs.DurationVar(&clusterSoak, "cluster-soak", clusterSoak, "how long the cluster section's create loops go on after the killed node is seen lost")
	fs.StringVar(&densityDump, "density-dump", "", "write the daemon's memory maps and Go runtime counters at each of the density section's readings to this directory")
	fs.BoolVar(&densityPprof, "density-pprof", false, "with -density-dump, serve the daemon's profiles and add its heap and goroutine profiles to the dump (this costs the daemon memory: not for the bar's numbers)")
	fs.IntVar(&densityCount, "density", densityCount, "sandboxes the density benchmark starts (issue 21's bar is for 1000)")
	fs.BoolVar(&o.keepGoing, "keep-going", false, "run the remaining benchmarks after one fails")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	if densityCount < 2 {
		return o, fmt.Errorf("-density must be at least 2, got %d", densityCount)
	}
	if o.n < 1 {
		return o, fmt.Errorf("-n must be at least 1, got %d", o.n)
	}
	if o.bin == "" {
		return o, errors.New("no paddock binary: set PADDOCK_BIN or -bin (make bench does)")
	}
	if *only != "" {
		for _, name := range strings.Split(*only, ",") {
			name = strings.TrimSpace(name)
			if !slices.Contains(benchmarkNames(), name) {
				return o, fmt.Errorf("-only: unknown benchmark %q (have %s)", name, strings.Join(benchmarkNames(), ", "))
			}
			o.only = append(o.only, name)
		}
	}
	return o, nil
}

func (o options) selected(name string) bool { return len(o.only) == 0 || slices.Contains(o.only, name) }

// command is the line that reproduces this run: `make bench` when it
// was run as the Makefile runs it.
func (o options) command() string {
	if len(o.args) == 0 || slices.Equal(o.args, []string{"-out", "BENCHMARKS.md"}) {
		return "make bench"
	}
	if o.baselineRev != "" && slices.Equal(o.args, []string{"-out", "BENCHMARKS.md", "-baseline", o.baseline, "-baseline-rev", o.baselineRev}) {
		return "make bench BASE=" + o.baselineRev
	}
	return "make build && PADDOCK_BIN=$PWD/bin/paddock go run ./bench " + strings.Join(o.args, " ")
}

func main() {
	maybeSimNodes()
	opts, err := parseFlags(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	// Signals are caught for the whole run, so a second ^C cannot cut the
	// cleanup short.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err = runBench(ctx, opts, log)
	switch {
	case ctx.Err() != nil:
		log.Error("interrupted; cleaned up", "err", err)
		os.Exit(130)
	case err != nil:
		log.Error("bench failed", "err", err)
		os.Exit(1)
	}
}

// runBench sets up, runs the selected benchmarks, cleans up and writes the
// report, which says what failed: a benchmark error or a failed cleanup is
// an error, a missed bar is not.
func runBench(ctx context.Context, opts options, log *slog.Logger) error {
	if os.Geteuid() != 0 {
		return errors.New("bench must run as root: it starts a paddock daemon, bwrap and runc")
	}
	// Processes whose parents exit (guests of a dead daemon, detached
	// containers) become ours, so that the cleanup can reap them.
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("becoming a child subreaper: %w", err)
	}
	rep := &report{Started: time.Now(), Command: opts.command(), BusyBefore: hostBusy(time.Second)}
	r, err := newRig(ctx, opts, log)
	if err != nil {
		return fmt.Errorf("setting up: %w", err)
	}
	defer r.close(true) // a no-op after the close below; here for panics
	rep.Machine = r.machine(ctx)

	runErr := runSelected(ctx, r, opts, rep)
	log.Info("cleaning up")
	rep.Cleanup = r.close(runErr != nil || logLevel() == "debug")
	return errors.Join(runErr, finishReport(rep, opts, log))
}

// settleAfter is the pause between the cleanup and the check for other
// work on the host.
const settleAfter = 3 * time.Second

// finishReport completes the report after the cleanup and writes it. A
// cleanup that found leftovers is an error.
func finishReport(rep *report, opts options, log *slog.Logger) error {
	rep.DaemonLog = rep.Cleanup.Log
	rep.Finished = time.Now()
	// The kernel finishes tearing down loop devices and cgroups after the
	// cleanup returns; give it a moment before looking for other work.
	time.Sleep(settleAfter)
	rep.BusyAfter = hostBusy(time.Second)
	rep.Machine = append(rep.Machine,
		[2]string{"host CPU used by other work", fmt.Sprintf("%s in the second before the run, %s in a second %s after it",
			percent(rep.BusyBefore), percent(rep.BusyAfter), settleAfter)},
		[2]string{"load average at end (raised by the run itself)", loadAvg()})
	if err := durable.Replace(opts.out, []byte(rep.markdown()), 0o644); err != nil {
		return err
	}
	log.Info("wrote report", "file", opts.out)
	summarizeBars(log, rep)
	if n := len(rep.Cleanup.Problems); n > 0 {
		return fmt.Errorf("cleanup found %d problem(s); see %s", n, opts.out)
	}
	return nil
}

// benchTimeout bounds one benchmark, so that a hung stream cannot hang
// the run; with the defaults each takes well under a minute.
const benchTimeout = 5 * time.Minute

// deadline bounds benchmark name: benchTimeout, or longer for those
// whose work is long by design.
func deadline(name string) time.Duration {
	switch name {
	case "churn": // its loops, the pools' refills between them
		return 2*churnTime + 2*peerChurnTime() + 3*time.Minute
	case "density":
		return densityTimeout
	case "postgres": // group creates that run initdb, copies that recover WAL
		return pgDeadline
	case "gvisorwork": // five rounds of work that gvisor slows several times
		return workDeadline
	case "cluster": // two starts of the cluster's parts, a Lease's expiry, the soak
		return clusterSoak + 8*time.Minute
	}
	return benchTimeout
}

// runSelected runs the selected benchmarks in order. Without -keep-going
// the first failure stops the rest, which the report marks as not run.
func runSelected(ctx context.Context, r *rig, opts options, rep *report) error {
	var errs []error
	for _, b := range allBenchmarks() {
		if !opts.selected(b.name) || (len(opts.only) == 0 && slices.Contains(namedOnly, b.name)) {
			continue
		}
		if ctx.Err() != nil || (len(errs) > 0 && !opts.keepGoing) {
			why := "an earlier benchmark failed (-keep-going runs the rest)"
			if ctx.Err() != nil {
				why = "interrupted"
			}
			rep.Sections = append(rep.Sections, &section{Name: b.name, Title: b.title, Skip: why})
			continue
		}
		r.log.Info("running benchmark", "name", b.name)
		bctx, cancel := context.WithTimeout(ctx, deadline(b.name))
		s := b.run(bctx, r)
		cancel()
		s.Name, s.Title = b.name, b.title
		rep.Sections = append(rep.Sections, s)
		if s.Err != nil {
			r.log.Error("benchmark failed", "name", b.name, "err", s.Err)
			errs = append(errs, fmt.Errorf("%s: %w", b.name, s.Err))
		}
	}
	return errors.Join(errs...)
}

// summarizeBars prints the bars to the log, failures last.
func summarizeBars(log *slog.Logger, rep *report) {
	bars := rep.bars()
	sort.SliceStable(bars, func(i, j int) bool { return bars[i].Verdict == pass && bars[j].Verdict != pass })
	for _, b := range bars {
		log.Info("bar", "issue", b.Issue, "what", b.What, "target", b.Target, "measured", b.Value, "result", string(b.Verdict))
	}
}
