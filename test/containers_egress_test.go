package test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/client"
)

// tinyproxyConf makes Debian's tinyproxy a transparent proxy on 8888 that
// allows everything and logs every request.
const tinyproxyConf = `Port 8888
Timeout 20
MaxClients 50
LogFile "/tmp/tinyproxy.log"
LogLevel Info
DisableViaHeader Yes
`

// TestContainersEgressSidecar: a container with the egress role (Debian's
// tinyproxy, transparent) gets every outbound connection of the other
// containers, and its access log lists each request; its own connections
// still meet the sandbox's policy, so a host the policy denies stays
// denied though the sidecar allows everything.
func TestContainersEgressSidecar(t *testing.T) {
	t.Parallel()
	if _, err := os.Stat("/usr/bin/tinyproxy"); err != nil {
		t.Skip("needs Debian's tinyproxy (apt-get install tinyproxy-bin)")
	}
	u := newUpstream(t, map[string]string{"allowed.test": "", "denied.test": ""})
	d := netDaemon(t, u)
	id := d.Create(api.CreateRequest{
		Policy: &api.Policy{Allow: []api.PolicyRule{{Match: "allowed.test"}}},
		Containers: []api.Container{
			{Name: "agent"},
			{Name: "tools", Image: "base"},
			{Name: "proxy", Role: api.RoleEgress, EgressPort: 8888, Command: []string{"sh", "-c",
				"printf '" + tinyproxyConf + "' > /tmp/tinyproxy.conf && exec tinyproxy -d -c /tmp/tinyproxy.conf"}},
		},
	})
	// The proxy listens once its command has run.
	deadline := time.Now().Add(30 * time.Second)
	for d.groupExec(id, "proxy", "sh", "-c", "grep -q 'Accepting connections' /tmp/tinyproxy.log").ExitCode != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("tinyproxy did not start: %s", d.groupExec(id, "proxy", "sh", "-c", "cat /tmp/tinyproxy.log"))
		}
		time.Sleep(100 * time.Millisecond)
	}

	curl := func(container string, args ...string) execResult {
		return d.groupExec(id, container, append([]string{"curl", "-sS", "--max-time", "10", "--noproxy", "*"}, args...)...)
	}
	// Through the sidecar, to a host the policy allows: from the host
	// image and from the base image.
	mustSay(t, curl("agent", "http://allowed.test/from-agent"), "hello from allowed.test GET /from-agent")
	mustSay(t, curl("tools", "http://allowed.test/from-tools"), "hello from allowed.test GET /from-tools")
	// Denied by the policy, allowed by the sidecar: a name (the agent's
	// resolver refuses it, so nothing connects), the denied host's name
	// on its address (the sidecar's resolver refuses it) and the address
	// alone (paddock's proxy refuses the sidecar's connection).
	mustFail(t, curl("agent", "http://denied.test/by-name"), "a denied name through the sidecar")
	for _, r := range []execResult{
		curl("agent", "-H", "Host: denied.test", "http://"+u.IP+"/by-addr"),
		curl("tools", "http://"+u.IP+"/by-ip"),
	} {
		if strings.Contains(r.Stdout, "hello from") {
			t.Fatalf("a denied host through the sidecar was reached: %s", r)
		}
	}
	// The sidecar's own connections meet the policy too.
	mustSay(t, curl("proxy", "http://allowed.test/from-proxy"), "hello from allowed.test GET /from-proxy")
	if r := curl("proxy", "-H", "Host: denied.test", "http://"+u.IP+"/proxy-denied"); !strings.Contains(r.Stdout, "paddock egress: denied") {
		t.Fatalf("a denied host from the sidecar: want paddock's refusal: %s", r)
	}

	// The sidecar saw every request of the other containers, and the
	// upstream only the allowed ones.
	log := d.groupExec(id, "proxy", "cat", "/tmp/tinyproxy.log").Stdout
	for _, want := range []string{"/from-agent", "/from-tools", "/by-addr", "/by-ip"} {
		if !strings.Contains(log, want) {
			t.Errorf("the sidecar's log lacks %s:\n%s", want, log)
		}
	}
	if strings.Contains(log, "/from-proxy") || strings.Contains(log, "/proxy-denied") {
		t.Errorf("the sidecar's own requests went through itself:\n%s", log)
	}
	for _, req := range u.requests() {
		if req.Host != "allowed.test" {
			t.Errorf("the upstream got a request for %s %s", req.Host, req.URL.Path)
		}
	}

	// Localhost stays the sandbox's own: a service in one container is
	// reached from another directly, not through the sidecar.
	d.groupExec(id, "tools", "sh", "-c", "python3 -m http.server 8124 --bind 127.0.0.1 >/dev/null 2>&1 &")
	deadline = time.Now().Add(20 * time.Second)
	for curl("agent", "-o", "/dev/null", "http://127.0.0.1:8124/local-call").ExitCode != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the tools container's server is not reachable on localhost")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if log := d.groupExec(id, "proxy", "cat", "/tmp/tinyproxy.log").Stdout; strings.Contains(log, "/local-call") {
		t.Errorf("a call on localhost went through the sidecar:\n%s", log)
	}
}

// TestContainersEgressRefused: what an egress role refuses, with a clear
// error, and the daemon serves on.
func TestContainersEgressRefused(t *testing.T) {
	t.Parallel()
	d := newDaemon(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, tc := range []struct {
		name string
		cs   []api.Container
		want string
	}{
		{"unknown role", []api.Container{{Name: "a"}, {Name: "b", Role: "ingress"}}, "role"},
		{"no port", []api.Container{{Name: "a"}, {Name: "b", Role: api.RoleEgress}}, "egress_port"},
		{"port too high", []api.Container{{Name: "a"}, {Name: "b", Role: api.RoleEgress, EgressPort: 70000}}, "egress_port"},
		{"port without role", []api.Container{{Name: "a"}, {Name: "b", EgressPort: 3128}}, "egress_port"},
		{"two sidecars", []api.Container{{Name: "a", Role: api.RoleEgress, EgressPort: 1}, {Name: "b", Role: api.RoleEgress, EgressPort: 2}}, "at most one"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := d.Client().Create(ctx, api.CreateRequest{Containers: tc.cs})
			if !errors.Is(err, client.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("create: %v; want invalid naming %s", err, tc.want)
			}
		})
	}
	d.Create(api.CreateRequest{})
}
