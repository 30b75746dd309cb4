package native

import (
	"io"
	"net"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// TestActivatingConnHalfCloses: a connection dialled while its guest
// activated is kept and may carry a port pipe later; its half-close must
// reach the peer (EOF there) while the peer can still answer.
func TestActivatingConnHalfCloses(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	var conns [2]net.Conn
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "pair")
		conns[i], err = net.FileConn(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		defer conns[i].Close()
	}
	var c net.Conn = &activatingConn{Conn: conns[0], sb: &Sandbox{}}
	cw, ok := c.(interface{ CloseWrite() error })
	if !ok {
		t.Fatal("activatingConn cannot half-close")
	}
	if _, err := io.WriteString(c, "last words"); err != nil {
		t.Fatal(err)
	}
	if err := cw.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(conns[1])
	if err != nil || string(got) != "last words" {
		t.Fatalf("peer read %q, %v; want the words and EOF", got, err)
	}
	if _, err := io.WriteString(conns[1], "answer"); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 6)
	if _, err := io.ReadFull(conns[0], buf); err != nil || string(buf) != "answer" {
		t.Fatalf("after the half-close read %q, %v", buf, err)
	}
}
