package egress

import (
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"unicode/utf8"
)

// The forms of a secret scrubbed from the answers of a host that may have
// received it (headers, trailers and body, and upgraded streams):
//
//   - the value with every character in any of its common escapes, mixed
//     freely: raw; percent-encoded in either case (+ for a space); JSON
//     (\uXXXX in either case, surrogate pairs, \/ and the short escapes);
//     JavaScript/Python \xHH; HTML numeric references (&#43; &#x2B;, up to
//     four leading zeros, ; optional) and the named ones for & < > " ';
//   - base64 (standard and URL alphabets, padded or not) of the value at
//     any of the three alignments, so that it is found inside a longer
//     encoded blob (as in basic credentials, or a JWT), and of user:value
//     for basic injection;
//   - hexadecimal, either case.
//
// Not scrubbed: encodings stacked on each other (base64 of JSON of the
// value, percent-encoding twice), compressions (the proxy asks for none
// and refuses an encoded answer), and transformations that are not
// encodings (a hash, a substring, a reversal). The escaped forms are built
// for values up to maxEscapedSecret bytes of UTF-8; another is scrubbed raw,
// percent-encoded, in base64 and in hex only. The base64 of a value within
// a blob is found only for values of 6 bytes or more (shorter ones would
// match unrelated text).
//
// A match is replaced by the placeholder in the same form where that is
// one string (raw, base64 of the whole value, hex), by the placeholder
// where the form is an escape, by as many "A"s inside base64 (which keeps
// the blob decodable), and by as many "*"s in an upgraded stream, whose
// frames carry lengths.
const maxEscapedSecret = 4 << 10

// secretForms returns the replacements that scrub value, whose
// placeholder is ph; user is the basic-auth user of a basic injection
// ("" for none).
func secretForms(value, ph, user string) []replacement {
	var reps []replacement
	seen := map[string]bool{}
	add := func(old, new string) {
		if old == "" || old == new || seen[old] {
			return
		}
		seen[old] = true
		reps = append(reps, replacement{old: []byte(old), new: []byte(new)})
	}
	if len(value) <= maxEscapedSecret && utf8.ValidString(value) {
		re, longest := escapedPattern(value)
		rep := replacement{re: regexp.MustCompile("^" + re), starts: escapeStarts(value), longest: longest, new: []byte(ph)}
		// The shortcut holds only where the first byte cannot also begin
		// an escape of the first character ("%25" is an escaped '%').
		if first, n := utf8.DecodeRuneInString(value); n == 1 && len(value) > 1 && !strings.ContainsRune(` %\&`, first) {
			rep.lit, rep.next = value[0], escapeStarts(value[1:])
		}
		reps = append(reps, rep)
	} else {
		add(value, ph)
		add(url.QueryEscape(value), ph)
		add(url.PathEscape(value), ph)
	}
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding} {
		add(enc.EncodeToString([]byte(value)), enc.EncodeToString([]byte(ph)))
		if user != "" {
			add(enc.EncodeToString([]byte(user+":"+value)), enc.EncodeToString([]byte(user+":"+ph)))
		}
		if len(value) < 6 {
			continue
		}
		for off := 0; off < 3; off++ {
			core := base64Core(enc, value, off)
			add(core, strings.Repeat("A", len(core)))
		}
	}
	add(hex.EncodeToString([]byte(value)), hex.EncodeToString([]byte(ph)))
	add(strings.ToUpper(hex.EncodeToString([]byte(value))), strings.ToUpper(hex.EncodeToString([]byte(ph))))
	return reps
}

// escapeStarts is every byte an escape of s's first character begins
// with (see runeEscapes).
func escapeStarts(s string) string {
	starts := s[:1] + `%\&`
	if s[0] == ' ' {
		starts += "+"
	}
	return starts
}

// base64Core is the part of the base64 of value, placed off bytes into an
// encoded stream, that value alone decides: the same whatever surrounds it.
func base64Core(enc *base64.Encoding, value string, off int) string {
	raw := enc.WithPadding(base64.NoPadding).EncodeToString(append(make([]byte, off), value...))
	from := (8*off + 5) / 6
	to := 8 * (off + len(value)) / 6
	return raw[from:to]
}

// escapedPattern is the regular expression of value with each character
// in any of its escapes, and the longest text it matches.
func escapedPattern(value string) (string, int) {
	var b strings.Builder
	longest := 0
	for _, r := range value {
		alts, n := runeEscapes(r)
		b.WriteString("(?:" + strings.Join(alts, "|") + ")")
		longest += n
	}
	return b.String(), longest
}

// runeEscapes lists the patterns of one character and the longest text
// one of them matches.
func runeEscapes(r rune) ([]string, int) {
	var alts []string
	longest := 0
	alt := func(pattern string, n int) {
		alts = append(alts, pattern)
		longest = max(longest, n)
	}
	var buf [utf8.UTFMax]byte
	n := utf8.EncodeRune(buf[:], r)
	alt(regexp.QuoteMeta(string(buf[:n])), n)
	var pct strings.Builder
	for _, c := range buf[:n] {
		pct.WriteString("%" + hexCI(fmt.Sprintf("%02x", c)))
	}
	alt(pct.String(), 3*n)
	if r == ' ' {
		alt(`\+`, 1)
	}
	if r < 0x10000 {
		alt(`\\u`+hexCI(fmt.Sprintf("%04x", r)), 6)
	} else {
		hi, lo := 0xd800+((r-0x10000)>>10), 0xdc00+((r-0x10000)&0x3ff)
		alt(`\\u`+hexCI(fmt.Sprintf("%04x", hi))+`\\u`+hexCI(fmt.Sprintf("%04x", lo)), 12)
	}
	if r < 0x100 {
		alt(`\\x`+hexCI(fmt.Sprintf("%02x", r)), 4)
	}
	if short, ok := jsonShort[r]; ok {
		alt(regexp.QuoteMeta(short), 2)
	}
	dec := fmt.Sprintf("%d", r)
	alt("&#0{0,4}"+dec+";?", 3+4+len(dec))
	hx := fmt.Sprintf("%x", r)
	alt("&#[xX]0{0,4}"+hexCI(hx)+";?", 4+4+len(hx))
	if named, ok := htmlNamed[r]; ok {
		alt("(?i:"+regexp.QuoteMeta(named)+")", len(named))
	}
	return alts, longest
}

var jsonShort = map[rune]string{'"': `\"`, '\\': `\\`, '/': `\/`, '\b': `\b`, '\f': `\f`, '\n': `\n`, '\r': `\r`, '\t': `\t`}

var htmlNamed = map[rune]string{'&': "&amp;", '<': "&lt;", '>': "&gt;", '"': "&quot;", '\'': "&apos;"}

// hexCI is hex digits matched in either case.
func hexCI(h string) string {
	var b strings.Builder
	for _, c := range h {
		if c >= 'a' && c <= 'f' {
			b.WriteString("[" + string(c) + string(c-'a'+'A') + "]")
		} else {
			b.WriteRune(c)
		}
	}
	return b.String()
}
