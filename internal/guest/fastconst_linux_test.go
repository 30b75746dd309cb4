package guest

import (
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/paddock-dev/paddock/internal/guestapi"
	"github.com/paddock-dev/paddock/internal/guestfork"
	"github.com/paddock-dev/paddock/wire"
)

// TestFastGuestConstants: the fast guest (internal/guestc, C) spells the
// constants it shares with the Go guest, the forker and the protocol as
// they do: a verb it execs the Go guest with, a bound both guests keep,
// the ops its helper serves.
func TestFastGuestConstants(t *testing.T) {
	b, err := os.ReadFile("../guestc/guest.c")
	if err != nil {
		t.Fatal(err)
	}
	defs := map[string]string{}
	for _, m := range regexp.MustCompile(`(?m)^#define ([A-Z_]+) +([^/\n]+)`).FindAllStringSubmatch(string(b), -1) {
		defs[m[1]] = strings.TrimSpace(m[2])
	}
	// number evaluates the defines' forms: N, (N << M), "string".
	number := func(name string) int64 {
		t.Helper()
		v := strings.Trim(defs[name], "()")
		if a, sh, ok := strings.Cut(v, " << "); ok {
			x, err1 := strconv.ParseInt(a, 10, 64)
			y, err2 := strconv.ParseInt(sh, 10, 64)
			if err1 == nil && err2 == nil {
				return x << y
			}
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			t.Fatalf("guest.c's %s is %q", name, defs[name])
		}
		return n
	}
	// The ops it passes on to its helper are those the helper serves.
	m := regexp.MustCompile(`helper_ops\[\] = \{([^}]*)\}`).FindStringSubmatch(string(b))
	if m == nil {
		t.Fatal("no helper_ops in guest.c")
	}
	var passed, extra []string
	for _, q := range regexp.MustCompile(`"[^"]*"`).FindAllString(m[1], -1) {
		passed = append(passed, strings.Trim(q, `"`))
	}
	for op := range helperOps {
		extra = append(extra, op)
	}
	slices.Sort(passed)
	slices.Sort(extra)
	if !slices.Equal(passed, extra) {
		t.Errorf("guest.c passes %q on to its helper; the helper serves %q", passed, extra)
	}
	for name, want := range map[string]string{"ADOPT_VERB": guestfork.AdoptVerb, "HELPER_VERB": guestfork.HelperVerb} {
		if got := defs[name]; got != strconv.Quote(want) {
			t.Errorf("guest.c's %s is %s, want %q", name, got, want)
		}
	}
	for name, want := range map[string]int64{
		"FD_GO":                  guestapi.HandoverExeFD,
		"MAX_PAYLOAD":            wire.MaxPayload,
		"FINISHED_OUTPUT_FACTOR": FinishedOutputFactor,
		"START_HOLD_MS":          startHold.Milliseconds(),
		"MAX_LANES":              maxLanes,
		"REPORT_BUDGET":          reportBudget,
	} {
		if got := number(name); got != want {
			t.Errorf("guest.c's %s is %d, want %d", name, got, want)
		}
	}
}
