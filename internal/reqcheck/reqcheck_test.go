package reqcheck

import (
	"errors"
	"regexp"
	"strings"
	"testing"

	"github.com/paddock-dev/paddock/internal/errdefs"
)

// TestEnvKey: the hand-written check of a variable name agrees with the
// pattern it replaces on every string of one and two bytes and on longer
// edge cases.
func TestEnvKey(t *testing.T) {
	re := regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	check := func(k string) {
		if got, want := validEnvKey(k), re.MatchString(k); got != want {
			t.Errorf("validEnvKey(%q) = %v, the pattern says %v", k, got, want)
		}
	}
	check("")
	for a := 0; a < 256; a++ {
		check(string([]byte{byte(a)}))
		for b := 0; b < 256; b++ {
			check(string([]byte{byte(a), byte(b)}))
		}
	}
	for _, k := range []string{"PATH", "_x9", "9x", "A-B", "Ä", "LONG_" + strings.Repeat("a", 300), "x\n", "x y"} {
		check(k)
	}
}

// TestLaneRequest: a lane request frame is refused with an error naming
// what was wrong and with the status category the daemon answers with.
func TestLaneRequest(t *testing.T) {
	for _, c := range []struct {
		name, payload string
		cat           error
		words         string
	}{
		{"empty", ``, errdefs.ErrInvalid, "empty"},
		{"truncated", `{"sandbox":"s","exec":{"cmd":["tr`, errdefs.ErrInvalid, "truncated"},
		{"malformed", `{"sandbox":}`, errdefs.ErrInvalid, "malformed JSON"},
		{"unknown field", `{"sandbox":"s","exec":{"cmd":["true"]},"x":1}`, errdefs.ErrInvalid, "x: unknown field"},
		{"wrong type", `{"sandbox":"s","exec":{"cmd":"true"}}`, errdefs.ErrInvalid, "expected"},
		{"no command", `{"sandbox":"s","exec":{"cmd":[]}}`, errdefs.ErrInvalid, "must name a command"},
		{"NUL", `{"sandbox":"s","exec":{"cmd":["a\u0000b"]}}`, errdefs.ErrInvalid, "NUL"},
		{"bad env", `{"sandbox":"s","exec":{"cmd":["true"],"env":{"A=B":"c"}}}`, errdefs.ErrInvalid, "not a valid variable name"},
		{"relative cwd", `{"sandbox":"s","exec":{"cmd":["true"],"cwd":"tmp"}}`, errdefs.ErrInvalid, "absolute"},
		{"negative timeout", `{"sandbox":"s","exec":{"cmd":["true"],"timeout_seconds":-1}}`, errdefs.ErrInvalid, "negative"},
		{"tty", `{"sandbox":"s","exec":{"cmd":["true"],"tty":{"cols":80,"rows":24}}}`, errdefs.ErrInvalid, "interactive stream"},
		{"oversize", `{"sandbox":"s","exec":{"cmd":["` + strings.Repeat("a", MaxBody) + `"]}}`, errdefs.ErrTooLarge, "exceeds"},
	} {
		_, err := LaneRequest([]byte(c.payload), "")
		if !errors.Is(err, c.cat) || !strings.Contains(err.Error(), c.words) {
			t.Errorf("%s: %v; want a %v error saying %q", c.name, err, c.cat, c.words)
		}
	}
	good := []byte(`{"sandbox":"s","exec":{"cmd":["echo","hi"],"env":{"A":"1"},"cwd":"/tmp"}}`)
	if _, err := LaneRequest(good, "t"); !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), `sandbox t, not "s"`) {
		t.Errorf("a request for another sandbox on a bound lane: %v", err)
	}
	req, err := LaneRequest(good, "s")
	if err != nil || req.Sandbox != "s" || len(req.Exec.Cmd) != 2 || req.Exec.Env["A"] != "1" || req.Exec.Cwd != "/tmp" {
		t.Errorf("a good request: %+v, %v", req, err)
	}
}

func TestSandboxID(t *testing.T) {
	for id, ok := range map[string]bool{
		"abc123": true, "a-b": true, "0": true, strings.Repeat("a", 64): true,
		"": false, "-a": false, "../x": false, "A": false, "a/b": false, "a.b": false, "a\x00": false,
		strings.Repeat("a", 65): false,
	} {
		err := SandboxID("sandbox", id)
		if (err == nil) != ok {
			t.Errorf("SandboxID(%q) = %v, want ok=%v", id, err, ok)
		}
		if err != nil && (!errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "sandbox") || !strings.Contains(err.Error(), "not a sandbox id")) {
			t.Errorf("SandboxID(%q) = %v: not ErrInvalid naming the field", id, err)
		}
	}
}
