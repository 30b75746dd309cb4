package egress

import (
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"strings"
	"testing"
	"testing/iotest"
)

// chunky returns a reader that hands out b in random small pieces.
func chunky(b []byte, seed uint64) io.Reader {
	r := rand.New(rand.NewPCG(seed, seed))
	var parts []io.Reader
	for len(b) > 0 {
		n := min(len(b), 1+r.IntN(70))
		parts = append(parts, iotest.OneByteReader(bytes.NewReader(b[:n])), bytes.NewReader(b[:0]))
		if r.IntN(2) == 0 {
			parts[len(parts)-2] = bytes.NewReader(b[:n])
		}
		b = b[n:]
	}
	return io.MultiReader(parts...)
}

func TestPlaceholderScanner(t *testing.T) {
	ph := placeholder([]byte("k"), "sb", "TOKEN")
	other := placeholder([]byte("k"), "sb", "OTHER")
	forbidden := map[string]string{ph: "TOKEN"}
	for seed := uint64(0); seed < 50; seed++ {
		clean := bytes.Repeat([]byte("abc paddock-secret- "+other+" xyz "), 2000)
		got, err := io.ReadAll(newPlaceholderScanner(chunky(clean, seed), forbidden))
		if err != nil || !bytes.Equal(got, clean) {
			t.Fatalf("seed %d: clean body changed (%v, %d of %d bytes)", seed, err, len(got), len(clean))
		}
		dirty := append(bytes.Repeat([]byte("x"), int(seed)*997), []byte("key="+ph+"&rest")...)
		got, err = io.ReadAll(newPlaceholderScanner(chunky(dirty, seed), forbidden))
		var pe *errPlaceholder
		if !errors.As(err, &pe) || pe.name != "TOKEN" {
			t.Fatalf("seed %d: err = %v", seed, err)
		}
		if bytes.Contains(got, []byte(ph[:len(ph)-1])) || bytes.Contains(got, []byte(ph[1:])) {
			t.Fatalf("seed %d: part of the placeholder was released", seed)
		}
	}
}

func TestScrubber(t *testing.T) {
	reps := []replacement{
		{old: []byte("s3cr3t-value"), new: []byte("paddock-secret-0123")},
		{old: []byte("czNjcjN0LXZhbHVl"), new: []byte("B64")},
		{old: []byte("s3cr3t-value-long"), new: []byte("LONG")},
	}
	var in, want bytes.Buffer
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 3000; i++ {
		switch r.IntN(5) {
		case 0:
			in.WriteString("s3cr3t-value")
			want.WriteString("paddock-secret-0123")
		case 1:
			in.WriteString("czNjcjN0LXZhbHVl")
			want.WriteString("B64")
		case 2:
			in.WriteString("s3cr3t-value-long")
			want.WriteString("LONG")
		case 3:
			in.WriteString("s3cr3t-valu") // almost
			want.WriteString("s3cr3t-valu")
		default:
			s := strings.Repeat("ab", r.IntN(40))
			in.WriteString(s)
			want.WriteString(s)
		}
	}
	for seed := uint64(0); seed < 30; seed++ {
		got, err := io.ReadAll(newScrubber(io.NopCloser(chunky(in.Bytes(), seed)), reps))
		if err != nil || !bytes.Equal(got, want.Bytes()) {
			t.Fatalf("seed %d: scrubbed output differs (%v)", seed, err)
		}
		if bytes.Contains(got, []byte("s3cr3t-value")) {
			t.Fatal("the secret got through")
		}
	}
}

func TestParseClientHello(t *testing.T) {
	for _, tc := range []struct {
		name string
		alpn []string
	}{{"api.example.com", []string{"h2", "http/1.1"}}, {"", nil}} {
		a, b := net.Pipe()
		go func() {
			tls.Client(a, &tls.Config{ServerName: tc.name, NextProtos: tc.alpn, InsecureSkipVerify: tc.name == ""}).Handshake()
			a.Close()
		}()
		var buf []byte
		tmp := make([]byte, 100) // small reads: the parser must ask for more
		for {
			n, err := b.Read(tmp)
			buf = append(buf, tmp[:n]...)
			h, perr := parseClientHello(buf)
			if perr == errNeedMore && err == nil {
				continue
			}
			if perr != nil {
				t.Fatalf("%q: %v", tc.name, perr)
			}
			if h.serverName != tc.name || strings.Join(h.alpn, ",") != strings.Join(tc.alpn, ",") {
				t.Fatalf("parsed %+v", h)
			}
			break
		}
		b.Close()
	}
	for _, bad := range [][]byte{[]byte("GET / HTTP/1.1\r\n"), {0x16, 3, 1, 0, 4, 2, 0, 0, 0}, {0x16, 3, 1, 0, 0}} {
		if _, err := parseClientHello(bad); err != errNotHello {
			t.Errorf("parseClientHello(%q) = %v", bad, err)
		}
	}
	for in, want := range map[string]Kind{"GET / HTTP/1.1\r\n": KindHTTP, "CONNECT a:443 ": KindHTTP, "SSH-2.0-OpenSSH\r\n": KindTCP, "\x00\x01": KindTCP, "get / ": KindTCP} {
		if k, _, done := classify([]byte(in)); !done || k != want {
			t.Errorf("classify(%q) = %v %v", in, k, done)
		}
	}
	if _, _, done := classify([]byte("GE")); done {
		t.Error("classify decided on two letters")
	}
}
