package test

import (
	"strconv"
	"strings"
	"testing"
)

// pingProgram opens a raw ICMP socket (which needs CAP_NET_RAW) and then
// pings 127.0.0.1 through an unprivileged ICMP echo socket, as ping does
// without the capability.
const pingProgram = `
import socket, struct
try:
    socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
    print("raw: opened")
except OSError as e:
    print("raw:", e.strerror)
try:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP)
    s.settimeout(5)
    s.sendto(struct.pack("!BBHHH", 8, 0, 0, 0, 1) + b"paddock", ("127.0.0.1", 0))
    data, _ = s.recvfrom(1024)
    print("echo:", "reply" if data[0] == 0 and data.endswith(b"paddock") else data)
except OSError as e:
    print("echo:", e.strerror)
`

// TestNoRawSocketsPingWorks: sandboxes do not get CAP_NET_RAW (no raw or
// packet sockets to craft or sniff frames with), and ping still works,
// through the ICMP echo sockets the guest allows in the sandbox's network
// namespace; with and without the egress network, on both tiers.
func TestNoRawSocketsPingWorks(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"network", nil},
		{"no network", []string{"--no-network"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := tierDaemon(t, append([]string{"--warm-guests", "0"}, tc.args...)...)
			forTiers(t, func(t *testing.T, tier string) {
				id := d.createCLI("--runtime", tier)
				out := d.run(id, "", "python3", "-c", pingProgram)
				if out.Stdout != "raw: Operation not permitted\necho: reply\n" {
					t.Errorf("want raw sockets refused and an ICMP echo answered: %s", out)
				}
				// Bit 13 of the bounding set is CAP_NET_RAW.
				st := d.run(id, "", "grep", "CapBnd", "/proc/self/status")
				f := strings.Fields(st.Stdout)
				if len(f) != 2 {
					t.Fatalf("no bounding set in %q", st.Stdout)
				}
				if bnd, err := strconv.ParseUint(f[1], 16, 64); err != nil || bnd&(1<<13) != 0 {
					t.Errorf("bounding set %q holds CAP_NET_RAW (%v)", st.Stdout, err)
				}
			})
		})
	}
}
