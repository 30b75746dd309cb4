package e2b

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
)

func TestAPIKeyShape(t *testing.T) {
	k := APIKey("a-daemon-token-of-some-length")
	if !regexp.MustCompile(`^e2b_[0-9a-f]{40}$`).MatchString(k) {
		t.Fatalf("APIKey = %q, want e2b_ and 40 hex digits", k)
	}
	if k == APIKey("another-daemon-token-entirely") {
		t.Fatal("two tokens give one key")
	}
}

func TestResolve(t *testing.T) {
	for _, tc := range []struct{ user, in, want string }{
		{"user", "a.txt", "/home/user/a.txt"},
		{"user", "~/x", "/home/user/x"},
		{"user", "~", "/home/user"},
		{"root", "x", "/root/x"},
		{"user", "/etc/../tmp/./y", "/tmp/y"},
		{"user", "../../../etc/passwd", "/etc/passwd"},
	} {
		if got := resolve(tc.user, tc.in); got != tc.want {
			t.Errorf("resolve(%q, %q) = %q, want %q", tc.user, tc.in, got, tc.want)
		}
	}
}

func TestUserOf(t *testing.T) {
	basic := func(s string) string { return "Basic " + base64.StdEncoding.EncodeToString([]byte(s)) }
	for _, tc := range []struct {
		header, want string
		bad          bool
	}{
		{"", "user", false},
		{basic("root:"), "root", false},
		{basic(":"), "user", false},
		{basic("../etc:"), "", true},
		{"Bearer x", "", true},
		{"Basic !!!", "", true},
	} {
		r := httptest.NewRequest("POST", "/", nil)
		if tc.header != "" {
			r.Header.Set("Authorization", tc.header)
		}
		got, err := userOf(r)
		if (err != nil) != tc.bad || (!tc.bad && got != tc.want) {
			t.Errorf("userOf(%q) = %q, %v", tc.header, got, err)
		}
		if tc.bad && !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("userOf(%q): error %v is not ErrInvalid", tc.header, err)
		}
	}
}

func TestSignature(t *testing.T) {
	s := &Server{secret: bytes.Repeat([]byte{7}, 32)}
	sign := func(path, op, user string, exp int64) string {
		raw := path + ":" + op + ":" + user + ":" + s.accessToken("sbx1")
		if exp != 0 {
			raw += ":" + strconv.FormatInt(exp, 10)
		}
		sum := sha256.Sum256([]byte(raw))
		return "v1_" + base64.RawStdEncoding.EncodeToString(sum[:])
	}
	future := time.Now().Add(time.Minute).Unix()
	past := time.Now().Add(-time.Minute).Unix()
	for _, tc := range []struct {
		name, method, query string
		ok                  bool
	}{
		{"read", "GET", "path=a.txt&signature=" + url.QueryEscape(sign("a.txt", "read", "", 0)), true},
		{"read with user and expiry", "GET", fmt.Sprintf("path=a.txt&username=root&signature=%s&signature_expiration=%d", url.QueryEscape(sign("a.txt", "read", "root", future)), future), true},
		{"write signature used to read", "GET", "path=a.txt&signature=" + url.QueryEscape(sign("a.txt", "write", "", 0)), false},
		{"another path", "GET", "path=b.txt&signature=" + url.QueryEscape(sign("a.txt", "read", "", 0)), false},
		{"another user", "GET", "path=a.txt&username=root&signature=" + url.QueryEscape(sign("a.txt", "read", "", 0)), false},
		{"expired", "GET", fmt.Sprintf("path=a.txt&signature=%s&signature_expiration=%d", url.QueryEscape(sign("a.txt", "read", "", past)), past), false},
		{"expiry stripped", "GET", "path=a.txt&signature=" + url.QueryEscape(sign("a.txt", "read", "", future)), false},
		{"write", "POST", "path=a.txt&signature=" + url.QueryEscape(sign("a.txt", "write", "", 0)), true},
		{"no path", "POST", "signature=" + url.QueryEscape(sign("", "write", "", 0)), false},
		{"username twice", "POST", "path=a.txt&username=&username=root&signature=" + url.QueryEscape(sign("a.txt", "write", "", 0)), false},
		{"path twice", "GET", "path=a.txt&path=/root/x&signature=" + url.QueryEscape(sign("a.txt", "read", "", 0)), false},
	} {
		r := httptest.NewRequest(tc.method, "/files?"+tc.query, nil)
		if _, err := s.checkSignature(r, "sbx1"); (err == nil) != tc.ok {
			t.Errorf("%s: checkSignature = %v, want ok=%v", tc.name, err, tc.ok)
		}
	}
	// The user is the signed one: an Authorization header may repeat it
	// but not name another.
	for _, tc := range []struct {
		signed, header, want string
	}{
		{"", "", DefaultUser},
		{"", "Basic " + base64.StdEncoding.EncodeToString([]byte(DefaultUser+":")), DefaultUser},
		{"", "Basic cm9vdDo=", ""}, // root:
		{"root", "Basic cm9vdDo=", "root"},
		{"root", "", "root"},
		{"root", "Basic dXNlcjo=", ""}, // user:
	} {
		q := "path=a.txt&signature=" + url.QueryEscape(sign("a.txt", "write", tc.signed, 0))
		if tc.signed != "" {
			q += "&username=" + tc.signed
		}
		r := httptest.NewRequest("POST", "/files?"+q, nil)
		if tc.header != "" {
			r.Header.Set("Authorization", tc.header)
		}
		g, err := s.checkSignature(r, "sbx1")
		if tc.want == "" {
			if err == nil {
				t.Errorf("signed for %q, Authorization %q: granted %+v, want refused", tc.signed, tc.header, g)
			}
			continue
		}
		if err != nil || g.user != tc.want || g.path != "a.txt" || g.op != "write" {
			t.Errorf("signed for %q, Authorization %q: %+v %v, want user %q", tc.signed, tc.header, g, err, tc.want)
		}
	}
}

func TestParseListFilter(t *testing.T) {
	// The SDK's encoding: each key and value encoded, then the whole
	// query string once more.
	inner := url.Values{url.QueryEscape("team name"): {url.QueryEscape("a&b=c")}}.Encode()
	q := url.Values{"metadata": {inner}, "state": {"running,paused"}}
	f, err := parseListFilter(q, "running")
	if err != nil {
		t.Fatal(err)
	}
	if f.metadata["team name"] != "a&b=c" || !f.states["paused"] || !f.states["running"] {
		t.Fatalf("filter = %+v", f)
	}
	if _, err := parseListFilter(url.Values{"state": {"stopped"}}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("state=stopped: %v", err)
	}
	f, _ = parseListFilter(url.Values{}, "running")
	if !f.states["running"] || f.states["paused"] {
		t.Fatalf("default states = %v", f.states)
	}
}

func TestEndOf(t *testing.T) {
	for _, tc := range []struct {
		in   api.ExitStatus
		want endEvent
	}{
		{api.ExitStatus{ExitCode: 0}, endEvent{ExitCode: 0, Exited: true, Status: "exit status 0"}},
		{api.ExitStatus{ExitCode: 3}, endEvent{ExitCode: 3, Exited: true, Status: "exit status 3"}},
		{api.ExitStatus{ExitCode: 137, Signal: "SIGKILL"}, endEvent{ExitCode: -1, Exited: false, Status: "signal: killed"}},
		{api.ExitStatus{ExitCode: 143, Signal: "SIGTERM"}, endEvent{ExitCode: -1, Exited: false, Status: "signal: terminated"}},
	} {
		got := endOf(tc.in)
		if got.ExitCode != tc.want.ExitCode || got.Exited != tc.want.Exited || got.Status != tc.want.Status {
			t.Errorf("endOf(%+v) = %+v, want %+v", tc.in, *got, tc.want)
		}
	}
}

func envelope(flag byte, msg string) []byte {
	b := make([]byte, 5, 5+len(msg))
	b[0] = flag
	binary.BigEndian.PutUint32(b[1:], uint32(len(msg)))
	return append(b, msg...)
}

func TestStreamEnvelopes(t *testing.T) {
	req := httptest.NewRequest("POST", "/process.Process/Start", bytes.NewReader(envelope(0, `{"process":{"cmd":"ls","args":["-l"]},"unknownField":1}`)))
	req.Header.Set("Content-Type", contentStream)
	w := httptest.NewRecorder()
	var sr startRequest
	st, err := openStream(w, req, &sr)
	if err != nil {
		t.Fatal(err)
	}
	if sr.Process.Cmd != "ls" || len(sr.Process.Args) != 1 {
		t.Fatalf("decoded %+v", sr)
	}
	if err := st.send(processEvent{Event: eventBody{Start: &startEvent{PID: 42}}}); err != nil {
		t.Fatal(err)
	}
	st.send(processEvent{Event: eventBody{Data: &dataEvent{Stdout: []byte("hi\n")}}})
	s := &Server{}
	st.end(s, req, nil)
	if st.send(struct{}{}) == nil {
		t.Fatal("a message after the end was sent")
	}
	body := w.Body.Bytes()
	var got []string
	for len(body) > 0 {
		n := binary.BigEndian.Uint32(body[1:5])
		got = append(got, fmt.Sprintf("%d %s", body[0], body[5:5+n]))
		body = body[5+n:]
	}
	want := []string{`0 {"event":{"start":{"pid":42}}}`, `0 {"event":{"data":{"stdout":"aGkK"}}}`, `2 {}`}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("envelopes\n got %q\nwant %q", got, want)
	}
	if ct := w.Header().Get("Content-Type"); ct != contentStream || w.Code != http.StatusOK {
		t.Fatalf("status %d, content type %q", w.Code, ct)
	}
}

func TestStreamRefusesBadRequests(t *testing.T) {
	for _, tc := range []struct {
		name, ct string
		body     []byte
		code     string
	}{
		{"unary content type", contentUnary, envelope(0, `{}`), "invalid_argument"},
		{"compressed", contentStream, envelope(1, `{}`), "unimplemented"},
		{"truncated", contentStream, envelope(0, `{"a":1}`)[:8], "invalid_argument"},
		{"huge", contentStream, envelope(0, "")[:1], "invalid_argument"},
		{"not JSON", contentStream, envelope(0, `{{`), "invalid_argument"},
	} {
		req := httptest.NewRequest("POST", "/x", bytes.NewReader(tc.body))
		req.Header.Set("Content-Type", tc.ct)
		var v map[string]any
		_, err := openStream(httptest.NewRecorder(), req, &v)
		if got := connectCode(err); err == nil || got != tc.code {
			t.Errorf("%s: err %v (code %q), want %s", tc.name, err, got, tc.code)
		}
	}
	// A length past the limit is refused before anything is read.
	big := make([]byte, 5)
	binary.BigEndian.PutUint32(big[1:], maxMessage+1)
	req := httptest.NewRequest("POST", "/x", bytes.NewReader(big))
	req.Header.Set("Content-Type", contentStream)
	var v map[string]any
	if _, err := openStream(httptest.NewRecorder(), req, &v); connectCode(err) != "resource_exhausted" {
		t.Errorf("oversized message: %v", err)
	}
}

func TestKeepaliveStopsBeforeReturning(t *testing.T) {
	w := httptest.NewRecorder()
	st := &stream{w: w, rc: http.NewResponseController(w)}
	// A loaded host may not run the ticker within one window: try a few
	// (the body is read only once the keepalive has stopped).
	n := 0
	for try := 0; try < 25 && n == 0; try++ {
		stop := st.keepalive(5*time.Millisecond, watchEvent{Keepalive: &struct{}{}})
		time.Sleep(40 * time.Millisecond)
		stop()
		n = w.Body.Len()
	}
	if n == 0 {
		t.Fatal("no keepalive was sent in 25 windows of 40 ms")
	}
	time.Sleep(20 * time.Millisecond)
	if w.Body.Len() != n {
		t.Fatal("a keepalive was written after stop returned")
	}
	if !bytes.HasPrefix(w.Body.Bytes()[5:], []byte(`{"keepalive":{}}`)) {
		t.Fatalf("keepalive message: %q", w.Body.Bytes())
	}
}
