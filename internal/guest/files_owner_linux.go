package guest

import (
	"bufio"
	"io"
	"strconv"
	"strings"

	"github.com/paddock-dev/paddock/internal/errdefs"
)

// idNames maps the sandbox's user and group ids to names and back, read
// from its /etc/passwd and /etc/group. They are read through the root
// handle like any sandbox file (os/user would open them by path, following
// whatever the sandbox made of them).
type idNames struct {
	users   map[uint32]string
	groups  map[uint32]string
	uidOf   map[string]uint32
	gidOf   map[string]uint32
	primary map[uint32]uint32 // a user's primary group
}

// maxIDFile bounds how much of /etc/passwd or /etc/group is read.
const maxIDFile = 4 << 20

// ids reads the sandbox's users and groups; missing or unreadable files
// give empty maps.
func (r *fsRoot) ids() *idNames {
	n := &idNames{
		users: map[uint32]string{}, groups: map[uint32]string{},
		uidOf: map[string]uint32{}, gidOf: map[string]uint32{}, primary: map[uint32]uint32{},
	}
	r.eachIDLine("/etc/passwd", func(f []string) {
		// name:password:uid:gid:gecos:home:shell
		if len(f) < 4 {
			return
		}
		uid, err1 := strconv.ParseUint(f[2], 10, 32)
		gid, err2 := strconv.ParseUint(f[3], 10, 32)
		if err1 != nil || err2 != nil || f[0] == "" {
			return
		}
		if _, ok := n.users[uint32(uid)]; !ok {
			n.users[uint32(uid)] = f[0]
			n.primary[uint32(uid)] = uint32(gid)
		}
		if _, ok := n.uidOf[f[0]]; !ok {
			n.uidOf[f[0]] = uint32(uid)
		}
	})
	r.eachIDLine("/etc/group", func(f []string) {
		// name:password:gid:members
		if len(f) < 3 {
			return
		}
		gid, err := strconv.ParseUint(f[2], 10, 32)
		if err != nil || f[0] == "" {
			return
		}
		if _, ok := n.groups[uint32(gid)]; !ok {
			n.groups[uint32(gid)] = f[0]
		}
		if _, ok := n.gidOf[f[0]]; !ok {
			n.gidOf[f[0]] = uint32(gid)
		}
	})
	return n
}

func (r *fsRoot) eachIDLine(p string, fn func([]string)) {
	f, _, err := r.openRegular(p)
	if err != nil {
		return
	}
	defer f.Close()
	sc := bufio.NewScanner(io.LimitReader(f, maxIDFile))
	sc.Buffer(make([]byte, 0, 4096), 64<<10)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		fn(strings.Split(line, ":"))
	}
}

// owner resolves "USER[:GROUP]" (names or numbers) to ids; -1 leaves an
// id as it is. A user given alone brings its primary group when the
// sandbox knows one.
func (n *idNames) owner(spec string) (uid, gid int, err error) {
	uid, gid = -1, -1
	if spec == "" {
		return uid, gid, nil
	}
	if len(spec) > 256 || strings.ContainsAny(spec, "\x00\n") {
		return 0, 0, errdefs.Invalid("owner", "%q is not USER[:GROUP]", spec)
	}
	u, g, hasGroup := strings.Cut(spec, ":")
	if u == "" && g == "" {
		return 0, 0, errdefs.Invalid("owner", "%q is not USER[:GROUP]", spec)
	}
	if u != "" {
		id, ok := ownerID(u, n.uidOf)
		if !ok {
			return 0, 0, errdefs.Invalid("owner", "no user %q in the sandbox's /etc/passwd", u)
		}
		uid = int(id)
		if pg, ok := n.primary[id]; ok && !hasGroup {
			gid = int(pg)
		}
	}
	if g != "" {
		id, ok := ownerID(g, n.gidOf)
		if !ok {
			return 0, 0, errdefs.Invalid("owner", "no group %q in the sandbox's /etc/group", g)
		}
		gid = int(id)
	}
	return uid, gid, nil
}

// ownerID resolves a user or group given as a number, or as a name in
// byName.
func ownerID(s string, byName map[string]uint32) (uint32, bool) {
	if id, ok := parseOwnerID(s); ok {
		return id, true
	}
	id, ok := byName[s]
	return id, ok
}

// parseOwnerID parses a numeric user or group id (never -1, which means "no
// change" to chown).
func parseOwnerID(s string) (uint32, bool) {
	v, err := strconv.ParseUint(s, 10, 32)
	if err != nil || v == 1<<32-1 {
		return 0, false
	}
	return uint32(v), true
}
