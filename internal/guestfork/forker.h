// The forker's protocol, for its C side; cgo_linux.go checks at build
// time that forker_linux.go's constants say the same.

#define FORKER_VERB "guest-forker"
#define GUEST_VERB "guest"
#define NICE 10
#define GUEST_SLACK_NS 2000000 // sysmon.Slack, every guest's timer slack at its exec
#define FD_SOCKET 3 // SOCK_SEQPACKET to the daemon: requests in, replies out
#define FD_EXE 4    // the sealed guest binary
#define FD_FAST 5   // the sealed fast guest (optional): guests are exec'd from it, FD_EXE at FD_FAST
#define FD_SECCOMP 6 // the sandboxes' base seccomp filter (optional): loaded once, every guest inherits it
#define REQ_LEN 12  // uid base, ids, flags: 32 bits each, host byte order
#define REQ_CGROUP 1u
#define REQ_URGENT 2u
#define REQ_NETNS 4u
