package image

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// BaseImage is the built-in image that E2B's default template ("base")
// maps to: the host image's userland with E2B's conventions on top. The
// user "user" (uid 1000) owns /home/user, which is the working directory;
// bash, coreutils, python3 (also as "python"), git and sudo come from the
// host's /usr; sudo is configured to let "user" run anything without a
// password.
const BaseImage = "base"

// baseBinDir holds the commands the base image adds (a "python" link);
// the host's /usr is mounted read-only, so they cannot go there.
const baseBinDir = "opt/paddock/bin"

// baseEtc are the parts of the host's /etc that sudo needs beyond the
// host image's (sudo reads its PAM stack and limits).
var baseEtc = []string{"pam.d", "security", "sudo.conf"}

// getBase builds the base image on first use.
func (s *Store) getBase() (*Image, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.base == nil {
		img, err := buildBase(filepath.Join(s.dir, BaseImage), "/")
		if err != nil {
			return nil, fmt.Errorf("building base image: %w", err)
		}
		s.log.Info("base image ready", "id", img.ID[:12], "layers", img.Layers)
		s.base = img
	}
	return s.base, nil
}

// buildBase builds the base image's skeleton under dir (content-addressed
// like the host image's) from the host root hostRoot.
func buildBase(dir, hostRoot string) (*Image, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp(dir, ".build-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	root := filepath.Join(tmp, "rootfs")
	img := &Image{Name: BaseImage, Workdir: "/home/user", AllowSetuid: true}
	if err := buildSkeleton(root, hostRoot, img); err != nil {
		return nil, err
	}
	if err := addBase(root, hostRoot); err != nil {
		return nil, err
	}
	id, err := digestTree(root)
	if err != nil {
		return nil, fmt.Errorf("hashing skeleton: %w", err)
	}
	img.ID = "base-" + id
	final := filepath.Join(dir, id)
	if _, err := os.Stat(final); err != nil {
		if err := os.Rename(tmp, final); err != nil {
			return nil, fmt.Errorf("publishing skeleton: %w", err)
		}
	}
	img.Layers = []string{filepath.Join(final, "rootfs")}
	env := DefaultEnv(hostRoot)
	for i, kv := range env {
		if len(kv) > 5 && kv[:5] == "PATH=" {
			env[i] = "PATH=/" + baseBinDir + ":" + kv[5:]
		}
	}
	img.Env = env
	return img, nil
}

// addBase adds E2B's conventions to a host skeleton at root.
func addBase(root, hostRoot string) error {
	etc := filepath.Join(root, "etc")
	for _, name := range baseEtc {
		if _, err := os.Lstat(filepath.Join(etc, name)); err == nil {
			continue
		}
		if err := copyTree(filepath.Join(hostRoot, "etc", name), filepath.Join(etc, name), name); err != nil {
			return fmt.Errorf("copying /etc/%s: %w", name, err)
		}
	}
	for _, d := range []string{"sudoers.d", "profile.d"} {
		if err := os.MkdirAll(filepath.Join(etc, d), 0o755); err != nil {
			return err
		}
	}
	files := []struct {
		path    string
		content string
		mode    fs.FileMode
	}{
		{"etc/sudoers", "Defaults env_reset\nDefaults secure_path=\"/" + baseBinDir + ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\"\n" +
			"root ALL=(ALL:ALL) ALL\n%sudo ALL=(ALL:ALL) ALL\n@includedir /etc/sudoers.d\n", 0o440},
		{"etc/sudoers.d/user", "user ALL=(ALL:ALL) NOPASSWD: ALL\n", 0o440},
		// Login shells (E2B runs commands with bash -l) reset PATH in
		// /etc/profile, then read profile.d.
		{"etc/profile.d/paddock-base.sh", "case \":$PATH:\" in *:/" + baseBinDir + ":*) ;; *) PATH=\"/" + baseBinDir + ":$PATH\" ;; esac\n", 0o644},
	}
	for _, f := range files {
		if err := os.WriteFile(filepath.Join(root, f.path), []byte(f.content), f.mode); err != nil {
			return err
		}
		if err := os.Chmod(filepath.Join(root, f.path), f.mode); err != nil {
			return err
		}
	}
	bin := filepath.Join(root, baseBinDir)
	if err := os.MkdirAll(bin, 0o755); err != nil {
		return err
	}
	if err := os.Symlink("/usr/bin/python3", filepath.Join(bin, "python")); err != nil {
		return err
	}
	// The user's home starts with the distribution's dotfiles.
	home := filepath.Join(root, "home/user")
	skel, _ := os.ReadDir(filepath.Join(hostRoot, "etc/skel"))
	for _, e := range skel {
		if !e.Type().IsRegular() {
			continue
		}
		dst := filepath.Join(home, e.Name())
		if err := copyTree(filepath.Join(hostRoot, "etc/skel", e.Name()), dst, "skel/"+e.Name()); err != nil {
			return err
		}
		if err := os.Lchown(dst, 1000, 1000); err != nil {
			return err
		}
	}
	return nil
}
