# gobin-cache: shared by the scripts that build a tool from the Go module
# proxy into a cache (kube-bins.sh, runsc-bin.sh). Source it; it defines:
#
#   modversion DIR MODULE      the version DIR/go.mod requires of MODULE
#   cachebuild DIR PKG NAME [LDFLAGS]
#                              builds PKG (from the tools module in DIR,
#                              without cgo, stripped, with LDFLAGS too)
#                              into $cache/NAME, unless it is there already
#
# cachebuild needs $cache set. A binary goes into the cache only once it
# is whole, so a build that is interrupted leaves no half binary behind.

modversion() {
	awk -v m="$2" '$1 == m && $2 ~ /^v/ { print $2; exit } $1 == "require" && $2 == m { print $3; exit }' "$1/go.mod"
}

cachebuild() {
	[[ -x $cache/$3 ]] && return 0
	mkdir -p "$cache"
	local tmp start=$SECONDS
	tmp=$(mktemp -d "$cache/.build.XXXXXX")
	echo "$(basename "$0"): building $3 into $cache"
	if ! (cd "$1" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w ${4:-}" -o "$tmp/$3" "$2"); then
		rm -rf "$tmp"
		return 1
	fi
	mv "$tmp/$3" "$cache/$3"
	rm -rf "$tmp"
	echo "$(basename "$0"): $3 built in $((SECONDS - start)) s"
}
