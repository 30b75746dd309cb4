package mountinfo

import "testing"

func TestUnescape(t *testing.T) {
	for in, want := range map[string]string{
		"/plain":         "/plain",
		`/a\040b`:        "/a b",
		`/tab\011x\012y`: "/tab\tx\ny",
		`/back\134slash`: `/back\slash`,
		`/short\04`:      `/short\04`,
		`/not\0a8`:       `/not\0a8`,
		`/overflow\777`:  `/overflow\777`,
		`\040`:           " ",
		`/end\`:          `/end\`,
	} {
		if got := Unescape(in); got != want {
			t.Errorf("Unescape(%q) = %q, want %q", in, got, want)
		}
	}
}
