package native

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"io"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/paddock-dev/paddock/internal/guestapi"
	"github.com/paddock-dev/paddock/internal/reqcheck"
)

// laneReqHarness runs the fast guest's reading of lane requests
// (internal/guestc/lanereq.c) in a process of its own, built with the
// address and undefined-behaviour sanitizers (testdata/lanereq_main.c).
type laneReqHarness struct {
	mu     sync.Mutex
	in     io.WriteCloser
	out    *bufio.Reader
	stderr bytes.Buffer
}

// servedReq is what the fast guest serves of a lane request.
type servedReq struct {
	argv, env []string
	cwd       string
}

func startLaneReqHarness(tb testing.TB) *laneReqHarness {
	tb.Helper()
	bin := filepath.Join(tb.TempDir(), "lanereq")
	build := exec.Command("gcc", "-O1", "-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-Wall", "-Wextra", "-Werror",
		"-I", "../../guestc", "-o", bin, "testdata/lanereq_main.c", "../../guestc/lanereq.c", "../../guestc/json.c")
	if out, err := build.CombinedOutput(); err != nil {
		tb.Fatalf("building the harness: %v\n%s", err, out)
	}
	h := &laneReqHarness{}
	cmd := exec.Command(bin)
	cmd.Stderr = &h.stderr
	var err error
	if h.in, err = cmd.StdinPipe(); err != nil {
		tb.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	h.out = bufio.NewReader(out)
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		// Its end: the leak check runs as it exits.
		h.in.Close()
		if err := cmd.Wait(); err != nil {
			tb.Errorf("the harness: %v\n%s", err, h.stderr.String())
		}
	})
	return h
}

// parse returns what the fast guest serves of payload on a lane bound to
// sandbox bound; nil when it is the Go guest's.
func (h *laneReqHarness) parse(t *testing.T, bound string, payload []byte) *servedReq {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	var rec []byte
	for _, b := range [][]byte{[]byte(bound), payload} {
		rec = binary.BigEndian.AppendUint32(rec, uint32(len(b)))
		rec = append(rec, b...)
	}
	if _, err := h.in.Write(rec); err != nil {
		t.Fatalf("writing to the harness: %v\n%s", err, h.stderr.String())
	}
	fail := func(err error) {
		t.Fatalf("reading the harness's answer to %q: %v\n%s", payload, err, h.stderr.String())
	}
	served, err := h.out.ReadByte()
	if err != nil {
		fail(err)
	}
	if served == 0 {
		return nil
	}
	u32 := func() uint32 {
		var b [4]byte
		if _, err := io.ReadFull(h.out, b[:]); err != nil {
			fail(err)
		}
		return binary.BigEndian.Uint32(b[:])
	}
	str := func() string {
		b := make([]byte, u32())
		if _, err := io.ReadFull(h.out, b); err != nil {
			fail(err)
		}
		return string(b)
	}
	list := func() []string {
		var l []string
		for n := u32(); n > 0; n-- {
			l = append(l, str())
		}
		return l
	}
	r := &servedReq{argv: list()}
	r.env = list()
	r.cwd = str()
	return r
}

// checkServed fails t unless the Go guest would run payload on a lane
// bound to bound as the fast guest does with got.
func checkServed(t *testing.T, bound string, payload []byte, got *servedReq) {
	t.Helper()
	req, err := reqcheck.LaneRequest(payload, bound)
	if err != nil {
		t.Fatalf("the fast guest serves %q, which reqcheck refuses: %v", payload, err)
	}
	ex := req.Exec
	if ex.TTY != nil || ex.Stdin != nil || ex.TimeoutSeconds != 0 || (ex.User != "" && ex.User != "root" && ex.User != "0") {
		t.Fatalf("the fast guest serves %q: %+v is not a plain command", payload, ex)
	}
	env := guestapi.EnvList(ex.Env)
	if !slices.Equal(got.argv, ex.Cmd) || !slices.Equal(got.env, env) && len(got.env)+len(env) > 0 || got.cwd != ex.Cwd {
		t.Fatalf("the fast guest reads %q as argv %q env %q cwd %q; Go as argv %q env %q cwd %q", payload, got.argv, got.env, got.cwd, ex.Cmd, env, ex.Cwd)
	}
}

// TestFastGuestLaneRequest: the requests the SDKs send are the fast
// guest's (Go's encoder escapes <, > and &; UTF-8 goes as it is), read
// as the Go guest reads them; those it does not serve, or that are not
// plain, are the Go guest's.
func TestFastGuestLaneRequest(t *testing.T) {
	h := startLaneReqHarness(t)
	for _, c := range []struct {
		payload string
		served  bool
	}{
		{`{"sandbox":"box1","exec":{"cmd":["echo","hi"]}}`, true},
		{`{"sandbox":"box1","exec":{"cmd":["sh","-c","a \u003e b \u0026\u0026 c \u003c d"],"env":{"Z":"1","A":"2","A1":"3"},"cwd":"/tmp/"}}`, true},
		{` { "exec" : { "cmd" : [ "h\u00e9llo", "\"\\\/\b\f\n\r\t" ] , "user" : "root", "tty": null, "stdin": null }, "sandbox" : "box1" } `, true},
		{`{"sandbox":"box1","exec":{"cmd":["x"],"user":"0","timeout_seconds":null,"env":null,"cwd":null}}`, true},
		{`{"sandbox":"box1","exec":{"cmd":["x"],"cwd":"/"}}`, true},
		{`{"sandbox":"box2","exec":{"cmd":["echo"]}}`, false},             // another sandbox
		{`{"sandbox":"box1","exec":{"cmd":["echo"],"stdin":"x"}}`, false}, // stdin
		{`{"sandbox":"box1","exec":{"cmd":["echo"],"user":"nobody"}}`, false},
		{`{"sandbox":"box1","exec":{"cmd":["echo"],"timeout_seconds":0}}`, false},
		{`{"sandbox":"box1","exec":{"cmd":["echo"],"tty":{"cols":80,"rows":24}}}`, false},
		{`{"sandbox":"box1","exec":{"CMD":["echo"]}}`, false}, // Go matches keys without case
		{`{"sandbox":"box1","exec":{"cmd":["echo"],"cmd":["rm"]}}`, false},
		{`{"sandbox":"box1","exec":{"cmd":["echo"],"env":{"A":"1","A":"2"}}}`, false},
		{`{"sandbox":"box1","exec":{"cmd":["echo"],"env":{"1A":"x"}}}`, false},
		{`{"sandbox":"box1","exec":{"cmd":["echo"],"env":{"A":1}}}`, false},
		{`{"sandbox":"box1","exec":{"cmd":["a\u0000b"]}}`, false},
		{`{"sandbox":"box1","exec":{"cmd":["\ud83d\ude00"]}}`, false}, // surrogates: Go's
		{`{"sandbox":"box1","exec":{"cmd":["\x"]}}`, false},
		{"{\"sandbox\":\"box1\",\"exec\":{\"cmd\":[\"a\tb\"]}}", false}, // a raw tab: refused by Go
		{"{\"sandbox\":\"box1\",\"exec\":{\"cmd\":[\"\xff\"]}}", false},
		{`{"sandbox":"box1","exec":{"cmd":["echo"],"cwd":"tmp"}}`, false},
		{`{"sandbox":"box1","exec":{"cmd":["echo"],"cwd":"/a/../b"}}`, false},
		{`{"sandbox":"box1","exec":{"cmd":["echo"],"cwd":"/a//b"}}`, false},
		{`{"sandbox":"box1","exec":{"cmd":[""]}}`, false},
		{`{"sandbox":"box1","exec":{"cmd":[]}}`, false},
		{`{"sandbox":"box1","exec":{"cmd":["echo",null]}}`, false},
		{`{"sandbox":"box1","exec":{"cmd":["echo"]}} x`, false},
		{`{"sandbox":"box1","exec":{"cmd":["echo"]},"extra":1}`, false},
		{`[{"sandbox":"box1"}]`, false},
		{`{"sandbox":"box1","exec":{"cmd":["echo"]}`, false},
		{`{"sandbox":"box1","exec":{"cmd":["` + strings.Repeat("a", 1<<20) + `"]}}`, false}, // past reqcheck.MaxBody
	} {
		got := h.parse(t, "box1", []byte(c.payload))
		if (got != nil) != c.served {
			t.Errorf("served %v, want %v: %.200s", got != nil, c.served, c.payload)
		}
		if got != nil {
			checkServed(t, "box1", []byte(c.payload), got)
		}
	}
}

// FuzzFastGuestLaneRequest: whatever a lane request's bytes, the fast
// guest serves it only as the Go guest would serve it: it passes
// reqcheck.LaneRequest, is a plain command, and runs with the same argv,
// environment and working directory. The harness's sanitizers fail it on
// a read past a bound, undefined behaviour, or a leak.
func FuzzFastGuestLaneRequest(f *testing.F) {
	h := startLaneReqHarness(f)
	for _, s := range []string{
		`{"sandbox":"box1","exec":{"cmd":["echo","hi"]}}`,
		`{"sandbox":"box1","exec":{"cmd":["sh","-c","a \u003e b"],"env":{"B":"1","A":"2"},"cwd":"/tmp/"}}`,
		`{"sandbox":"box1","exec":{"cmd":["x"],"user":"0","tty":null,"env":{"A_1":"\u00e9"},"cwd":"/a/b"}}`,
		`{"sandbox":"box1","exec":{"cmd":["\ud83d\ude00"],"stdin":"x","timeout_seconds":1}}`,
	} {
		f.Add([]byte(s), "box1")
	}
	f.Fuzz(func(t *testing.T, payload []byte, bound string) {
		if strings.IndexByte(bound, 0) >= 0 {
			return // a lane is bound to a sandbox id
		}
		if got := h.parse(t, bound, payload); got != nil {
			checkServed(t, bound, payload, got)
		}
	})
}
