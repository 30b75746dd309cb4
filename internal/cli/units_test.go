package cli

import "testing"

func TestParseSize(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		ok   bool
	}{
		{"512m", 512 << 20, true}, {"1g", 1 << 30, true}, {"1.5G", 3 << 29, true},
		{"64MiB", 64 << 20, true}, {"1024", 1024, true}, {"2k", 2048, true},
		{"", 0, false}, {"-1g", 0, false}, {"lots", 0, false}, {"1e30", 0, false},
	} {
		got, err := parseSize(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("parseSize(%q) = %d, %v", tc.in, got, err)
		}
	}
}
