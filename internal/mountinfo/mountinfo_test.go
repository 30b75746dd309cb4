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

func TestParse(t *testing.T) {
	for _, c := range []struct {
		line string
		want Mount
		ok   bool
	}{
		{"46 27 0:40 / /run/paddock rw,nosuid,nodev,relatime - tmpfs paddock-run rw,mode=711",
			Mount{Root: "/", Point: "/run/paddock", FSType: "tmpfs", Source: "paddock-run", SuperOpts: "rw,mode=711"}, true},
		// Optional fields before the separator, escapes in the paths.
		{`35 24 0:30 /sub /sys/fs/cgroup/a\040b rw shared:9 master:2 - cgroup cg\134x rw,cpu,cpuacct`,
			Mount{Root: "/sub", Point: "/sys/fs/cgroup/a b", FSType: "cgroup", Source: `cg\x`, SuperOpts: "rw,cpu,cpuacct"}, true},
		{"", Mount{}, false},
		{"46 27 0:40 / /run rw", Mount{}, false},
		{"46 27 0:40 / - tmpfs x rw", Mount{}, false},
		{"46 27 0:40 / /run rw - tmpfs", Mount{}, false},
	} {
		got, ok := Parse(c.line)
		if ok != c.ok || got != c.want {
			t.Errorf("Parse(%q) = %+v, %v; want %+v, %v", c.line, got, ok, c.want, c.ok)
		}
	}
}
