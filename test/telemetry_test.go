package test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/client"
)

// metrics returns a sandbox's metrics through the SDK.
func (d *Daemon) metrics(id string) *api.Metrics {
	d.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m, err := d.Client().Metrics(ctx, id, client.MetricsOptions{})
	if err != nil {
		d.t.Fatalf("metrics of %s: %v", id, err)
	}
	return m
}

// current waits for a sample taken after t and returns it.
func (d *Daemon) current(id string, after time.Time) api.Sample {
	d.t.Helper()
	var s *api.Sample
	if !waitFor(10*time.Second, 100*time.Millisecond, func() bool {
		s = d.metrics(id).Current
		return s != nil && s.Time.After(after)
	}) {
		d.t.Fatalf("no sample of %s after %s (latest %+v)", id, after, s)
	}
	return *s
}

// events returns a sandbox's events of some types.
func (d *Daemon) events(id string, types ...string) []api.Event {
	d.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	evs, err := d.Client().Events(ctx, id, client.EventOptions{Types: types, Limit: 1000})
	if err != nil {
		d.t.Fatalf("events of %s: %v", id, err)
	}
	return evs
}

func (d *Daemon) waitEvent(id, typ string, match func(api.Event) bool) api.Event {
	d.t.Helper()
	var got api.Event
	if !waitFor(20*time.Second, 100*time.Millisecond, func() bool {
		for _, e := range d.events(id, typ) {
			if match(e) {
				got = e
				return true
			}
		}
		return false
	}) {
		d.t.Fatalf("no matching %s event of %s; events:\n%s", typ, id, eventLines(d.events(id)))
	}
	return got
}

func eventLines(evs []api.Event) string {
	var b strings.Builder
	for _, e := range evs {
		b.WriteString(strconv.FormatUint(e.Seq, 10) + " " + e.Type + " " + e.Message + " " + string(e.Data) + "\n")
	}
	return b.String()
}

const mib = 1 << 20

// TestTelemetryMetricsMatchWorkloads: a 2 s busy loop shows about 2
// CPU-seconds and a 300 MB allocation about 300 MB; the exec's start and
// exit are events, its output is kept after it ends, and the CLI shows
// all of it.
func TestTelemetryMetricsMatchWorkloads(t *testing.T) {
	t.Parallel()
	d := newDaemon(t)
	id := d.Create(api.CreateRequest{Resources: api.Resources{CPUs: 2, MemoryBytes: 1 << 30}})

	before := d.current(id, time.Now())
	// Two seconds of CPU as the process itself counts it, whatever else
	// the host's cores are doing meanwhile.
	busy := d.py(id, `
import time
print("spinning")
while time.process_time() < 2:
    pass
print("done")
`)
	if busy.ExitCode != 0 {
		t.Fatal(busy)
	}
	after := d.current(id, time.Now())
	if used := after.CPUSeconds - before.CPUSeconds; used < 1.9 || used > 2.5 {
		t.Errorf("a 2 s busy loop used %.2f CPU-seconds (%.2f → %.2f)", used, before.CPUSeconds, after.CPUSeconds)
	}

	// 300 MB held by a background process.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p, err := d.Client().StartProcess(ctx, id, api.StartRequest{Cmd: []string{"python3", "-c", `
import time
b = b"x" * (300 << 20)
print("holding", flush=True)
time.sleep(60)
`}})
	if err != nil {
		t.Fatal(err)
	}
	var mem api.Sample
	// Held means printed: the pages count while the allocation is still
	// filling them, and a process killed then has printed nothing.
	held := false
	if !waitFor(15*time.Second, 200*time.Millisecond, func() bool {
		if c := d.metrics(id).Current; c != nil {
			mem = *c
		}
		held = held || d.CLI("logs", id, "--exec", strconv.Itoa(p.PID)).Stdout == "holding\n"
		return held && mem.MemoryBytes >= 290*mib
	}) {
		t.Fatalf("a 300 MB allocation shows %d MiB (printed that it holds it: %v)", mem.MemoryBytes/mib, held)
	}
	if mem.MemoryBytes > 400*mib || mem.MemoryPeakBytes < mem.MemoryBytes || mem.MemoryLimitBytes != 1<<30 {
		t.Errorf("memory %d MiB, peak %d MiB, limit %d: want about 300 MiB under a 1 GiB limit", mem.MemoryBytes/mib, mem.MemoryPeakBytes/mib, mem.MemoryLimitBytes)
	}
	if mem.Pids < 2 {
		t.Errorf("pids = %d with a process running", mem.Pids)
	}
	if err := d.Client().Signal(ctx, id, p.PID, "KILL"); err != nil {
		t.Fatal(err)
	}

	// The history holds 1 s samples, oldest first.
	m := d.metrics(id)
	if len(m.History) < 3 || m.IntervalSeconds != 1 {
		t.Fatalf("history of %d samples at %gs", len(m.History), m.IntervalSeconds)
	}
	for i := 1; i < len(m.History); i++ {
		if gap := m.History[i].Time.Sub(m.History[i-1].Time); gap < 500*time.Millisecond || gap > 2500*time.Millisecond {
			t.Fatalf("samples %d and %d are %s apart", i-1, i, gap)
		}
	}

	// The exec's start and exit, with its exit code and duration.
	exit := d.waitEvent(id, "exec", func(e api.Event) bool {
		return strings.Contains(string(e.Data), `"exited":true`) && strings.Contains(string(e.Data), `"exit_code":0`) &&
			strings.Contains(string(e.Data), "time.process_time()")
	})
	var x struct {
		PID        int   `json:"pid"`
		DurationMS int64 `json:"duration_ms"`
	}
	json.Unmarshal(exit.Data, &x)
	if x.DurationMS < 1900 || x.DurationMS > 60000 {
		t.Errorf("busy loop exit event says %d ms: %s", x.DurationMS, exit.Data)
	}
	var started bool
	for _, e := range d.events(id, "exec") {
		started = started || (strings.Contains(string(e.Data), `"pid":`+strconv.Itoa(x.PID)+`,`) && strings.Contains(string(e.Data), `"exited":false`))
	}
	if !started {
		t.Errorf("no start event for pid %d: %+v", x.PID, d.events(id, "exec"))
	}
	// The output is kept after the process ended, through SDK and CLI.
	logs, err := d.Client().Logs(ctx, id)
	if err != nil || len(logs) < 2 {
		t.Fatalf("logs: %v %+v", err, logs)
	}
	s, err := d.Client().Log(ctx, id, x.PID, client.LogOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	st, err := s.Wait(&out, nil)
	s.Close()
	if err != nil || st == nil || st.ExitCode != 0 || out.String() != "spinning\ndone\n" {
		t.Fatalf("kept output %q, exit %+v, err %v", out.String(), st, err)
	}
	if got := d.MustCLI("logs", id, "--exec", strconv.Itoa(x.PID)); got != "spinning\ndone\n" {
		t.Errorf("paddock logs --exec: %q", got)
	}
	if got := d.MustCLI("logs", id); !strings.Contains(got, strconv.Itoa(x.PID)) || !strings.Contains(got, "python3") {
		t.Errorf("paddock logs: %q", got)
	}
	// The killed process's output is kept too, with its signal.
	if !waitFor(10*time.Second, 100*time.Millisecond, func() bool {
		l, err := d.Client().Logs(ctx, id)
		return err == nil && len(l) > 0 && l[len(l)-1].PID == p.PID && l[len(l)-1].Exit != nil && l[len(l)-1].Exit.Signal != ""
	}) {
		t.Errorf("killed process's log: %+v", logs)
	}
	if got := d.MustCLI("logs", id, "--exec", strconv.Itoa(p.PID), "--follow"); got != "holding\n" {
		t.Errorf("paddock logs --follow of a killed process: %q", got)
	}

	// The CLI.
	if got := d.MustCLI("stats", id); !strings.Contains(got, "cpu") || !strings.Contains(got, "limit 1G") {
		t.Errorf("paddock stats: %s", got)
	}
	var js api.Metrics
	if err := json.Unmarshal([]byte(d.MustCLI("stats", id, "--json")), &js); err != nil || js.Current == nil || len(js.History) == 0 {
		t.Errorf("paddock stats --json: %v %+v", err, js)
	}
	if got := d.MustCLI("top", "--once"); !strings.Contains(got, id) || !strings.Contains(got, "CPU%") {
		t.Errorf("paddock top --once: %s", got)
	}
	if got := d.MustCLI("events", id); !strings.Contains(got, "created") || !strings.Contains(got, "exited with code 0") {
		t.Errorf("paddock events: %s", got)
	}
}

// TestTelemetryEventsFollow: ?follow=1 streams events as they happen.
func TestTelemetryEventsFollow(t *testing.T) {
	t.Parallel()
	d := newDaemon(t)
	id := d.Create(api.CreateRequest{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	got := make(chan api.Event, 100)
	go d.Client().FollowEvents(ctx, id, client.EventOptions{}, func(e api.Event) error {
		got <- e
		return nil
	})
	d.sh(id, "echo hi")
	want := map[string]bool{"created": false, "exit": false}
	for !want["created"] || !want["exit"] {
		select {
		case e := <-got:
			want["created"] = want["created"] || e.Message == "created"
			want["exit"] = want["exit"] || (e.Type == "exec" && strings.Contains(e.Message, "exited with code 0"))
		case <-ctx.Done():
			t.Fatalf("followed events lack some of %v", want)
		}
	}
	// A client that leaves an exec early does not cut the kept output.
	st, err := d.Client().ExecStream(ctx, id, api.ExecRequest{Cmd: []string{"sh", "-c", "echo early; sleep 1; echo late"}}, false)
	if err != nil {
		t.Fatal(err)
	}
	st.Close()
	s, err := d.Client().Log(ctx, id, st.PID, client.LogOptions{Follow: true})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	exit, err := s.Wait(&out, nil)
	s.Close()
	if err != nil || exit == nil || exit.ExitCode != 0 || out.String() != "early\nlate\n" {
		t.Errorf("output of an exec left early: %q, %+v, %v", out.String(), exit, err)
	}
	// Bad filters name the field.
	if a := d.do("GET", "/v1/sandboxes/"+id+"/events?type=bogus", ""); a.Status != 400 || !strings.Contains(a.apiError(t).Message, "type") {
		t.Errorf("bad type filter: %d %s", a.Status, a.Body)
	}
	if a := d.do("GET", "/v1/sandboxes/"+id+"/metrics?since=yesterday", ""); a.Status != 400 || !strings.Contains(a.apiError(t).Message, "since") {
		t.Errorf("bad since: %d %s", a.Status, a.Body)
	}
	if a := d.do("GET", "/v1/sandboxes/nosuchbox/metrics", ""); a.Status != 404 {
		t.Errorf("metrics of an unknown sandbox: %d %s", a.Status, a.Body)
	}
}

// TestTelemetryPrometheus: a scrape parses with the official text parser,
// covers the daemon and the sandboxes, and labels only with sandbox ids.
func TestTelemetryPrometheus(t *testing.T) {
	t.Parallel()
	d := newDaemon(t)
	id := d.Create(api.CreateRequest{})
	d.current(id, time.Now())
	a := d.do("GET", "/metrics", "")
	if a.Status != 200 {
		t.Fatalf("GET /metrics: %d %s", a.Status, a.Body)
	}
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(a.Body))
	if err != nil {
		t.Fatalf("parsing the scrape: %v\n%s", err, a.Body)
	}
	for _, name := range []string{"paddock_sandboxes", "paddock_sandbox_creates_total", "paddock_sandbox_cpu_seconds_total", "paddock_sandbox_memory_bytes", "go_goroutines"} {
		if fams[name] == nil {
			t.Errorf("scrape lacks %s", name)
		}
	}
	// The warm pools by name: the default image's, at --warm-guests.
	var target float64
	for _, m := range fams["paddock_warm_pool_target"].GetMetric() {
		if len(m.Label) == 1 && m.Label[0].GetValue() == "image:host" {
			target = m.GetGauge().GetValue()
		}
	}
	if target != 2 || fams["paddock_warm_pool_size"] == nil {
		t.Errorf("warm pool series: target of image:host %v, want 2; size %v", target, fams["paddock_warm_pool_size"])
	}
	mem := fams["paddock_sandbox_memory_bytes"]
	if mem == nil {
		t.FailNow()
	}
	var found bool
	for _, m := range mem.Metric {
		for _, l := range m.Label {
			if l.GetName() == "sandbox" && l.GetValue() == id {
				found = m.GetGauge().GetValue() > 0
			}
		}
	}
	if !found {
		t.Errorf("no memory series for sandbox %s", id)
	}
	for name, f := range fams {
		for _, m := range f.Metric {
			for _, l := range m.Label {
				if l.GetName() == "sandbox" && l.GetValue() != id {
					t.Errorf("%s has a sandbox label %q", name, l.GetValue())
				}
			}
		}
	}
}

// budgetSandbox creates a sandbox with a budget and waits for the event
// of the budget being reached.
func budgetState(d *Daemon, id string, want api.State) {
	d.t.Helper()
	if !waitFor(20*time.Second, 100*time.Millisecond, func() bool { return d.get(id).State == want }) {
		d.t.Fatalf("sandbox %s is %s, want %s; events %s", id, d.get(id).State, want, eventLines(d.events(id)))
	}
}

// TestTelemetryBudgets: each action runs when its budget is reached, after
// a warning at the threshold, and an event says so.
func TestTelemetryBudgets(t *testing.T) {
	t.Parallel()
	u := newUpstream(t, egressNames)
	d := netDaemon(t, u)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	spin := []string{"python3", "-c", "while True: pass"}

	// CPU seconds, kill, with a warning half way (a wide margin: one core
	// uses at most a CPU-second between two samples).
	kill := d.Create(api.CreateRequest{Budget: &api.Budget{CPUSeconds: 3, WarnAt: 0.5, Action: "kill"}})
	// Wall time, pause (freeze).
	pause := d.Create(api.CreateRequest{Budget: &api.Budget{WallSeconds: 4, Action: "pause"}})
	// Egress requests, cut the network.
	cut := egressSandbox(t, d, u, &api.Policy{Allow: []api.PolicyRule{{Match: "allowed.test"}}})
	if _, err := d.Client().Update(ctx, cut, api.UpdateRequest{Budget: &api.Budget{EgressRequests: 3, Action: "cut_network"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Client().StartProcess(ctx, kill, api.StartRequest{Cmd: spin}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		mustSay(t, curl(d, cut, "http://allowed.test/"), "")
	}

	budgetState(d, kill, api.StateStopped)
	e := d.waitEvent(kill, "budget", func(e api.Event) bool { return strings.Contains(string(e.Data), `"exceeded":true`) })
	var n struct {
		Used, Limit float64
		Action      string
	}
	json.Unmarshal(e.Data, &n)
	if n.Used < 3 || n.Used > 5 || n.Action != "kill" {
		t.Errorf("cpu budget of 3 s acted at %+v", n)
	}
	w := d.waitEvent(kill, "budget", func(e api.Event) bool { return strings.Contains(string(e.Data), `"exceeded":false`) })
	json.Unmarshal(w.Data, &n)
	if n.Used < 1.5 || n.Used > 3 || w.Seq > e.Seq {
		t.Errorf("cpu budget warning at half of 3 s came at %+v (seq %d, exceeded at %d)", n, w.Seq, e.Seq)
	}

	budgetState(d, pause, api.StateFrozen)
	d.waitEvent(pause, "budget", func(e api.Event) bool {
		return strings.Contains(string(e.Data), `"wall_seconds"`) && strings.Contains(string(e.Data), `"exceeded":true`)
	})
	if since := time.Since(d.get(pause).CreatedAt); since < 4*time.Second {
		t.Errorf("wall budget of 4 s acted after %s", since)
	}

	d.waitEvent(cut, "budget", func(e api.Event) bool {
		return strings.Contains(string(e.Data), `"egress_requests"`) && strings.Contains(string(e.Data), `"exceeded":true`)
	})
	if !waitFor(10*time.Second, 100*time.Millisecond, func() bool {
		p, err := d.Client().Policy(ctx, cut)
		return err == nil && len(p.Allow) == 0
	}) {
		t.Fatalf("the network was not cut")
	}
	mustFail(t, curl(d, cut, "http://allowed.test/"), "egress after the network was cut")
	mustFail(t, curl(d, cut, "http://"+u.IP+"/"), "egress to an address after the network was cut")
	var m *api.Metrics
	if !waitFor(10*time.Second, 200*time.Millisecond, func() bool {
		m = d.metrics(cut)
		return m.Current != nil && m.Current.EgressDenied >= 1
	}) || m.Current.EgressAllowed < 3 || m.Current.NetRxBytes == 0 {
		t.Errorf("egress counters: %+v", m.Current)
	}
	if len(d.events(cut, "policy")) < 4 {
		t.Errorf("egress decisions are not events:\n%s", eventLines(d.events(cut, "policy")))
	}
}

// TestTelemetrySelfView: /run/paddock and http://paddock.internal/v1/self
// show a sandbox its own limits, usage and remaining budgets, and no
// other sandbox's.
func TestTelemetrySelfView(t *testing.T) {
	t.Parallel()
	d := newDaemon(t)
	a := d.Create(api.CreateRequest{Resources: api.Resources{MemoryBytes: 384 * mib, CPUs: 1, Pids: 500},
		Budget: &api.Budget{CPUSeconds: 1000, EgressRequests: 50}})
	b := d.Create(api.CreateRequest{Resources: api.Resources{MemoryBytes: 256 * mib}})
	check := func(src, raw string) {
		t.Helper()
		var v api.Self
		dec := json.NewDecoder(strings.NewReader(raw))
		dec.DisallowUnknownFields() // api.Self is the whole of it
		if err := dec.Decode(&v); err != nil {
			t.Fatalf("%s: %v: %s", src, err, raw)
		}
		if v.Sandbox != a || v.Limits == nil || v.Limits.MemoryBytes != 384*mib || v.Limits.CPUs != 1 || v.Limits.Pids != 500 ||
			v.Usage == nil || v.Usage.MemoryBytes <= 0 || len(v.Budgets) != 2 || v.Denials == nil {
			t.Fatalf("%s: %s", src, raw)
		}
		for _, bl := range v.Budgets {
			if bl.Budget == "cpu_seconds" && (bl.Limit != 1000 || bl.Remaining > 1000 || bl.Remaining < 990) {
				t.Errorf("%s: cpu budget %+v", src, bl)
			}
		}
		if strings.Contains(raw, b) {
			t.Errorf("%s names the other sandbox", src)
		}
	}
	// The gateway writes self.json behind the create (a refresh it
	// pokes), so the first reads may find no file yet.
	if !waitFor(10*time.Second, 200*time.Millisecond, func() bool {
		out, _, st := d.Exec(a, "cat", "/run/paddock/self.json")
		return st != nil && st.ExitCode == 0 && strings.Contains(out, `"usage"`)
	}) {
		t.Fatalf("self.json has no usage: %s", d.Sh(a, "cat /run/paddock/self.json"))
	}
	check("/run/paddock/self.json", d.Sh(a, "cat /run/paddock/self.json"))
	r := curl(d, a, "http://paddock.internal/v1/self")
	if r.ExitCode != 0 {
		t.Fatal(r)
	}
	check("paddock.internal/v1/self", r.Stdout)
	// A refused name says why, and what would allow it.
	mustFail(t, curl(d, a, "http://nowhere.test/"), "a name no policy allows")
	if !waitFor(10*time.Second, 200*time.Millisecond, func() bool {
		den := d.Sh(a, "cat /run/paddock/denials.json")
		return strings.Count(den, `"host": "nowhere.test"`) == 1 && strings.Contains(den, `"kind": "dns"`) && strings.Contains(den, "--allow nowhere.test")
	}) {
		t.Errorf("denials.json after a refused name: %s", d.Sh(a, "cat /run/paddock/denials.json"))
	}
	d.waitEvent(a, "policy", func(e api.Event) bool { return strings.Contains(e.Message, "nowhere.test") })
	// It stays current: a resize shows.
	if _, err := d.Client().Update(context.Background(), a, api.UpdateRequest{Resources: api.Resources{MemoryBytes: 512 * mib}}); err != nil {
		t.Fatal(err)
	}
	if !waitFor(10*time.Second, 200*time.Millisecond, func() bool {
		return strings.Contains(curl(d, a, "http://paddock.internal/v1/self").Stdout, strconv.Itoa(512*mib))
	}) {
		t.Errorf("self view did not follow a resize")
	}
	// The other sandbox sees itself only: its own tree, its own answer.
	for _, got := range []string{d.Sh(b, "cat /run/paddock/self.json"), curl(d, b, "http://paddock.internal/v1/self").Stdout} {
		var v api.Self
		if err := json.Unmarshal([]byte(got), &v); err != nil || v.Sandbox != b || v.Limits == nil || v.Limits.MemoryBytes != 256*mib || len(v.Budgets) != 0 || strings.Contains(got, a) {
			t.Errorf("sandbox b's self view: %v %s", err, got)
		}
	}
	if r := d.sh(b, "ls /run/paddock/ && echo x > /run/paddock/self.json"); r.ExitCode == 0 {
		t.Errorf("the self tree is writable: %s", r)
	}
}

// TestTelemetryUpdateAndAdmission: `paddock update` changes a running
// sandbox's limits in its cgroup, with an event; admission control
// refuses a create or a growth beyond the host's capacity with a 503
// saying why.
func TestTelemetryUpdateAndAdmission(t *testing.T) {
	t.Parallel()
	d := newDaemon(t, "--admission-memory", "2g", "--memory-overcommit", "1")
	id := d.Create(api.CreateRequest{Resources: api.Resources{MemoryBytes: 512 * mib, CPUs: 1, Pids: 100}})
	out := d.MustCLI("update", id, "--memory", "1g", "--cpus", "2", "--pids", "200")
	if !strings.Contains(out, "2 CPUs, 1G memory, 200 pids") {
		t.Errorf("paddock update printed %q", out)
	}
	cg := d.get(id).Runtime.Cgroup
	read := func(ctrl, file string) string {
		for _, dir := range []string{filepath.Join("/sys/fs/cgroup", ctrl, cg), filepath.Join("/sys/fs/cgroup", cg)} {
			if b, err := os.ReadFile(filepath.Join(dir, file)); err == nil {
				return strings.TrimSpace(string(b))
			}
		}
		return ""
	}
	if got := read("memory", "memory.limit_in_bytes") + read("", "memory.max"); got != strconv.Itoa(1<<30) {
		t.Errorf("memory limit in the cgroup: %q", got)
	}
	if got := read("pids", "pids.max"); got != "200" {
		t.Errorf("pids limit in the cgroup: %q", got)
	}
	e := d.waitEvent(id, "limits", func(e api.Event) bool { return strings.Contains(string(e.Data), `"by":"user"`) })
	if !strings.Contains(string(e.Data), `"from_memory_bytes":`+strconv.Itoa(512*mib)) {
		t.Errorf("limits event: %s", e.Data)
	}
	if s := d.current(id, time.Now()); s.MemoryLimitBytes != 1<<30 || s.PidsLimit != 200 {
		t.Errorf("metrics after update: %+v", s)
	}
	// A budget given to a running sandbox.
	d.MustCLI("update", id, "--budget-cpu-seconds", "500", "--budget-action", "kill")
	if m := d.metrics(id); m.Budgets == nil || len(m.Budgets.Budgets) != 1 || m.Budgets.Budgets[0].Limit != 500 || m.Budgets.Budgets[0].Action != "kill" {
		t.Errorf("budget after paddock update: %+v", m.Budgets)
	}
	// 2 GiB capacity less 512 MiB kept back: 1 GiB is taken, 1 GiB more
	// does not fit.
	a := d.do("POST", "/v1/sandboxes", `{"resources":{"memory_bytes":1073741824}}`)
	if a.Status != 503 || !strings.Contains(a.apiError(t).Message, "memory") {
		t.Fatalf("create beyond capacity: %d %s", a.Status, a.Body)
	}
	// One sandbox bigger than the host is refused whatever the overcommit.
	a = d.do("POST", "/v1/sandboxes", `{"resources":{"memory_bytes":4294967296}}`)
	if a.Status != 503 || !strings.Contains(a.apiError(t).Message, "more than the 1.5 GiB this host has") {
		t.Fatalf("create bigger than the host: %d %s", a.Status, a.Body)
	}
	// A growth that would pass the capacity with the others is refused.
	d.Create(api.CreateRequest{Resources: api.Resources{MemoryBytes: 256 * mib}})
	a = d.do("POST", "/v1/sandboxes/"+id+"/update", `{"resources":{"memory_bytes":1610612736}}`)
	if a.Status != 503 || !strings.Contains(a.apiError(t).Message, "memory") {
		t.Fatalf("growth beyond capacity: %d %s", a.Status, a.Body)
	}
	if got := read("memory", "memory.limit_in_bytes") + read("", "memory.max"); got != strconv.Itoa(1<<30) {
		t.Errorf("a refused growth changed the cgroup: %q", got)
	}
	// A stopped sandbox gives its share back.
	if _, err := d.Client().Stop(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	d.Create(api.CreateRequest{Resources: api.Resources{MemoryBytes: 1 << 30}})
}

// ramp is a workload that grows its memory from 100 MB to 2 GB, 2.5%
// four times a second (about 10% a second), touching every page. The
// autoscaler decides once a second and grows a limit when the working set
// passes 85% of it, so a workload growing by less than 1/0.85 between two
// samples never meets its limit.
const ramp = `
import time
chunks, total, step = [], 0, 100 << 20
while total < (2000 << 20):
    chunks.append(b"x" * step)
    total += step
    step = max(int(total * 0.025), 1 << 20)
    time.sleep(0.25)
print("reached", total >> 20, "MiB", flush=True)
`

// TestTelemetryAutoscale: under autoscale (256M..4G) a workload ramping
// from 100 MB to 2 GB completes; with a fixed 256M limit it is OOM-killed.
func TestTelemetryAutoscale(t *testing.T) {
	if testing.Short() {
		t.Skip("ramps to 2 GB over about 35 s")
	}
	t.Parallel()
	d := newDaemon(t)
	fixed := d.Create(api.CreateRequest{Resources: api.Resources{MemoryBytes: 256 * mib}})
	r := d.py(fixed, ramp)
	if r.ExitCode == 0 || !(r.OOMKilled || r.Signal == "KILL" || r.Signal == "SIGKILL") {
		t.Fatalf("under a fixed 256M limit the ramp was not OOM-killed: %s", r)
	}
	d.waitEvent(fixed, "oom", func(api.Event) bool { return true })

	auto := d.Create(api.CreateRequest{Resources: api.Resources{MemoryBytes: 256 * mib},
		Autoscale: &api.Autoscale{MinMemoryBytes: 256 * mib, MaxMemoryBytes: 4 << 30}})
	r = d.py(auto, ramp)
	if r.ExitCode != 0 || !strings.Contains(r.Stdout, "reached") {
		t.Fatalf("under autoscale the ramp failed: %s\nevents:\n%s", r, eventLines(d.events(auto, "autoscale", "oom")))
	}
	grows := 0
	for _, e := range d.events(auto, "autoscale") {
		if strings.Contains(string(e.Data), `"memory":"grow"`) {
			grows++
		}
	}
	if grows < 3 {
		t.Errorf("%d memory grows for a ramp from 100 MB to 2 GB", grows)
	}
	if n := len(d.events(auto, "oom")); n != 0 {
		t.Errorf("%d OOM events under autoscale", n)
	}
	if l := d.metrics(auto).Autoscale; l == nil || l.MemoryBytes < 2000*mib {
		t.Errorf("autoscaled limits after the ramp: %+v", l)
	}
}

func lines12() string {
	var b strings.Builder
	for i := 1; i <= 12; i++ {
		b.WriteString("x" + strconv.Itoa(i) + "\n")
	}
	return b.String()
}

// logTail waits until the exec log of process pid has its exit, then
// reads it: the offset of its first kept byte, the bytes (which must run
// without a gap), the offset of its end and the exit status.
func (d *Daemon) logTail(id string, pid int) (first int64, data []byte, end int64, st *api.ExitStatus) {
	d.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if !waitFor(30*time.Second, 50*time.Millisecond, func() bool {
		ls, err := d.Client().Logs(ctx, id)
		for _, l := range ls {
			if l.PID == pid && l.Exit != nil {
				return true
			}
		}
		return err != nil
	}) {
		d.t.Fatalf("the log of %d has no exit", pid)
	}
	s, err := d.Client().Log(ctx, id, pid, client.LogOptions{})
	if err != nil {
		d.t.Fatalf("log of %d: %v", pid, err)
	}
	defer s.Close()
	first = -1
	st, err = s.Wait(writerFunc(func(p []byte) (int, error) {
		off := s.Offset() - int64(len(p)) // Offset already counts p
		if first < 0 {
			first = off
		}
		if off != first+int64(len(data)) {
			return 0, fmt.Errorf("a gap in the kept output: bytes at %d after %d", off, first+int64(len(data)))
		}
		data = append(data, p...)
		return len(p), nil
	}), nil)
	if err != nil || st == nil {
		d.t.Fatalf("log of %d: exit %+v, err %v", pid, st, err)
	}
	return first, data, s.Offset(), st
}

type writerFunc func(p []byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// TestTelemetryExecLogKeepsNewest: the log of an exec whose output is
// several times its 8 MiB cap keeps the newest bytes, at their offsets in
// the stream, whether the client read the stream to its end or left it
// early. The output comes in two bursts a second and a half apart, so
// that a batch is written while the process runs and the rest at its exit.
func TestTelemetryExecLogKeepsNewest(t *testing.T) {
	t.Parallel()
	d := newDaemon(t)
	id := d.Create(api.CreateRequest{})
	const n = 5_000_000 // 38.9 MB of lines
	script := "seq 1 2500000; sleep 1.5; seq 2500001 " + strconv.Itoa(n)
	var want []byte
	for i := 1; i <= n; i++ {
		want = strconv.AppendInt(want, int64(i), 10)
		want = append(want, '\n')
	}
	check := func(what string, pid int) {
		t.Helper()
		first, data, end, st := d.logTail(id, pid)
		switch {
		case st.ExitCode != 0:
			t.Errorf("%s: the log's exit %+v", what, st)
		case end != int64(len(want)):
			t.Errorf("%s: the log ends at offset %d, the output at %d", what, end, len(want))
		case len(data) < 4*mib || len(data) > 8*mib:
			t.Errorf("%s: the log keeps %d bytes, want 4 to 8 MiB (its two segments)", what, len(data))
		case !bytes.Equal(data, want[first:]):
			t.Errorf("%s: the %d bytes kept from offset %d are not the output's newest", what, len(data), first)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var got bytes.Buffer
	var pid int
	st, err := d.Client().Exec(ctx, id, api.ExecRequest{Cmd: []string{"sh", "-c", script}},
		client.ExecIO{Stdout: &got, OnStart: func(p int) { pid = p }})
	if err != nil || st.ExitCode != 0 || !bytes.Equal(got.Bytes(), want) {
		t.Fatalf("exec: %d bytes, exit %+v, err %v", got.Len(), st, err)
	}
	check("stream read to its end", pid)

	s, err := d.Client().ExecStream(ctx, id, api.ExecRequest{Cmd: []string{"sh", "-c", script}}, false)
	if err != nil {
		t.Fatal(err)
	}
	var read int
	_, err = s.Wait(writerFunc(func(p []byte) (int, error) {
		if read += len(p); read > mib {
			return 0, errors.New("leaving")
		}
		return len(p), nil
	}), nil)
	s.Close()
	if err == nil || err.Error() != "leaving" {
		t.Fatalf("the first stream ended with %v before the client left", err)
	}
	check("stream left after 1 MiB", s.PID)
}

// TestTelemetryRestart: across a daemon restart the events stay, a
// running process's output copy carries on to its exit, and budget usage
// is not forgotten.
func TestTelemetryRestart(t *testing.T) {
	t.Parallel()
	d := newDaemon(t)
	id := d.Create(api.CreateRequest{Budget: &api.Budget{CPUSeconds: 1000}})
	if r := d.py(id, "import time\nwhile time.process_time() < 1: pass"); r.ExitCode != 0 {
		t.Fatal(r)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p, err := d.Client().StartProcess(ctx, id, api.StartRequest{Cmd: []string{"sh", "-c", "for i in 1 2 3 4 5 6; do echo line$i; sleep 1; done"}})
	if err != nil {
		t.Fatal(err)
	}
	var used float64
	if !waitFor(10*time.Second, 200*time.Millisecond, func() bool {
		m := d.metrics(id)
		if m.Budgets != nil && len(m.Budgets.Budgets) == 1 {
			used = m.Budgets.Budgets[0].Used
		}
		return used >= 0.9
	}) {
		t.Fatalf("cpu budget used %.2f s before the restart", used)
	}
	// An exec whose stream is still open when the daemon stops.
	open, err := d.Client().ExecStream(ctx, id, api.ExecRequest{Cmd: []string{"sh", "-c", "for i in $(seq 12); do echo x$i; sleep 1; done"}}, false)
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close()
	time.Sleep(time.Second)
	t0 := time.Now()
	d.Stop()
	if took := time.Since(t0); took > 8*time.Second {
		t.Errorf("the daemon took %s to stop with an exec stream open", took)
	}
	d.Start()
	ls, err := d.Client().Log(ctx, id, open.PID, client.LogOptions{Follow: true})
	if err != nil {
		t.Fatal(err)
	}
	var lo bytes.Buffer
	lst, err := ls.Wait(&lo, nil)
	ls.Close()
	if err != nil || lst == nil || lst.ExitCode != 0 || lo.String() != lines12() {
		t.Errorf("output of an exec streamed across the restart %q, exit %+v, err %v", lo.String(), lst, err)
	}

	s, err := d.Client().Log(ctx, id, p.PID, client.LogOptions{Follow: true})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	st, err := s.Wait(&out, nil)
	s.Close()
	if err != nil || st == nil || st.ExitCode != 0 || out.String() != "line1\nline2\nline3\nline4\nline5\nline6\n" {
		t.Fatalf("output copied across the restart %q, exit %+v, err %v", out.String(), st, err)
	}
	d.waitEvent(id, "exec", func(e api.Event) bool {
		return strings.Contains(e.Message, "pid "+strconv.Itoa(p.PID)+" exited with code 0")
	})
	if evs := d.events(id, "lifecycle"); len(evs) == 0 || evs[0].Message != "created" || evs[0].Seq != 1 {
		t.Errorf("events before the restart: %s", eventLines(evs))
	}
	var after float64
	if !waitFor(10*time.Second, 200*time.Millisecond, func() bool {
		m := d.metrics(id)
		if m.Budgets != nil && len(m.Budgets.Budgets) == 1 {
			after = m.Budgets.Budgets[0].Used
		}
		return after >= used
	}) {
		t.Errorf("cpu budget used %.2f s before the restart, %.2f s after", used, after)
	}
}

// TestTelemetryExecLogAfterClientLeaves: a client that closes an exec
// stream at once leaves the process running; the daemon lets go of the
// stream (issue 21: nothing held per idle sandbox for it), and the exec
// log still gets the output that came later, a quiet second apart, and
// the exit.
func TestTelemetryExecLogAfterClientLeaves(t *testing.T) {
	t.Parallel()
	d := newDaemon(t)
	id := d.Create(api.CreateRequest{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := d.Client().ExecStream(ctx, id, api.ExecRequest{Cmd: []string{"sh", "-c", "echo one; sleep 1.2; echo two; sleep 1.2; echo three"}}, false)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	_, data, end, st := d.logTail(id, s.PID)
	if want := "one\ntwo\nthree\n"; string(data) != want || end != int64(len(want)) || st.ExitCode != 0 {
		t.Errorf("the log has %q (ending at %d), exit %+v; want %q, exit 0", data, end, st, want)
	}
	// The sandbox serves the next exec as before.
	if out, _, st := d.Exec(id, "echo", "next"); st.ExitCode != 0 || out != "next\n" {
		t.Errorf("the next exec: %q, exit %+v", out, st)
	}
}
