package egress

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io"
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzScrub: a secret written in any form the scrubber claims (see
// secretForms), between any bytes and read in chunks of any size, does
// not survive the scrubber: neither that form nor the raw value is in
// its output.
func FuzzScrub(f *testing.F) {
	f.Fuzz(func(t *testing.T, secret string, form uint8, recipe, prefix, suffix []byte, chunk uint8) {
		if len(secret) < 6 || len(secret) > 256 || !utf8.ValidString(secret) || strings.ContainsRune(secret, 0) {
			return
		}
		// A placeholder of NULs: no form of the secret holds one, so a
		// match cannot be made up of a replacement and its neighbours.
		ph := strings.Repeat("\x00", 8)
		var encoded, check string
		kind := form % 6
		switch kind {
		case 0:
			encoded = secret
		case 1:
			encoded = mixedEscapes(secret, recipe)
		case 2, 3:
			enc := base64.StdEncoding
			if kind == 3 {
				enc = base64.RawURLEncoding
			}
			off := 0
			if len(recipe) > 0 {
				off = int(recipe[0] % 3)
			}
			encoded = enc.EncodeToString(append(bytes.Repeat([]byte{'k'}, off), secret...))
			check = base64Core(enc, secret, off)
			prefix, suffix = outside(prefix, base64Alphabet), outside(suffix, base64Alphabet)
		case 4, 5:
			encoded = hex.EncodeToString([]byte(secret))
			if kind == 5 {
				encoded = strings.ToUpper(encoded)
			}
			prefix, suffix = outside(prefix, "0123456789abcdefABCDEF"), outside(suffix, "0123456789abcdefABCDEF")
		}
		if check == "" {
			check = encoded
		}
		in := string(prefix) + encoded + string(suffix)
		src := &chunkReader{b: []byte(in), n: int(chunk%64) + 1}
		out, err := io.ReadAll(newScrubber(io.NopCloser(src), secretForms(secret, ph, "")))
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(out, []byte(check)) {
			t.Fatalf("form %d %q of %q survived: %q", kind, check, secret, out)
		}
		if kind < 2 && bytes.Contains(out, []byte(secret)) {
			t.Fatalf("%q survived in %q", secret, out)
		}
	})
}

const base64Alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/-_="

// outside replaces the bytes of b that are in set with '.'.
func outside(b []byte, set string) []byte {
	out := bytes.Clone(b)
	for i, c := range out {
		if strings.IndexByte(set, c) >= 0 {
			out[i] = '.'
		}
	}
	return out
}

// mixedEscapes writes each rune of s in the escape recipe picks for it.
func mixedEscapes(s string, recipe []byte) string {
	var b strings.Builder
	i := 0
	for _, r := range s {
		pick := byte(0)
		if i < len(recipe) {
			pick = recipe[i]
		}
		i++
		var buf [utf8.UTFMax]byte
		n := utf8.EncodeRune(buf[:], r)
		switch pick % 9 {
		case 0:
			b.WriteRune(r)
		case 1:
			for _, c := range buf[:n] {
				fmt.Fprintf(&b, "%%%02X", c)
			}
		case 2:
			for _, c := range buf[:n] {
				fmt.Fprintf(&b, "%%%02x", c)
			}
		case 3, 4:
			format := `\u%04x`
			if pick%9 == 4 {
				format = `\u%04X`
			}
			if r >= 0x10000 {
				fmt.Fprintf(&b, format+format, 0xd800+((r-0x10000)>>10), 0xdc00+((r-0x10000)&0x3ff))
			} else {
				fmt.Fprintf(&b, format, r)
			}
		case 5:
			fmt.Fprintf(&b, "&#%d;", r)
		case 6:
			fmt.Fprintf(&b, "&#x%x;", r)
		case 7:
			if short, ok := jsonShort[r]; ok {
				b.WriteString(short)
			} else if named, ok := htmlNamed[r]; ok {
				b.WriteString(strings.ToUpper(named))
			} else {
				b.WriteRune(r)
			}
		case 8:
			if r < 0x100 {
				fmt.Fprintf(&b, `\x%02x`, r)
			} else {
				b.WriteRune(r)
			}
		}
	}
	return b.String()
}

// chunkReader reads b n bytes at a time.
type chunkReader struct {
	b []byte
	n int
}

func (c *chunkReader) Read(p []byte) (int, error) {
	if len(c.b) == 0 {
		return 0, io.EOF
	}
	m := copy(p[:min(len(p), c.n)], c.b)
	c.b = c.b[m:]
	return m, nil
}

// BenchmarkScrub: the scrubber over a 1 MiB answer of a bound host with
// one secret's forms, in 32 KiB reads.
func BenchmarkScrub(b *testing.B) {
	body := bytes.Repeat([]byte(`{"id":12345,"name":"some/path+value","note":"lorem ipsum dolor sit amet"},`), 1<<20/74)
	reps := secretForms(formSecret, "paddock-secret-0123456789abcdef0123456789abcdef", "")
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		io.Copy(io.Discard, newScrubber(io.NopCloser(&chunkReader{b: body, n: 32 << 10}), reps))
	}
}
