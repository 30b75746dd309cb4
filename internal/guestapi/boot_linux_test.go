package guestapi

import (
	"bytes"
	"encoding/binary"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

func TestConfigPacket(t *testing.T) {
	filter := bytes.Repeat([]byte{1, 2, 3, 4, 5, 6, 7, 8}, 1301)
	cfg := &Config{Prepare: &Prepare{Hostname: "box", Seccomp: filter, Caps: []string{"CAP_CHOWN"}}}
	b, err := encodeConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(b[:len(b)-len(filter)], []byte("seccomp")) {
		t.Errorf("the filter went into the JSON: %q", b[:len(b)-len(filter)])
	}
	got, err := decodeConfig(b)
	if err != nil {
		t.Fatal(err)
	}
	if got.Prepare == nil || got.Prepare.Hostname != "box" || !bytes.Equal(got.Prepare.Seccomp, filter) {
		t.Fatalf("round trip: got %+v", got.Prepare)
	}
	// No filter: an Activate alone.
	b, err = encodeConfig(&Config{Activate: &Activate{Serve: ServeConfig{Workdir: "/w"}}})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := decodeConfig(b); err != nil || got.Activate == nil || got.Activate.Serve.Workdir != "/w" || got.Prepare != nil {
		t.Fatalf("activate: got %+v, %v", got, err)
	}

	withLen := func(n uint32, rest string) []byte {
		b := binary.LittleEndian.AppendUint32(nil, n)
		return append(b, rest...)
	}
	for name, pkt := range map[string][]byte{
		"empty":                  nil,
		"short header":           {1, 0},
		"length past the packet": withLen(100, `{}`),
		"length wraps":           withLen(^uint32(0), `{}`),
		"bad JSON":               withLen(2, `{x`),
		"filter without prepare": withLen(2, `{}filter!`),
		"filter with activate":   withLen(15, `{"activate":{}}abcdefgh`),
	} {
		t.Run(name, func(t *testing.T) {
			if cfg, err := decodeConfig(pkt); err == nil {
				t.Errorf("decoded %+v", cfg)
			}
		})
	}
}

func TestConfigOverSocket(t *testing.T) {
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	a, b := os.NewFile(uintptr(pair[0]), "a"), os.NewFile(uintptr(pair[1]), "b")
	defer a.Close()
	defer b.Close()
	filter := bytes.Repeat([]byte{6, 0, 0, 0, 0, 0, 0xff, 0x7f}, 1301)
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer devnull.Close()
	if err := SendConfig(a, &Config{Prepare: &Prepare{Hostname: "h", Seccomp: filter, OOMFD: 0}}, []int{int(devnull.Fd())}); err != nil {
		t.Fatal(err)
	}
	cfg, fds, err := ReceiveConfig(b)
	if err != nil {
		t.Fatal(err)
	}
	for _, fd := range fds {
		unix.Close(fd)
	}
	if len(fds) != 1 || cfg.Prepare == nil || cfg.Prepare.Hostname != "h" || !bytes.Equal(cfg.Prepare.Seccomp, filter) {
		t.Fatalf("got %d fds, %+v", len(fds), cfg.Prepare)
	}
}
