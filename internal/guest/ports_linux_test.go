package guest

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/guestapi"
	"github.com/paddock-dev/paddock/wire"
)

// freePort returns a loopback port that nothing listens on (it was just
// free; tests use it at once).
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	return port
}

// echoServer listens on the loopback and, for each connection, writes
// banner (if any), then echoes until EOF and closes.
func echoServer(t *testing.T, network, addr, banner string) int {
	t.Helper()
	ln, err := net.Listen(network, addr)
	if err != nil {
		t.Skipf("listening on %s %s: %v", network, addr, err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				if banner != "" {
					c.Write([]byte(banner))
				}
				io.Copy(c, c)
				c.(*net.TCPConn).CloseWrite()
			}()
		}
	}()
	return ln.Addr().(*net.TCPAddr).Port
}

func TestDialLoopback(t *testing.T) {
	v4 := echoServer(t, "tcp4", "127.0.0.1:0", "")
	refused := freePort(t)
	for _, tc := range []struct {
		name string
		port int
		want error
	}{
		{"listening", v4, nil},
		{"refused", refused, errdefs.ErrNotFound},
		{"zero", 0, errdefs.ErrInvalid},
		{"negative", -1, errdefs.ErrInvalid},
		{"too big", 70000, errdefs.ErrInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := dialLoopback(tc.port)
			if c != nil {
				c.Close()
			}
			if !errors.Is(err, tc.want) && !(tc.want == nil && err == nil) {
				t.Fatalf("dialLoopback(%d) = %v, want %v", tc.port, err, tc.want)
			}
			if tc.want == errdefs.ErrInvalid && !strings.Contains(err.Error(), "port") {
				t.Errorf("error %q does not name the port", err)
			}
		})
	}
}

// TestDialLoopbackIPv6 reaches a server that listens on ::1 only.
func TestDialLoopbackIPv6(t *testing.T) {
	port := echoServer(t, "tcp6", "[::1]:0", "")
	c, err := dialLoopback(port)
	if err != nil {
		t.Fatalf("dialLoopback(%d) with a server on [::1]: %v", port, err)
	}
	c.Close()
}

// guestOnSocket serves the control protocol on a unix socket, as the guest
// does, and returns a Client of it.
func guestOnSocket(t *testing.T) *guestapi.Client {
	t.Helper()
	path := filepath.Join(t.TempDir(), "guest.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	s := &server{}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go s.handle(c)
		}
	}()
	return guestapi.NewClient(func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", path)
	})
}

// TestDialPort goes through the op as the daemon does: the server's first
// bytes, which arrive with the response frame, are not lost; bytes flow
// both ways; a half-close reaches the TCP server, whose answer and EOF
// come back.
func TestDialPort(t *testing.T) {
	gc := guestOnSocket(t)
	port := echoServer(t, "tcp4", "127.0.0.1:0", "banner\n")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := gc.DialPort(ctx, port)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(conn)
	line, err := br.ReadString('\n')
	if err != nil || line != "banner\n" {
		t.Fatalf("first line = %q, %v; want the server's banner", line, err)
	}
	if _, err := conn.Write([]byte("ping\n")); err != nil {
		t.Fatal(err)
	}
	if line, err = br.ReadString('\n'); err != nil || line != "ping\n" {
		t.Fatalf("echo = %q, %v", line, err)
	}
	if _, err := conn.Write([]byte("last")); err != nil {
		t.Fatal(err)
	}
	if err := conn.(interface{ CloseWrite() error }).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	rest, err := io.ReadAll(br)
	if err != nil || string(rest) != "last" {
		t.Fatalf("after half-close read %q, %v; want \"last\" then EOF", rest, err)
	}
}

func TestDialPortErrors(t *testing.T) {
	gc := guestOnSocket(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	port := freePort(t)
	_, err := gc.DialPort(ctx, port)
	if !errors.Is(err, errdefs.ErrNotFound) || !strings.Contains(err.Error(), "nothing listens on port") {
		t.Errorf("DialPort to a closed port = %v, want not found: nothing listens", err)
	}
	// The guest validates too, for a client that skips the check.
	s := &server{}
	if e := rawRequest(t, s, guestapi.Request{Op: guestapi.OpPortConnect, Port: &guestapi.PortRequest{Port: 99999}}); e == nil || e.Code != "invalid_argument" || !strings.Contains(e.Message, "port") {
		t.Errorf("port.connect 99999 = %+v, want invalid port", e)
	}
	if e := rawRequest(t, s, guestapi.Request{Op: guestapi.OpPortConnect}); e == nil || e.Code != "invalid_argument" {
		t.Errorf("port.connect without a port = %+v, want invalid", e)
	}
}

// rawRequest sends req to s as it is, without the client's checks, and
// returns the error the guest answers with.
func rawRequest(t *testing.T, s *server, req guestapi.Request) *api.Error {
	t.Helper()
	ours, theirs := socketPair(t)
	go s.handle(theirs)
	ours.SetDeadline(time.Now().Add(10 * time.Second))
	if err := wire.NewWriter(ours).WriteJSON(wire.Request, req); err != nil {
		t.Fatal(err)
	}
	f, err := wire.NewReader(ours).Read()
	if err != nil || f.Type != wire.Response {
		t.Fatalf("reading the answer to %s: frame %d, %v", req.Op, f.Type, err)
	}
	var resp guestapi.Response
	if err := json.Unmarshal(f.Payload, &resp); err != nil {
		t.Fatal(err)
	}
	return resp.Error
}

// TestDialPortKeepsBufferedBytes: bytes that arrive in the same read as
// the response frame sit in the frame reader's buffer; the raw pipe must
// hand them out first.
func TestDialPortKeepsBufferedBytes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fake.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		if _, err := wire.NewReader(c).Read(); err != nil {
			return
		}
		b := wire.AppendFrame(nil, wire.Response, []byte(`{}`))
		b = append(b, "early bytes"...)
		c.Write(b) // one write: the client's buffered read takes both
		c.Write([]byte(" and later ones"))
	}()
	gc := guestapi.NewClient(func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", path)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := gc.DialPort(ctx, 80)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, ok := conn.(*net.UnixConn); ok {
		t.Logf("the early bytes were not buffered (%T); the test proves less", conn)
	}
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	got, err := io.ReadAll(conn)
	if err != nil || string(got) != "early bytes and later ones" {
		t.Fatalf("read %q, %v", got, err)
	}
}
