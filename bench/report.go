package main

import (
	"fmt"
	"strings"
	"time"
)

// verdict is how a result stands against its bar.
type verdict string

const (
	pass        verdict = "PASS"
	fail        verdict = "FAIL"
	reported    verdict = "REPORTED"
	notMeasured verdict = "NOT MEASURED"
)

// bar is one target from an issue's "Bars" section and what was measured.
type bar struct {
	Issue   int
	What    string
	Target  string
	Value   string
	Verdict verdict
}

func check(ok bool) verdict {
	if ok {
		return pass
	}
	return fail
}

// table is a markdown table.
type table struct {
	Caption string
	Header  []string
	Rows    [][]string
}

func (t *table) add(cells ...string) { t.Rows = append(t.Rows, cells) }

// section is one benchmark's part of the report.
type section struct {
	Name   string // as given to -only
	Title  string
	Method []string // how it is measured: what is inside the timed region
	Tables []table
	Bars   []bar
	Notes  []string
	Err    error  // the benchmark failed; what it measured so far is kept
	Skip   string // why it did not run
}

func (s *section) note(format string, args ...any) {
	s.Notes = append(s.Notes, fmt.Sprintf(format, args...))
}

// busyWarning is the host CPU use around the run above which the report
// warns that other work inflated the numbers.
const busyWarning = 0.25

// report is the whole BENCHMARKS.md.
type report struct {
	Started  time.Time
	Finished time.Time
	// BusyBefore and BusyAfter are the host's CPU use over a second
	// before the daemon starts and after the cleanup: other work.
	BusyBefore, BusyAfter float64
	Command               string
	Machine               [][2]string
	Sections              []*section
	Cleanup               cleanupReport
	DaemonLog             daemonLogSummary
}

func (r *report) bars() []bar {
	var out []bar
	for _, s := range r.Sections {
		out = append(out, s.Bars...)
	}
	return out
}

func (r *report) markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# paddock benchmarks\n\n")
	fmt.Fprintf(&b, "Measured %s (UTC), in %s. Reproduce with:\n\n```\n%s\n```\n\n",
		r.Started.UTC().Format("2006-01-02 15:04"), r.Finished.Sub(r.Started).Round(time.Second), r.Command)
	b.WriteString("The harness (`bench/`) starts its own daemon on private directories and a private cgroup " +
		"parent, runs paddock, bubblewrap and runc side by side in the same run, and removes every sandbox and " +
		"container it made. Absolute numbers move with the machine's load: compare rows of one run, not runs.\n\n")
	if busy := max(r.BusyBefore, r.BusyAfter); busy > busyWarning {
		fmt.Fprintf(&b, "**The machine was busy with other work around this run (CPU %s used before it started, %s after it ended): "+
			"the absolute numbers are inflated. Rerun on a quiet machine before judging a bar by them.**\n\n",
			percent(r.BusyBefore), percent(r.BusyAfter))
	}
	writeKV(&b, "Machine", r.Machine)
	r.writeBars(&b)
	for _, s := range r.Sections {
		s.write(&b)
	}
	r.Cleanup.write(&b)
	r.DaemonLog.write(&b)
	return b.String()
}

func writeKV(b *strings.Builder, title string, kv [][2]string) {
	fmt.Fprintf(b, "## %s\n\n| | |\n|---|---|\n", title)
	for _, p := range kv {
		fmt.Fprintf(b, "| %s | %s |\n", p[0], cell(p[1]))
	}
	b.WriteString("\n")
}

func (r *report) writeBars(b *strings.Builder) {
	bars := r.bars()
	b.WriteString("## Bars\n\n")
	if len(bars) == 0 {
		b.WriteString("No benchmark with a bar ran.\n\n")
		return
	}
	writeBarTable(b, bars)
	failed := 0
	for _, x := range bars {
		if x.Verdict == fail || x.Verdict == notMeasured {
			failed++
		}
	}
	if failed > 0 {
		fmt.Fprintf(b, "**%d of %d bars failed or could not be measured.**\n\n", failed, len(bars))
	}
}

func writeBarTable(b *strings.Builder, bars []bar) {
	b.WriteString("| issue | bar | target | measured | result |\n|---|---|---|---|---|\n")
	for _, x := range bars {
		fmt.Fprintf(b, "| #%d | %s | %s | %s | **%s** |\n", x.Issue, cell(x.What), cell(x.Target), cell(x.Value), x.Verdict)
	}
	b.WriteString("\n")
}

func (s *section) write(b *strings.Builder) {
	fmt.Fprintf(b, "## %s\n\n", s.Title)
	if s.Skip != "" {
		fmt.Fprintf(b, "Not run: %s.\n\n", s.Skip)
		return
	}
	if s.Err != nil {
		fmt.Fprintf(b, "**This benchmark failed: %s.** Results below are what it measured before failing.\n\n", cell(s.Err.Error()))
	}
	for _, m := range s.Method {
		fmt.Fprintf(b, "- %s\n", m)
	}
	if len(s.Method) > 0 {
		b.WriteString("\n")
	}
	for _, t := range s.Tables {
		t.write(b)
	}
	if len(s.Bars) > 0 {
		writeBarTable(b, s.Bars)
	}
	for _, n := range s.Notes {
		fmt.Fprintf(b, "Note: %s\n\n", n)
	}
}

func (t table) write(b *strings.Builder) {
	if len(t.Rows) == 0 {
		return
	}
	if t.Caption != "" {
		fmt.Fprintf(b, "%s\n\n", t.Caption)
	}
	fmt.Fprintf(b, "| %s |\n|", strings.Join(t.Header, " | "))
	for range t.Header {
		b.WriteString("---|")
	}
	b.WriteString("\n")
	for _, row := range t.Rows {
		cells := make([]string, len(row))
		for i, c := range row {
			cells[i] = cell(c)
		}
		fmt.Fprintf(b, "| %s |\n", strings.Join(cells, " | "))
	}
	b.WriteString("\n")
}

// cell makes s safe inside a markdown table cell.
func cell(s string) string {
	s = strings.ReplaceAll(s, "\n", " ")
	return strings.ReplaceAll(s, "|", `\|`)
}
